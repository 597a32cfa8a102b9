// Package fleet owns the set of backends and the router's own accounting of
// their load: in-flight requests, pending prefill tokens, decoding streams
// and their output budget, health, the prefill rate learned from observed
// TTFTs, each backend's cost model (package costmodel, fed by its TTFTs
// and engine readings, cost.go) and the fleet's coefficients it decays
// toward, and the latest state the engine itself reported. State changes
// publish a new immutable Snapshot that pickers read without blocking.
//
// Every increment has exactly one decrement: Backend.Start returns a Ticket
// whose Done releases whatever the request still holds, exactly once.
//
// The package does no network I/O; health checks and metric scrapes live in
// the proxy and feed their results in through setters.
package fleet

import (
	"math"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// DefaultPrefillRate is the prefill rate in tokens per second of the
// generic prior (costmodel.Generic's ChunkRate at its chunk): a backend's
// rate until its cost model has learned otherwise, and the price of a
// prompt token where no backend is at hand (admission's deadline).
const DefaultPrefillRate = 10000

// MinRateWork is the smallest prefill work, in tokens, whose TTFT teaches
// a backend's cost model (observeTTFT) or whose engine-reported time
// counts (ObserveEnginePrefill): the TTFT of a tiny prefill is network,
// queueing and one decode step, and would teach a wildly slow prefill.
const MinRateWork = 256

// The engine-reported prefill rate (ObserveEnginePrefill), a reading
// shown beside the learned one, folds into an exponentially weighted
// moving average of weight RateAlpha, each sample clamped to
// [MinPrefillRate, MaxPrefillRate] tokens per second so that a stalled
// scrape or a clock hiccup cannot poison it.
const (
	RateAlpha      = 0.2
	MinPrefillRate = 100
	MaxPrefillRate = 10_000_000
)

// Backend is one inference server.
type Backend struct {
	// ID is the backend's slot: dense (0, 1, 2...), and held for as long
	// as the backend is a member and for the rejoin grace after it leaves
	// (see slots.go). A backend that returns by the same Name within the
	// grace gets it back; after the grace, another backend may be given
	// it.
	ID int
	// Name is a human-readable label (host:port, or engine-3 in the simulator).
	Name string
	// Arc is Name's place on a circle of circumference 1, in [0, 1): a hash
	// of Name, so the same backend has the same Arc in every router
	// replica although its ID differs. Replicas order backends by it when
	// they must not all prefer the same one (policy.Input.Replicas).
	Arc float64
	// URL is the base URL; nil in the simulator.
	URL *url.URL
	// Models served; empty means any model.
	Models []string

	healthy atomic.Bool
	// membership, see membership.go: draining backends get no new
	// requests; a removing one is retired once its last request ends.
	draining, removing, retired atomic.Bool
	fleet                       *Fleet
	// drainSig fires when b starts draining, hungSig when it is found
	// hung (drain.go); hung is set from then until it is healthy again.
	drainSig, hungSig signal
	hung              atomic.Bool
	// drainedAt is when the current drain started, in Unix nanoseconds
	// (DrainingSince); set before draining is seen by other goroutines.
	drainedAt atomic.Int64
	// removedAt is when Remove was called, for the rejoin grace
	// (slots.go); guarded by fleet.mu.
	removedAt time.Time
	// added and warmup drive the warm-up ramp (WarmupWeight); warmup 0
	// means the backend takes its full share at once.
	added  time.Time
	warmup time.Duration
	// accounting, see Load
	inflight, pendingPrefill, decoding, decodeBudget, decodeTokens atomic.Int64
	// prefilled counts the uncached tokens of every request whose first
	// byte has come: the clock against which rate samples are measured.
	prefilled atomic.Int64
	// routedPrompt and routedCached count the prompt tokens of every
	// request routed to the backend and how many of them the router
	// predicted to be in its cache, for the per-backend hit rate.
	routedPrompt, routedCached atomic.Int64
	engine                     atomic.Pointer[EngineState]
	// peers is the load other router replicas report on this backend
	// (peers.go).
	peers peerLoad
	// presumed is the load this router presumes its peers add while it
	// cannot yet hear of it (peers.go).
	presumed peerLoad
	// engineRate holds the float64 bits of the prefill throughput the
	// engine itself reports (see ObserveEnginePrefill); 0 until then.
	engineRate atomic.Uint64
	// limits are the engine's limits and decode time (limits.go).
	limits engineLimits
	// cost is the engine's cost model (cost.go); nil until first asked.
	cost atomic.Pointer[costmodel.Model]
}

// Load is the router's own accounting of a backend, read atomically field
// by field.
type Load struct {
	// InFlight is requests routed and not yet done.
	InFlight int64
	// PendingPrefill is uncached prompt tokens of requests routed whose first
	// response byte has not arrived yet.
	PendingPrefill int64
	// Decoding is requests past their first byte and not yet done.
	Decoding int64
	// DecodeBudget is the sum of the output budgets (max tokens) of the
	// decoding requests.
	DecodeBudget int64
	// DecodeTokens is the sum of the prompt tokens of the decoding
	// requests: the KV cache they hold (Dynamo's "active decode blocks" is
	// DecodeTokens / block size).
	DecodeTokens int64
}

// EngineState is what the engine itself last reported (its metrics), or
// what the simulator reads off its engine model.
type EngineState struct {
	At        time.Time
	Running   int
	Waiting   int
	KVUsage   float64 // 0..1
	KVBlocks  int     // capacity in engine blocks, 0 if unknown
	BlockSize int     // tokens per engine block, 0 if unknown
	// Missing lists the fields above that the engine does not report
	// (llama.cpp reports no KV usage, a llama.cpp server without --metrics
	// no queue): they are unknown, not 0. The zero value says all were
	// reported.
	Missing EngineFields
	// LoRA is the engine's report of its LoRA adapters (lora.go), nil
	// when it reports none.
	LoRA *LoRAState
}

// EngineFields is a set of EngineState fields, for EngineState.Missing.
type EngineFields uint8

// The EngineState fields an engine may not report.
const (
	EngineRunning EngineFields = 1 << iota
	EngineWaiting
	EngineKVUsage
)

// Has reports whether the engine reported every field of f.
func (e *EngineState) Has(f EngineFields) bool { return e.Missing&f == 0 }

// FreeKVTokens is the KV cache the engine reported free, in tokens, and
// whether it reported enough to tell. Like vLLM's usage it counts the
// cached blocks that no request holds as free: they are evicted on demand.
func (e *EngineState) FreeKVTokens() (float64, bool) {
	if e == nil || e.KVBlocks <= 0 || e.BlockSize <= 0 || !e.Has(EngineKVUsage) {
		return 0, false
	}
	return (1 - min(max(e.KVUsage, 0), 1)) * float64(e.KVBlocks) * float64(e.BlockSize), true
}

// Serves reports whether b serves model ("" matches any).
func (b *Backend) Serves(model string) bool {
	if model == "" || len(b.Models) == 0 {
		return true
	}
	return slices.Contains(b.Models, model)
}

// Healthy reports whether b may receive requests.
func (b *Backend) Healthy() bool { return b.healthy.Load() }

// Load returns what pickers read of b: KnownLoad plus the load presumed
// of peers whose latest routings have not reached this router yet
// (AddPresumedLoad).
func (b *Backend) Load() Load {
	l := b.KnownLoad()
	l.add(b.presumed.load())
	return l
}

// KnownLoad returns the router's accounting of b: its own requests plus
// the load its live peer replicas report (AddPeerLoad), without any
// presumption. Limits (admission) and reports read this: a presumption
// is a guess for ranking backends within a burst, and it is taken back
// only when the next routing comes, so a limit that counted it could
// hold a request for a load that was never there.
func (b *Backend) KnownLoad() Load {
	l := b.OwnLoad()
	l.add(b.peers.load())
	return l
}

// OwnLoad returns the accounting of the requests this router routed to b
// itself, without its peers'.
func (b *Backend) OwnLoad() Load {
	return Load{
		InFlight:       b.inflight.Load(),
		PendingPrefill: b.pendingPrefill.Load(),
		Decoding:       b.decoding.Load(),
		DecodeBudget:   b.decodeBudget.Load(),
		DecodeTokens:   b.decodeTokens.Load(),
	}
}

// PrefillRate is b's prefill rate at now in tokens per second, as its
// cost model (Cost) prices a full chunk of fresh tokens: the one estimate
// of b's prefill speed, which the pick, the split decision, the peers'
// policies that need a rate and the metrics all read. Before any sample,
// the prior's (DefaultPrefillRate for the generic one).
func (b *Backend) PrefillRate(now time.Time) float64 {
	return b.Cost().Coeffs(now).ChunkRate(b.Chunk())
}

// CostSamples is the number of samples b's cost model has folded in since
// it began (0 while it is its prior): a reader that waits for b's figures
// to change (the probe rule) watches it.
func (b *Backend) CostSamples() int64 { return b.Cost().Fit().Samples }

// fold folds one sample into the moving average (weight RateAlpha) whose
// float64 bits are in avg (0: none yet, and the sample replaces it). The
// caller clamps the sample.
func fold(avg *atomic.Uint64, sample float64) {
	for {
		old := avg.Load()
		next := sample
		if old != 0 {
			prev := math.Float64frombits(old)
			next = prev + RateAlpha*(sample-prev)
		}
		if avg.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// ObserveEnginePrefill folds the engine's own report of tokens prefilled
// in seconds of prefill (the growth of its counters between two scrapes)
// into b's engine-reported prefill rate. Like a TTFT sample it needs at
// least MinRateWork tokens.
func (b *Backend) ObserveEnginePrefill(tokens, seconds float64) {
	if tokens < MinRateWork || seconds <= 0 {
		return
	}
	fold(&b.engineRate, min(max(tokens/seconds, MinPrefillRate), MaxPrefillRate))
}

// EnginePrefillRate is the prefill rate in tokens per second that the
// engine's own counters show, 0 when it reports none.
func (b *Backend) EnginePrefillRate() float64 { return math.Float64frombits(b.engineRate.Load()) }

// Routed is the prompt tokens of every request routed to b since it
// joined the fleet (each attempt of a retried request counts), and how
// many of them the router predicted to be in b's cache: cached/prompt is
// b's predicted hit rate.
func (b *Backend) Routed() (prompt, cached int64) {
	// cached first: a Start between the two loads then only makes the
	// ratio lower, never above 1.
	cached = b.routedCached.Load()
	return b.routedPrompt.Load(), cached
}

// Engine returns the engine's last reported state, or nil.
func (b *Backend) Engine() *EngineState { return b.engine.Load() }

// SetEngine records the engine's reported state.
func (b *Backend) SetEngine(s *EngineState) { b.engine.Store(s) }

// Start accounts a request routed to b with promptTokens prompt tokens, of
// which uncached are not in b's cache (the router's estimate), and
// outputBudget tokens of output. The Ticket must be ended with Done,
// whatever happens to the request.
func (b *Backend) Start(promptTokens, uncached, outputBudget int64, now time.Time) *Ticket {
	promptTokens = clampTokens(promptTokens)
	uncached = min(clampTokens(uncached), promptTokens)
	outputBudget = clampTokens(outputBudget)
	queued := b.inflight.Add(1) - 1
	b.pendingPrefill.Add(uncached)
	b.routedPrompt.Add(promptTokens)
	b.routedCached.Add(promptTokens - uncached)
	return &Ticket{
		b:      b,
		prompt: promptTokens,
		uncach: uncached,
		budget: outputBudget,
		start:  now,
		mark:   b.prefilled.Load(),
		queued: queued,
	}
}

// MaxTicketTokens bounds each count a Ticket adds to its backend's
// counters (prompt, uncached, output budget), which come from clients
// (max_tokens may be 2^63-1). No context is near it, and the sum of the
// tickets of a backend stays below 2^63 for fewer than 2^32 requests in
// flight at once (memory runs out long before): the counters cannot
// overflow, and never go negative, since each ticket takes back what it
// added.
const MaxTicketTokens = 1<<31 - 1

// clampTokens is n within [0, MaxTicketTokens].
func clampTokens(n int64) int64 { return min(max(n, 0), MaxTicketTokens) }

// Started is the change Start made to the backend's Load for t.
func (t *Ticket) Started() Load { return Load{InFlight: 1, PendingPrefill: t.uncach} }

// Ticket states: a ticket only moves forward, prefill -> decoding -> done
// or prefill -> done, each move won by exactly one compare-and-swap.
const (
	statePrefill int32 = iota
	stateDecoding
	stateDone
)

// Ticket is one request's claim on a backend's load counters.
type Ticket struct {
	b                      *Backend
	prompt, uncach, budget int64
	start                  time.Time
	// mark is the backend's prefilled count when the request was routed.
	mark int64
	// queued is the backend's requests in flight (this router's) when it
	// was routed.
	queued int64
	state  atomic.Int32
	noRate atomic.Bool
	// load is the time the engine takes to load the request's lower-tier
	// cache hits (SetLoad), nanoseconds: part of its TTFT that is not
	// prefill.
	load atomic.Int64
	// stream is the backend's decoding load and prefilled count at the
	// first byte, for the stream's decode sample (Decoded).
	stream streamMark
}

// NoRateSample marks the ticket's first byte as no measure of prefill, so
// that it does not teach the prefill rate: a non-streaming response's first
// byte arrives only after the whole generation. Call it before FirstByte.
func (t *Ticket) NoRateSample() { t.noRate.Store(true) }

// SetLoad says the engine loads the request's cache hits on lower tiers
// (host memory, disk) before its prefill, for d: its TTFT less d teaches
// the cost model. Call it before FirstByte.
func (t *Ticket) SetLoad(d time.Duration) { t.load.Store(int64(max(d, 0))) }

// FirstByte marks the arrival of the first response byte: the request's
// prefill tokens leave PendingPrefill and it becomes a decoding stream, and
// the observed TTFT teaches the backend's cost model. Only the first call
// counts; a call after Done does nothing. It returns the change it made
// to the backend's Load (zero when it made none), for sharing with peer
// replicas.
func (t *Ticket) FirstByte(now time.Time) Load {
	if !t.state.CompareAndSwap(statePrefill, stateDecoding) {
		return Load{}
	}
	b := t.b
	l := b.KnownLoad()
	b.limits.observed.Store(true)
	b.decoding.Add(1)
	b.decodeBudget.Add(t.budget)
	b.decodeTokens.Add(t.prompt)
	b.pendingPrefill.Add(-t.uncach)
	done := b.prefilled.Add(t.uncach)
	t.stream.mark(done, l.Decoding+1, l.DecodeTokens+t.prompt)
	if !t.noRate.Load() {
		b.observeTTFT(done-t.mark, t.uncach, t.prompt-t.uncach, t.queued, l, now.Sub(t.start)-time.Duration(t.load.Load()), now)
	}
	return Load{PendingPrefill: -t.uncach, Decoding: 1, DecodeBudget: t.budget, DecodeTokens: t.prompt}
}

// Done releases everything the request still holds. Only the first call
// counts. It returns the change it made to the backend's Load (zero when
// it made none).
func (t *Ticket) Done(now time.Time) Load {
	for {
		s := t.state.Load()
		if s == stateDone {
			return Load{}
		}
		if !t.state.CompareAndSwap(s, stateDone) {
			continue // FirstByte won a race; release what it moved
		}
		b := t.b
		d := Load{InFlight: -1}
		if s == statePrefill {
			b.pendingPrefill.Add(-t.uncach)
			d.PendingPrefill = -t.uncach
		} else {
			b.decoding.Add(-1)
			b.decodeBudget.Add(-t.budget)
			b.decodeTokens.Add(-t.prompt)
			d.Decoding, d.DecodeBudget, d.DecodeTokens = -1, -t.budget, -t.prompt
		}
		if b.inflight.Add(-1) == 0 && b.removing.Load() {
			b.fleet.retire(b)
		}
		return d
	}
}

// Fleet is the set of backends.
type Fleet struct {
	// Undrained, when set (before the fleet is shared), is called after
	// a drained backend is let back in, outside the fleet's lock: the
	// router forgets its pooled connections to it, which may be the
	// connections of an engine restarted on the same address.
	Undrained func(b *Backend)
	// mu serialises membership and health changes so that snapshots are
	// published in order; readers never take it.
	mu sync.Mutex
	// slots holds each backend at its ID (slots.go): members, removed
	// backends in their grace, and free slots (nil).
	slots []*Backend
	// freed is the name of the last backend in each free slot, so that
	// a backend returning after its grace gets its old slot when no one
	// took it meanwhile; indexed like slots.
	freed []string
	// named are the slots in use of each backend name (slots.go), so
	// that a newcomer finds its old slot without a look at every slot.
	named map[string][]int
	// freedAt is the lowest free slot each name last held, and below
	// is at most the lowest free slot: slotFor finds a slot without a
	// look at every slot.
	freedAt map[string]int
	below   int
	grace   time.Duration
	snap    atomic.Pointer[Snapshot]
	// batches counts the Batch calls under way; changed notes a change
	// whose snapshot waits for the last one's end.
	batches int
	changed bool
	// anchorAt is when the fleet's coefficients were last given to the
	// cost models (cost.go), in Unix nanoseconds of sample time.
	anchorAt atomic.Int64
}

// Snapshot is an immutable view of the fleet's membership and health,
// published whenever either changes. Load counters are read live from the
// backends through their atomics.
type Snapshot struct {
	// All member backends (draining ones included, retired ones not), in
	// ID order.
	All []*Backend
	// Healthy backends that are not draining, in ID order: the ones that
	// may receive new requests.
	Healthy []*Backend
	// IDs is one more than the largest ID in use (members and removed
	// backends in their grace): the size of a slice indexed by backend
	// ID. Slots are reused, so it stays near the fleet's largest size
	// however many backends have come and gone.
	IDs int
}

// New returns an empty fleet with the rejoin grace DefaultGrace.
func New() *Fleet {
	f := &Fleet{grace: DefaultGrace, named: map[string][]int{}, freedAt: map[string]int{}}
	f.snap.Store(&Snapshot{})
	return f
}

// Add adds a healthy backend and returns it with its ID (a returning
// backend's own: see AddWarm).
func (f *Fleet) Add(name string, u *url.URL, models []string) *Backend {
	return f.AddWarm(name, u, models, time.Time{}, 0)
}

// arcOf places a backend named name on the unit circle (Backend.Arc).
func arcOf(name string) float64 {
	return float64(xxhash.Sum64String(name)>>11) / (1 << 53)
}

// SetHealthy changes b's health and publishes a new snapshot if it changed.
func (f *Fleet) SetHealthy(b *Backend, ok bool) {
	if b.healthy.Load() == ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if b.healthy.Swap(ok) != ok {
		f.publish()
	}
	if ok && b.hung.Swap(false) {
		b.hungSig.reset()
	}
}

// Batch runs do, a burst of membership changes (a discovered pool's
// update: thousands of AddWarm and Remove), and publishes one snapshot
// when it returns instead of one per change. A snapshot costs O(fleet) to
// build, so a pool of n changed one backend at a time cost O(n²)
// (BenchmarkPoolReplace in package members). The changes themselves take
// effect at once on the backends (a removed one is draining); requests
// read the snapshot from before the batch until it ends, as they would
// one read just before a change. Health changes and retirements made
// meanwhile on other goroutines are published with the batch's.
func (f *Fleet) Batch(do func()) {
	f.mu.Lock()
	f.batches++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.batches--; f.batches == 0 && f.changed {
			f.publish()
		}
	}()
	do()
}

// publish stores a fresh snapshot of the current membership and health,
// or, inside a Batch, notes that one is due at its end. The caller holds
// f.mu, so the last snapshot stored reflects the last change.
func (f *Fleet) publish() {
	if f.batches > 0 {
		f.changed = true
		return
	}
	f.changed = false
	s := &Snapshot{IDs: len(f.slots)}
	for _, b := range f.slots {
		if b == nil || b.retired.Load() {
			continue
		}
		s.All = append(s.All, b)
		if b.healthy.Load() && !b.draining.Load() {
			s.Healthy = append(s.Healthy, b)
		}
	}
	f.snap.Store(s)
}

// Snapshot returns the current snapshot; it never blocks.
func (f *Fleet) Snapshot() *Snapshot { return f.snap.Load() }
