// Package workload produces the request streams that kvroute's benchmark,
// comparison and simulator replay: the Mooncake-format traces (any JSONL
// file in that format) and the built-in synthetic workloads (chat,
// chat-docs, agent, agentic, mixed, rag). Text is generated deterministically, so the same workload and
// seed always give the same bytes.
//
// It does no network I/O and knows nothing of routing.
package workload

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/internal/slo"
	"io/fs"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// Request is one request of a workload.
type Request struct {
	// At is the arrival time from the start of the run.
	At   time.Duration
	Kind request.Kind
	// Session is the conversation id sent as X-Session-ID, or empty.
	Session string
	// InputTokens and OutputTokens are the intended lengths; the body asks
	// for exactly OutputTokens (max_tokens = min_tokens, ignore_eos).
	InputTokens, OutputTokens int
	// Adapter is the LoRA adapter the request asks for in place of the
	// base model, "" for none (adapters.go).
	Adapter string
	// SessionHeader names the header Session goes in; "" for
	// X-Session-ID.
	SessionHeader string
	// After is 1 + the index of the request whose answer must be in
	// before this one is sent (an agent loop's previous turn), 0 for
	// none; Prev is 1 + the index of the request whose Responses API id
	// the body continues (previous_response_id), 0 for none.
	After, Prev int
	// Objective is the request's latency objectives and criticality,
	// sent as headers (X-Kvroute-Slo-Ttft-Ms, X-Kvroute-Slo-Tpot-Ms,
	// X-Kvroute-Criticality); zero for none.
	Objective slo.Objective

	body     func(model string) []byte
	withPrev func(model, prev string) []byte
}

// Body returns the JSON request body for model (for the request's
// adapter, when it has one), with "stream": true and
// stream_options.include_usage. It is built on demand (traces are large).
// A request that continues a stored response (Prev) names PendingResponse
// in place of its id: BodyFor gives the id.
func (r *Request) Body(model string) []byte {
	if r.Prev > 0 {
		return r.BodyFor(model, PendingResponse)
	}
	return r.BodyFor(model, "")
}

// PendingResponse stands for the id of the response a request continues
// in its Body.
const PendingResponse = "resp_previous"

// BodyFor is Body with prev, the id of the response the request continues
// (Prev), in its previous_response_id.
func (r *Request) BodyFor(model, prev string) []byte {
	if r.Adapter != "" {
		model = r.Adapter
	}
	if r.withPrev != nil {
		return r.withPrev(model, prev)
	}
	return r.body(model)
}

// Options select and shape a workload.
type Options struct {
	// Rate is the Poisson arrival rate (requests/s) for synthetic
	// workloads; default 10.
	Rate float64
	// Speedup compresses a trace's timestamps; default 1.
	Speedup float64
	// Limit keeps the first Limit requests (0: all).
	Limit int
	// WindowStart and WindowEnd keep a trace's requests with timestamps in
	// [start, end) (both zero: all).
	WindowStart, WindowEnd time.Duration
	// Duration bounds a synthetic workload's arrivals (default 60s unless
	// Limit is set).
	Duration time.Duration
	Seed     int64
	// Jitter > 0 delays each arrival by a uniform random amount in
	// [0, Jitter), drawn from Seed, as a live client's scheduling and the
	// loopback network do: requests a trace gives the same timestamp then
	// reach the router in a different order and a few milliseconds apart.
	Jitter time.Duration
	// Adapters > 0 has each request ask for one of that many LoRA
	// adapters of the base model, with Zipf popularity of exponent
	// AdapterZipf (default DefaultAdapterZipf); see adapters.go.
	Adapters    int
	AdapterZipf float64
}

// Load returns the named built-in workload, or the trace at path name, in
// arrival order.
//
// A trace is JSON Lines in the Mooncake format (see ReadTrace). Each hash id
// becomes a deterministic 512-token block of text (2048 bytes of lowercase
// words, opening with a 14-letter tag of the id), so requests that share
// their first k hash ids share their first k*2048 prompt bytes; a request's
// prompt is its blocks concatenated and cut to input_length tokens, sent as
// a /v1/completions body. Timestamps (ms) are divided by Speedup; WindowStart
// and WindowEnd select by the trace's own timestamps, and the kept requests
// are re-based to start at 0; Limit then keeps the first Limit.
//
// The built-in workloads (see Builtins) arrive as a Poisson process at
// Rate, drawn from Seed: the same name, options and seed give the same
// requests and the same bytes.
func Load(name string, opt Options) ([]Request, error) {
	if opt.Jitter < 0 {
		return nil, fmt.Errorf("jitter %v must not be negative", opt.Jitter)
	}
	if err := opt.validAdapters(); err != nil {
		return nil, err
	}
	reqs, err := load(name, opt)
	if err != nil {
		return nil, err
	}
	assignAdapters(reqs, opt)
	if opt.Jitter == 0 {
		return reqs, nil
	}
	rng := rand.New(rand.NewPCG(uint64(opt.Seed), 0x6a17))
	for i := range reqs {
		reqs[i].At += time.Duration(rng.Int64N(int64(opt.Jitter)))
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return reqs, nil
}

func load(name string, opt Options) ([]Request, error) {
	for _, b := range builtins {
		if b.name == name {
			return loadBuiltin(b, opt)
		}
	}
	f, err := os.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("unknown workload %q: not a built-in (%s) and no such file", name, strings.Join(builtinNames(), ", "))
		}
		return nil, fmt.Errorf("load workload: %w", err)
	}
	defer f.Close()
	return ReadTrace(f, name, opt)
}

func builtinNames() []string {
	names := make([]string, len(builtins))
	for i, b := range builtins {
		names[i] = b.name
	}
	return names
}

// withDefaults fills in defaults and rejects impossible options.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Rate < 0 || o.Rate != o.Rate:
		return o, fmt.Errorf("rate %v must be positive", o.Rate)
	case o.Speedup < 0 || o.Speedup != o.Speedup:
		return o, fmt.Errorf("speedup %v must be positive", o.Speedup)
	case o.Limit < 0:
		return o, fmt.Errorf("limit %d must not be negative", o.Limit)
	case o.Duration < 0:
		return o, fmt.Errorf("duration %v must not be negative", o.Duration)
	case o.WindowStart < 0 || o.WindowEnd < 0 || (o.WindowEnd > 0 && o.WindowEnd <= o.WindowStart):
		return o, fmt.Errorf("window [%v, %v) is empty or negative", o.WindowStart, o.WindowEnd)
	}
	if o.Rate == 0 {
		o.Rate = 10
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	return o, nil
}

// Builtins lists the built-in workloads with a one-line description each.
func Builtins() [][2]string {
	out := make([][2]string, len(builtins))
	for i, b := range builtins {
		out[i] = [2]string{b.name, b.desc}
	}
	return out
}

// PromptTokensPerSec is the workload's offered prompt tokens per second over
// its arrival span (first to last arrival); 0 when the span is empty.
func PromptTokensPerSec(reqs []Request) float64 {
	if len(reqs) < 2 {
		return 0
	}
	lo, hi := reqs[0].At, reqs[0].At
	total := 0
	for _, r := range reqs {
		lo, hi = min(lo, r.At), max(hi, r.At)
		total += r.InputTokens
	}
	if hi <= lo {
		return 0
	}
	return float64(total) / (hi - lo).Seconds()
}

// ScaleTime multiplies every arrival time by f (f < 1 compresses).
func ScaleTime(reqs []Request, f float64) {
	for i := range reqs {
		reqs[i].At = time.Duration(float64(reqs[i].At) * f)
	}
}
