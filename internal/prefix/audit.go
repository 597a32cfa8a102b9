package prefix

import (
	"sync"
	"sync/atomic"
	"time"
)

// Audit checks the router's cache picture against what the engines say
// they reused. Each finished request brings one Observation: the prompt
// tokens the index predicted the chosen backend to hold, and the cached
// tokens its engine reported (vLLM's and SGLang's
// usage.prompt_tokens_details.cached_tokens, llama.cpp's timings), and
// whether the predicted blocks were fresh in the index at routing
// (Observation.Fresh, Index's Age: touched within the last half of the
// backend's capacity). Per backend, requests are judged in windows of
// AuditConfig.Window. The verdicts tell a cache that lost its contents
// from one that evicts as caches do under pressure, by which predictions
// fall short: an engine that evicts least recently used first loses the
// index's oldest blocks, never its fresh ones, unless it keeps less than
// half of what the index thinks; one that lost its cache loses all.
//
//   - a loss (the cache was cleared behind the router's back, or the
//     engine restarted): a window whose engine reported under a tenth of
//     the prediction; or, on a backend whose predictions were borne out
//     until then (its bearing, a moving average of its windows'
//     reported-to-predicted ratio, at least Bearing), one in which a
//     quarter of the fresh predictions (two or more) fell short by more
//     than Shortfall of the prompt. The index forgets the backend's
//     blocks (Forget); if total losses persist for MissesToUntrust
//     windows in a row although the index relearned from scratch, the
//     engine does not keep what the router thinks it routes there (block
//     hashes that do not match, a cache that is off), and its picture is
//     untrusted: its matches count as 0 in the pick (Untrusted) until a
//     window agrees again (Trust);
//   - a cache smaller than half the index's (the engine's cache also
//     holds running requests' blocks, or it keeps only its slots'
//     prompts, as a llama.cpp server does): fresh predictions that keep
//     falling short over windows (a moving average of their share above
//     FreshShortfall, over ShrinkWindows windows at least) shrink the
//     backend's capacity in the index by the share of predictions the
//     engine bore out (between a half and nine tenths of it a time, down
//     to MinCapacity blocks). Stale predictions fallen short are the
//     eviction the index's LRU order and the engine's differ on, and
//     call for nothing;
//   - a window in which the engine reported clearly more than predicted
//     while its capacity was shrunk grows it back, doubling up to the
//     capacity its KV cache size gives (Grow).
//
// Reported tokens are scaled to the router's token estimate (the
// reported hit times the router's prompt estimate over the engine's
// prompt tokens), so that a tokenizer that counts differently from the
// router's estimate does not read as a shortfall.
//
// The Audit owns the comparison's state, and each backend's audited
// capacity; the caller applies a Verdict to the Index. Time is passed in.
// It also keeps the totals of the regret metrics: per backend and policy,
// prompt tokens, cached tokens predicted, reported and held at best by
// any candidate at decision time, and the TTFT predicted and observed.
type Audit struct {
	cfg AuditConfig
	mu  sync.Mutex
	b   []auditState
	// untrusted is an immutable copy of the backends' trust, replaced on
	// change (rare), for the pick to read without a lock.
	untrusted atomic.Pointer[[]bool]
}

// AuditConfig tunes an Audit; zero fields take the defaults.
type AuditConfig struct {
	// Window is the requests per backend judged together (default 8):
	// a cache cleared behind the router's back is detected within two
	// windows of requests.
	Window int
	// MinTokens is the least predicted (or reported) cached tokens a
	// window needs to be judged at all (default 256): a window of cold
	// prompts says nothing of the picture.
	MinTokens int64
	// Shortfall is the share of the window's prompt tokens by which the
	// reported hits must fall short of the predicted ones for a
	// shortfall (default 0.05: five points of hit rate), or exceed them
	// for an excess; Total the reported-to-predicted ratio under which
	// a shortfall is near-total (default 0.1).
	Shortfall, Total float64
	// MissesToUntrust is how many near-total shortfalls in a row untrust
	// a backend's picture (default 3).
	MissesToUntrust int
	// MinCapacity is the least capacity, in blocks, a shrink leaves
	// (default 64).
	MinCapacity int
	// Bearing is the least bearing (the moving average of a backend's
	// windows' reported-to-predicted ratio) at which a run of near-total
	// misses within a window reads as a loss (default 0.7): under it the
	// engine keeps so little of what the index predicts that such runs
	// are its eviction, and the persistent shortfall shrinks it instead.
	Bearing float64
	// DefaultCapacity is a backend's capacity until SetBase gives its
	// own (default DefaultCapacity).
	DefaultCapacity int
}

