package sim

import (
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// KVEvents has the engines publish their KV cache events (the engine
// model's, as kvroute engine publishes them over ZMQ) and the router route
// on its precise index (scheduler.RoutePrecise), each request's token ids
// taken from the engine's own tokenizer (engine.TokenIDs), as kvroute
// serve takes them from the backend's /tokenize.
type KVEvents struct {
	// Delay is how long a step's events take to reach the router: the
	// publisher's batching, the network and the decoder.
	Delay time.Duration
	// Truth makes the router's picture the engines' caches exactly as
	// they are when it routes: no delay and no speculative entries (the
	// blocks of a request routed but not yet prefilled are not counted).
	// It is the bound of routing on what the engines truly hold.
	Truth bool
}

// Faults are the ways the router's picture of the caches can go wrong,
// applied alike to approximate and precise runs.
type Faults struct {
	// RestartAt > 0 restarts engine 0 at that instant: its prefix cache
	// is wiped (the requests it runs recompute their blocks), which the
	// approximate index cannot know and the events report.
	RestartAt time.Duration
	// Bypass is the share of requests, in [0, 1), that reach a random
	// engine without the router (another router, a batch job): they fill
	// its cache unseen by the approximate index, and are left out of the
	// run's samples.
	Bypass float64
	// CapacityFactor, when neither 0 nor 1, multiplies the KV capacity
	// engine 0 reports (in its metrics and cache config).
	CapacityFactor float64

	// The engines' failures (faults.go), at most one of them: KillAt > 0
	// kills engine 0 then, HangAt > 0 hangs it, RollingAt > 0 restarts
	// every engine in turn from then.
	KillAt, HangAt, RollingAt time.Duration
	// StreamIdle is the router's upstream.stream_idle_timeout, which finds
	// a hung engine's streams; 0: DefaultStreamIdle.
	StreamIdle time.Duration
	// DrainGrace is the router's fleet.drain_grace; EngineStart how long a
	// restarted engine takes to start (rolling).
	DrainGrace, EngineStart time.Duration
}

// kvBatch is one step's events on their way to the router.
type kvBatch struct {
	at     time.Duration
	events []kvevents.Event
}

// setupKV sets the engines' reported capacities and the scheduler's precise
// index before the scheduler is made.
func (s *sim) setupKV() {
	for i := range s.nodes {
		s.nodes[i].kvBlocks = s.nodes[i].eng.Preset().KVBlocks
	}
	if f := s.cfg.Faults.CapacityFactor; f > 0 && f != 1 {
		s.nodes[0].kvBlocks = int(float64(s.nodes[0].kvBlocks) * f)
	}
	kv := s.cfg.KVEvents
	if kv == nil {
		return
	}
	pc := prefix.PreciseConfig{
		BlockTokens: engine.BlockSize,
		// Every block an engine holds fits: the bound is for memory, not
		// a model of the cache.
		MaxBlocks: 2 * s.maxKVBlocks(),
	}
	if kv.Truth {
		pc.SpeculativeTTL = time.Nanosecond
	}
	s.cfg.Scheduler.Precise = &pc
}

// maxKVBlocks is the most blocks an engine holds: its GPU's and its CPU
// tier's.
func (s *sim) maxKVBlocks() int {
	m := 0
	for i := range s.nodes {
		p := s.nodes[i].eng.Preset()
		m = max(m, p.KVBlocks+p.CPUBlocks)
	}
	return m
}

// startKV starts the engines' streams (empty caches, trusted from their
// first event) and schedules the restart.
func (s *sim) startKV() {
	if s.cfg.KVEvents != nil {
		for i := range s.nodes {
			s.nodes[i].eng.SetKVEvents(true)
			s.sched.Precise().Reset(s.nodes[i].b.ID, true, Epoch)
		}
	}
	if at := s.cfg.Faults.RestartAt; at > 0 {
		s.seq++
		s.heap.push(event{at: at, class: evFault, seq: s.seq, engine: 0})
	}
}

// bypass says whether the current arrival reaches an engine without the
// router, and which: decided from the seed and the arrival's number, so
// that every run of a workload sends the same requests around the router.
func (s *sim) bypass() (int, bool) {
	f := s.cfg.Faults.Bypass
	if f <= 0 {
		return 0, false
	}
	x := prefix.Mix64(uint64(s.cfg.Seed)<<32 ^ s.arrivals)
	if float64(x>>11)/(1<<53) >= f {
		return 0, false
	}
	return int(prefix.Mix64(x) % uint64(len(s.nodes))), true
}

// route routes v on sched (the replica it entered), precisely when the
// run has events, away from the backends exclude names (a moved stream's
// failed engines; nil for none).
func (s *sim) route(sched *scheduler.Scheduler, v *request.View, hashes []uint64, exclude []int) (*scheduler.Assignment, error) {
	now := Epoch.Add(s.now)
	if s.cfg.KVEvents == nil {
		if hashes != nil {
			return sched.RouteHashed(v, hashes, exclude, now)
		}
		return sched.Route(v, exclude, now)
	}
	if hashes == nil {
		hashes = sched.Hashes(v)
	}
	s.tokens = engine.TokenIDs(s.tokens[:0], v.Prompt)
	return sched.RoutePrecise(v, hashes, sched.TokenKeys(s.tokens, ""), exclude, now)
}

// collectKV takes the events of engine i's last step and sends them on
// their way to the router.
func (s *sim) collectKV(i int) {
	if s.cfg.KVEvents == nil {
		return
	}
	n := &s.nodes[i]
	evs := n.eng.TakeKVEvents(nil)
	if s.cfg.TierBlindIndex {
		evs = gpuOnly(evs)
	}
	if len(evs) == 0 {
		return
	}
	at := s.now
	if !s.cfg.KVEvents.Truth {
		at += s.cfg.KVEvents.Delay
	}
	n.kv = append(n.kv, kvBatch{at: at, events: evs})
	s.push(at, evKV, i)
}

// gpuOnly keeps the events of the engines' GPU caches: what a router that
// reads no other medium learns (TierBlindIndex).
func gpuOnly(evs []kvevents.Event) []kvevents.Event {
	kept := evs[:0]
	for _, ev := range evs {
		if ev.Kind == kvevents.AllBlocksCleared || prefix.TierOf(ev.Medium) == prefix.TierGPU {
			kept = append(kept, ev)
		}
	}
	return kept
}

// deliverKV applies engine i's oldest batch in flight to the router's
// precise index. Batches of one engine arrive in order: the delay is the
// same for all.
func (s *sim) deliverKV(i int) {
	n := &s.nodes[i]
	b := n.kv[0]
	n.kv[0] = kvBatch{}
	n.kv = n.kv[1:]
	s.sched.Precise().Apply(n.b.ID, b.events, Epoch.Add(s.now))
}

// restart wipes engine i's prefix cache (Faults.RestartAt); the engine
// model reports it as vLLM does, with AllBlocksCleared.
func (s *sim) restart(i int) {
	s.nodes[i].eng.ResetPrefixCache()
	s.collectKV(i)
}
