// preble-e2: the E2 global scheduler of Preble (Srivatsa, He, Abhyankar, Li,
// Zhang: "Preble: Efficient Distributed Prompt Scheduling for LLM Serving",
// ICLR 2025), reimplemented from the paper and its public code:
// WukLab/preble, multi_node/global_scheduler_with_time.py (runtime_selector,
// SlidingWindowHistogram, virtual_evict_for_routing).
//
// E2 (Exploit or Explore), per request:
//   - match the prompt against the global prefix tree; if the cached prefix
//     is longer than the rest of the prompt (cached tokens > uncached
//     tokens), exploit: send the request to one of the engines that hold
//     that prefix, the one with the lowest load cost (+ eviction cost, as
//     the code adds it when eviction is on);
//   - otherwise explore: send it to the engine with the lowest
//     L + M + P, where
//     L (load) is the engine's compute over a recent window H: the prefill
//     time of the requests it received in the window plus the decode time of
//     its active requests (active x output length x time per output token);
//     M (eviction) is the cost of what this request would evict there: the
//     prefill time of the evicted tokens weighted by how often they were
//     reused in the window;
//     P (prefill) is the prefill time of this request's uncached tokens there.
//
// Defaults: window H = 3 minutes (the code's SlidingWindowHistogram), an
// output length of the request's max_tokens, else the mean of those seen,
// else 45 tokens (the code's default when the request sets none).
//
// Our observables, and what they approximate:
//   - the global tree is the router's prefix index: the engines holding the
//     longest cached prefix are the candidates with the largest Input.Cached;
//   - prefill time is tokens over the backend's prefill rate as its cost
//     model prices a full chunk (fleet Backend.PrefillRate), for Preble's
//     profiled prefill model;
//   - time per output token: Preble learns it from finished requests; our
//     policies do not see completions, so it is a fixed 20 ms (an 8B model on
//     one H100 at moderate batch); active requests are fleet Load.InFlight,
//     with the decoding ones' output budgets (Load.DecodeBudget) counted
//     exactly and the others at the mean output length;
//   - eviction: when the engine reports its KV usage and capacity, the
//     request evicts what of its uncached tokens does not fit in the free
//     blocks; otherwise we assume, as Preble's code does, that the cache is
//     full and the request evicts as many tokens as it adds. Preble weighs
//     each evicted tree node by its own window hit count and miss rate; we
//     do not know which tokens an engine would evict, so we weigh them by
//     the engine's window hit ratio (cached prompt tokens over prompt tokens
//     routed there in H);
//   - Preble's post-assignment rebalancing and prefix autoscaling are
//     disabled in the code's runtime_selector (commented out), and so are
//     not reproduced; its per-engine local scheduler is the engine's own.
package policy

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Preble E2 defaults.
const (
	PrebleWindow        = 3 * time.Minute
	PrebleTPOT          = 0.020 // seconds per output token
	PrebleDefaultOutput = 45    // tokens, when no request has set max_tokens
)

func init() {
	register("preble-e2", func(Options) Policy { return NewPreble() })
}

// Preble is Preble's E2 global scheduler.
type Preble struct {
	mu  sync.Mutex
	win []prebleWindow // by backend ID
	// outSum and outN give the mean output budget of requests that set one.
	outSum, outN int64
}

// prebleWindow is one engine's requests in the last PrebleWindow, as a
// queue with running sums.
type prebleWindow struct {
	recs       []prebleRec
	head       int
	prefillSec float64
	prompt     int64
	hit        int64
}

type prebleRec struct {
	at          int64 // unix nanoseconds
	prefillSec  float64
	prompt, hit int64
}

// NewPreble returns the scheduler with empty windows.
func NewPreble() *Preble { return &Preble{} }

// Name implements Policy.
func (*Preble) Name() string { return "preble-e2" }