// Verdict is what a judged window asks of the index for its backend.
type Verdict uint8

// The verdicts. Keep asks nothing.
const (
	Keep    Verdict = iota
	Forget          // forget every block of the backend (Index.RemoveBackend)
	Shrink          // set its capacity to Audit.Capacity
	Grow            // set its capacity to Audit.Capacity
	Untrust         // count its matches as 0 in the pick
	Trust           // count them again
)

var verdictNames = [...]string{"keep", "forget", "shrink", "grow", "untrust", "trust"}

// String is the verdict's name, as the action label of the metrics.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "unknown"
}

// Verdicts lists the verdicts that change something, in order.
var Verdicts = []Verdict{Forget, Shrink, Grow, Untrust, Trust}

// Observation is one finished request, as the audit needs it.
type Observation struct {
	Backend int
	// Policy is the policy that routed it.
	Policy string
	// Prompt is the router's estimate of its prompt tokens; Predicted
	// the tokens of it the index matched for the backend (before any
	// untrust); Best the most any candidate held at decision time.
	Prompt, Predicted, Best int64
	// Reported is the engine's cached tokens, out of ReportedPrompt
	// prompt tokens by its own count (0: the router's estimate).
	Reported, ReportedPrompt int64
	// Fresh says that the predicted blocks were fresh in the index when
	// the request was routed (prefix.Age.Fresh): an engine that keeps at
	// least half what the index thinks, least recently used evicted
	// first, still held them.
	Fresh bool
	// Routed is when the request was routed: a request routed before
	// the backend's last verdict saw the picture that verdict changed,
	// and is left out of the next window (it still counts in the totals).
	Routed time.Time
	// EstTTFT is the policy's TTFT estimate and TTFT the observed one,
	// in seconds; either 0 when there is none.
	EstTTFT, TTFT float64
}

// Totals are the regret counters of one backend under one policy.
type Totals struct {
	Requests                    int64
	Prompt, Predicted           int64
	Reported, Best              int64
	TTFTRequests                int64
	EstTTFTSeconds, TTFTSeconds float64
}

// auditState is one backend's window, verdict state and totals.
type auditState struct {
	n                   int
	predicted, reported int64
	prompt              int64
	// excess sums, per request, the reported tokens not predicted (the
	// basis of a grow): a hit here and a miss elsewhere in the window do
	// not cancel out.
	excess int64
	// bearing is the moving average of the judged windows'
	// reported-to-predicted ratio (1 until a window is judged): a
	// backend's record over windows, which one window's verdict reads
	// (see AuditConfig.Bearing and judge).
	bearing float64
	// windows counts the windows judged since the capacity last
	// changed (or the backend was first judged: seen).
	windows        int
	seen           bool
	base, capacity int // 0: not set (the default)
	untrusted      bool
	misses         int
	// fresh counts the window's requests with a fresh prediction
	// (Observation.Fresh), freshShort those of them whose engine reported
	// less than predicted by more than AuditConfig.Shortfall of the
	// prompt.
	fresh, freshShort int
	// freshAvg is the moving average of the judged windows' share of
	// fresh predictions fallen short; suspect is set by a loss verdict
	// until a window bears the fresh predictions out again.
	freshAvg float64
	suspect  bool
	last     time.Time
	since    time.Time // the last verdict that changed something
	totals   map[string]*Totals
	actions  [len(verdictNames)]uint64
}

// NewAudit returns an audit with cfg's defaults filled in.
func NewAudit(cfg AuditConfig) *Audit {
	if cfg.Window <= 0 {
		cfg.Window = 8
	}
	if cfg.MinTokens <= 0 {
		cfg.MinTokens = 256
	}
	if cfg.Shortfall <= 0 {
		cfg.Shortfall = 0.05
	}
	if cfg.Total <= 0 {
		cfg.Total = 0.1
	}
	if cfg.MissesToUntrust <= 0 {
		cfg.MissesToUntrust = 3
	}
	if cfg.MinCapacity <= 0 {
		cfg.MinCapacity = 64
	}
	if cfg.Bearing <= 0 {
		cfg.Bearing = 0.7
	}
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = DefaultCapacity
	}
	return &Audit{cfg: cfg}
}

// state returns backend's state, growing the table. The caller holds mu.
func (a *Audit) state(backend int) *auditState {
	for len(a.b) <= backend {
		a.b = append(a.b, auditState{})
	}
	return &a.b[backend]
}