// expire drops the records older than the window before now.
func (w *prebleWindow) expire(now int64) {
	cut := now - int64(PrebleWindow)
	for w.head < len(w.recs) && w.recs[w.head].at < cut {
		r := w.recs[w.head]
		w.prefillSec -= r.prefillSec
		w.prompt -= r.prompt
		w.hit -= r.hit
		w.head++
	}
	if w.head == len(w.recs) {
		w.recs, w.head = w.recs[:0], 0
		w.prefillSec, w.prompt, w.hit = 0, 0, 0 // no float drift
	} else if w.head > 1024 && w.head*2 > len(w.recs) {
		n := copy(w.recs, w.recs[w.head:])
		w.recs, w.head = w.recs[:n], 0
	}
}

// meanOutput is the output length assumed for a request without a budget.
func (p *Preble) meanOutput() float64 {
	if p.outN == 0 {
		return PrebleDefaultOutput
	}
	return float64(p.outSum) / float64(p.outN)
}

// cost returns L (+ M, + P when explore) for candidate i, in seconds. The
// caller holds p.mu.
func (p *Preble) cost(in *Input, i int, now int64, explore bool) float64 {
	b := in.Candidates[i]
	l := b.Load()
	rate := b.PrefillRate(in.Now)
	var w *prebleWindow
	if b.ID < len(p.win) {
		w = &p.win[b.ID]
		w.expire(now)
	}
	// L: windowed prefill plus decode of the active requests.
	load := float64(l.DecodeBudget) * PrebleTPOT
	if waiting := l.InFlight - l.Decoding; waiting > 0 {
		load += float64(waiting) * p.meanOutput() * PrebleTPOT
	}
	hitRatio := 0.0
	if w != nil {
		load += w.prefillSec
		if w.prompt > 0 {
			hitRatio = float64(w.hit) / float64(w.prompt)
		}
	}
	// M: what the request's new tokens push out, weighted by reuse.
	uncached := in.Uncached[i]
	evict := uncached
	if free, ok := b.Engine().FreeKVTokens(); ok {
		evict = max(uncached-int64(free), 0)
	}
	c := load + float64(evict)/rate*hitRatio
	if explore {
		c += float64(uncached) / rate // P
	}
	return c
}

// Pick implements Policy.
func (p *Preble) Pick(in *Input) Decision {
	var best int64 = -1
	for i := range in.Candidates {
		best = max(best, in.Cached[i])
	}
	exploit := best > int64(in.View.PromptTokens)-best
	now := in.Now.UnixNano()
	p.mu.Lock()
	defer p.mu.Unlock()
	pick, pickCost := -1, 0.0
	for i := range in.Candidates {
		if exploit && in.Cached[i] != best {
			continue
		}
		c := p.cost(in, i, now, !exploit)
		if pick < 0 || c < pickCost {
			pick, pickCost = i, c
		}
	}
	if exploit {
		return Decision{Index: pick, Note: "exploit"}
	}
	return Decision{Index: pick, Note: "explore"}
}

// Routed implements Observer: the request joins its engine's window.
func (p *Preble) Routed(in *Input, d Decision) {
	b := in.Candidates[d.Index]
	cached := in.Cached[d.Index]
	rec := prebleRec{
		at:         in.Now.UnixNano(),
		prefillSec: float64(in.Uncached[d.Index]) / b.PrefillRate(in.Now),
		prompt:     int64(in.View.PromptTokens),
		hit:        cached,
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.ID >= len(p.win) {
		p.win = append(p.win, make([]prebleWindow, b.ID+1-len(p.win))...)
	}
	w := &p.win[b.ID]
	w.expire(rec.at)
	w.recs = append(w.recs, rec)
	w.prefillSec += rec.prefillSec
	w.prompt += rec.prompt
	w.hit += rec.hit
	if in.View.MaxTokens > 0 {
		p.outSum += int64(in.View.MaxTokens)
		p.outN++
	}
}

// WindowPrefill returns the prefill seconds routed to backend in the
// window ending at now.
func (p *Preble) WindowPrefill(b *fleet.Backend, now time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.ID >= len(p.win) {
		return 0
	}
	w := &p.win[b.ID]
	w.expire(now.UnixNano())
	return w.prefillSec
}

var (
	_ Policy   = (*Preble)(nil)
	_ Observer = (*Preble)(nil)
)