// SetBase records backend's capacity as its KV cache size gives it and
// returns the capacity the index should use: the base, or less while the
// audit has shrunk it.
func (a *Audit) SetBase(backend, blocks int) int {
	if backend < 0 {
		return blocks
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.state(backend)
	s.base = max(blocks, 0)
	return a.capacity(s)
}

// Capacity is the capacity in blocks the audit allows backend's index.
func (a *Audit) Capacity(backend int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.capacity(a.state(backend))
}

func (a *Audit) capacity(s *auditState) int {
	base := s.base
	if base == 0 {
		base = a.cfg.DefaultCapacity
	}
	if s.capacity > 0 {
		return min(s.capacity, base)
	}
	return base
}

// Untrusted reports whether backend's picture is untrusted: its matches
// count as 0. It takes no lock.
func (a *Audit) Untrusted(backend int) bool {
	u := a.untrusted.Load()
	return u != nil && backend >= 0 && backend < len(*u) && (*u)[backend]
}

// AnyUntrusted reports whether some backend's picture is untrusted.
func (a *Audit) AnyUntrusted() bool {
	u := a.untrusted.Load()
	if u == nil {
		return false
	}
	for _, x := range *u {
		if x {
			return true
		}
	}
	return false
}

// publish replaces the untrusted copy. The caller holds mu.
func (a *Audit) publish() {
	u := make([]bool, len(a.b))
	for i := range a.b {
		u[i] = a.b[i].untrusted
	}
	a.untrusted.Store(&u)
}

// Observe adds one finished request and returns the verdict on its
// backend's picture (Keep but at the end of a window).
func (a *Audit) Observe(o Observation, now time.Time) Verdict {
	if o.Backend < 0 {
		return Keep
	}
	reported := max(o.Reported, 0)
	if o.ReportedPrompt > 0 && o.Prompt > 0 {
		reported = min(o.Prompt, reported*o.Prompt/o.ReportedPrompt)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.state(o.Backend)
	s.last = now
	if s.totals == nil {
		s.totals = map[string]*Totals{}
	}
	t := s.totals[o.Policy]
	if t == nil {
		t = &Totals{}
		s.totals[o.Policy] = t
	}
	t.Requests++
	t.Prompt += max(o.Prompt, 0)
	t.Predicted += max(o.Predicted, 0)
	t.Reported += reported
	t.Best += max(o.Best, 0)
	if o.EstTTFT > 0 && o.TTFT > 0 {
		t.TTFTRequests++
		t.EstTTFTSeconds += o.EstTTFT
		t.TTFTSeconds += o.TTFT
	}

	if o.Routed.Before(s.since) {
		return Keep
	}
	s.n++
	s.predicted += max(o.Predicted, 0)
	s.reported += reported
	s.prompt += max(o.Prompt, 0)
	s.excess += max(reported-o.Predicted, 0)
	if o.Predicted > 0 && o.Fresh {
		s.fresh++
		if float64(o.Predicted-reported) > a.cfg.Shortfall*float64(max(o.Prompt, 1)) {
			s.freshShort++
		}
	}
	if s.n < a.cfg.Window {
		return Keep
	}
	v := a.judge(s)
	s.n, s.predicted, s.reported, s.prompt, s.excess = 0, 0, 0, 0, 0
	s.fresh, s.freshShort = 0, 0
	s.actions[v]++
	if v != Keep {
		s.since = now
	}
	if v == Untrust || v == Trust {
		a.publish()
	}
	return v
}

// FreshShortfall is the moving average of a backend's share of fresh
// predictions fallen short above which its capacity shrinks.
const FreshShortfall = 0.25

// ShrinkWindows is the fewest windows judged since a backend's capacity
// last changed before a shortfall may shrink it: one bad window is not a
// record.
const ShrinkWindows = 3

// windowWeight is the weight of one judged window in a backend's moving
// averages (auditState.bearing, freshAvg).
const windowWeight = 0.3

// judge is the verdict on s's full window. The caller holds mu.
func (a *Audit) judge(s *auditState) Verdict {
	p, r := float64(s.predicted), float64(s.reported)
	prompt := float64(max(s.prompt, 1))
	excess := float64(s.excess) / prompt
	if s.predicted < a.cfg.MinTokens && s.reported < a.cfg.MinTokens {
		return Keep // nothing to judge by
	}
	if !s.seen {
		s.seen, s.bearing = true, 1
	}
	ratio := 1.0
	if p > 0 {
		ratio = min(r/p, 1)
	}
	total := r < a.cfg.Total*p
	// Fresh predictions fallen short: at least two and a quarter of the
	// window's, on a backend whose record bore its predictions out and
	// that is not already suspect. (One fresh prediction lost entirely
	// is not enough: on the whole Mooncake trace, where engines' running
	// requests crowd their caches, that rule forgot healthy pictures and
	// tripled the mean TTFT; docs/benchmarks.md.)
	shortShare := 0.0
	if s.fresh > 0 {
		shortShare = float64(s.freshShort) / float64(s.fresh)
	}
	lost := s.freshShort >= 2 && 4*s.freshShort >= s.fresh && s.bearing >= a.cfg.Bearing && !s.suspect
	if !total {
		// The window's share borne out is the engine's record; a window
		// of (almost) nothing is not (the cache was lost, and the
		// relearned picture will tell).
		s.bearing += windowWeight * (ratio - s.bearing)
	}
	if total || lost {
		// A loss: the index forgets the backend's blocks and relearns.
		s.suspect = true
		s.misses++
		if s.misses >= a.cfg.MissesToUntrust && !s.untrusted {
			s.untrusted = true
			return Untrust
		}
		if s.untrusted {
			return Keep
		}
		return Forget
	}
	s.misses = 0
	if 4*s.freshShort < max(s.fresh, 1) {
		s.suspect = false // the fresh predictions borne out again
	}
	if s.fresh > 0 {
		s.freshAvg += windowWeight * (shortShare - s.freshAvg)
	}
	s.windows++
	if s.untrusted {
		s.untrusted = false
		return Trust
	}
	if s.freshAvg > FreshShortfall && s.windows >= ShrinkWindows {
		// The engine loses fresh predictions window after window: it
		// keeps less than half of what the index thinks. Keep the share
		// of the capacity its bearing says (at least half, at most nine
		// tenths, a time), and start the record afresh for the smaller
		// picture.
		c := a.capacity(s)
		s.capacity = max(a.cfg.MinCapacity, int(float64(c)*min(max(s.bearing, 0.5), 0.9)))
		s.freshAvg, s.windows = 0, 0
		if s.capacity < c {
			return Shrink
		}
		return Keep
	}
	base := s.base
	if base == 0 {
		base = a.cfg.DefaultCapacity
	}
	if s.capacity > 0 && s.capacity < base && excess > a.cfg.Shortfall {
		s.capacity = min(base, 2*s.capacity)
		s.freshAvg, s.windows = 0, 0
		return Grow
	}
	return Keep
}

// Reset forgets backend's window and verdict state (its engine restarted
// or it left): its capacity returns to its base, its picture is trusted.
// Its totals are kept.
func (a *Audit) Reset(backend int) {
	if backend < 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.state(backend)
	wasUntrusted := s.untrusted
	s.excess = 0
	s.n, s.predicted, s.reported, s.prompt, s.capacity, s.misses, s.untrusted = 0, 0, 0, 0, 0, 0, false
	s.fresh, s.freshShort, s.freshAvg, s.suspect = 0, 0, 0, false
	s.bearing, s.windows, s.seen = 0, 0, false
	if wasUntrusted {
		a.publish()
	}
}

// BackendAudit is one backend's audit as the admin page and the metrics
// show it.
type BackendAudit struct {
	// Untrusted: its matches count as 0 in the pick. Capacity is its
	// audited capacity in blocks.
	Untrusted bool
	Capacity  int
	// Actions counts each verdict that changed something.
	Actions map[string]uint64
	// Last is the last observation's time.
	Last time.Time
	// Totals by policy.
	Totals map[string]Totals
}

// Backend returns a copy of backend's audit.
func (a *Audit) Backend(backend int) BackendAudit {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := BackendAudit{Capacity: a.cfg.DefaultCapacity, Actions: map[string]uint64{}, Totals: map[string]Totals{}}
	if backend < 0 || backend >= len(a.b) {
		for _, v := range Verdicts {
			out.Actions[v.String()] = 0
		}
		return out
	}
	s := &a.b[backend]
	out.Untrusted, out.Capacity, out.Last = s.untrusted, a.capacity(s), s.last
	for _, v := range Verdicts {
		out.Actions[v.String()] = s.actions[v]
	}
	for p, t := range s.totals {
		out.Totals[p] = *t
	}
	return out
}

// Sum adds t's counters to the receiver.
func (t *Totals) Sum(o Totals) {
	t.Requests += o.Requests
	t.Prompt += o.Prompt
	t.Predicted += o.Predicted
	t.Reported += o.Reported
	t.Best += o.Best
	t.TTFTRequests += o.TTFTRequests
	t.EstTTFTSeconds += o.EstTTFTSeconds
	t.TTFTSeconds += o.TTFTSeconds
}
