// Package sim is kvroute's fleet simulator: a discrete-event simulation in
// virtual time that replays a workload through the very code kvroute serve
// and kvroute engine run. Each arrival is parsed by package request, routed
// by package scheduler (the same policies, prefix index and fleet
// accounting), and queued on an engine.Engine (the same state machine the
// emulator drives in real time); the engines' first tokens and completions
// are fed back to the scheduler as the proxy feeds them, so the simulated
// router learns prefill rates from TTFTs as the live one does.
//
// A run is single-threaded and deterministic: one min-heap of events, no
// goroutines, no sleeping, no clock, no HTTP. The same workload, fleet,
// policy and seed always give the same result, byte for byte. Independent
// runs (one per policy, one per load) may run side by side; see RunAll.
//
// The package owns the event loop and the fleet-level figures of a run
// (prefill utilisation, per-engine share, the oracle bounds, the offered
// load arithmetic); it must not contain any routing or engine logic of its
// own.
package sim

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/migrate"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/workload"
)

// Epoch is the wall-clock instant that virtual time 0 maps to when the
// scheduler and fleet, which speak time.Time, are fed virtual time. It is
// fixed so that runs are reproducible.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Config describes one simulated run.
type Config struct {
	// Engines has one preset per engine; heterogeneous fleets mix them.
	Engines []engine.Preset
	// KVBlocks > 0 overrides every engine's KV cache capacity.
	KVBlocks int
	// ConfigureLimits tells the router each engine's running-sequence cap
	// and token budget per step, as backends[].max_num_seqs and
	// max_num_batched_tokens do; without it the router learns the cap from
	// the engine's running and waiting counts, as it must from vLLM.
	ConfigureLimits bool
	// TrueCoefficients gives the router each engine's true cost
	// coefficients up front (its preset's, engine.Preset.Costs), frozen:
	// the yardstick of the learned cost model (costs.go).
	TrueCoefficients bool
	// Policy is the routing policy's name (see policy.Names).
	Policy string
	// Seed seeds the policy's random choices.
	Seed int64
	// Scheduler tunes the scheduler; zero values are its defaults, and the
	// per-backend prefix index capacity is set from each engine's KV cache.
	Scheduler scheduler.Config
	// Model is the model name the requests ask for; default the first
	// engine's served model.
	Model string
	// Request configures the parser, as kvroute serve's config does.
	Request request.Options
	// OfferedLoad is copied into the result (see Offered).
	OfferedLoad float64
	// Name names the run in the result; default Policy.
	Name string
	// KVEvents, when set, has the engines publish their KV cache events
	// to the router's precise index (see kvevents.go).
	KVEvents *KVEvents
	// Faults are the ways the router's picture can go wrong (kvevents.go),
	// and the engines' failures (faults.go).
	Faults Faults
	// Migration bounds the moves of streams whose engine fails (faults.go),
	// as the config's migration keys; zero: moving off.
	Migration migrate.Limits
	// Replicas is the number of router replicas in front of the engines
	// (replicas.go); 0 or 1: one router.
	Replicas int
	// SyncDelay is how long, in virtual time, a replica's events take to
	// reach the others; NoSync turns sharing off (independent replicas).
	SyncDelay time.Duration
	NoSync    bool
	// Hold, when set, holds requests in the router while every engine is
	// busy and binds them as engines free up (late binding, hold.go).
	Hold *Hold
	// Routed, when not nil, counts the requests this run has routed, for
	// a progress report read from another goroutine while runs go on.
	Routed *atomic.Int64
	// OracleTTFT is each request's TTFT alone on an idle engine with an
	// infinite cache, indexed as the run's requests (OracleTTFTs); when
	// set, samples carry it, for the slowdown by class.
	OracleTTFT []time.Duration
	// Roles, when it names a prefill engine, is each engine's role
	// (config.RolePrefill, RoleDecode, RoleBoth; XPYD): a disaggregated
	// fleet, whose requests are split over a prefill and a decode engine
	// as Split says (pd.go).
	Roles []string
	Split string
	// TierBlindIndex keeps the engines' CPU tiers (engine.Preset.CPUBlocks)
	// from the router: its approximate index does not model their offload
	// (the blocks it evicts for a GPU's capacity vanish), and its precise
	// index hears only the GPUs' events, as a router told nothing of the
	// tiers; by default it is told each engine's, as the
	// backends[].cpu_kv_blocks key tells the live one.
	TierBlindIndex bool
}

// Run simulates reqs on a fresh fleet under cfg and returns the run's
// result. reqs are not modified; arrivals are taken in time order.
func Run(reqs []workload.Request, cfg Config) (report.Run, error) {
	s, err := newSim(reqs, cfg)
	if err != nil {
		return report.Run{}, err
	}
	s.loop()
	return s.result(), nil
}

// Event classes, in the order they are handled when they fall on the same
// instant: what a step finished is known before anything arrives at that
// instant, and a step that starts at that instant sees those arrivals in
// its batch, as an engine's busy loop would.
const (
	evStepDone = iota
	evArrival
	evStepStart
	evKV    // an engine's events reach the router (kvevents.go)
	evFault // engine 0 restarts (kvevents.go)
	evBind  // a held request's grant reaches routing (hold.go, Hold.Transit)
	evWake  // an idle engine's KV transfer ends (pd.go)
	// An engine fails (faults.go): killed, hung, its hung streams found,
	// drained, its drain's grace over, started again.
	evKill
	evHang
	evDetect
	evDrain
	evGrace
	evUp
)

// event is one entry of the event heap. Arrivals are not kept in the heap
// (they come from a sorted cursor), so the heap holds at most two events
// per engine.
type event struct {
	at     time.Duration
	class  uint8
	seq    uint64
	engine int32
	// gen is the engine's generation when a step's event was pushed: a
	// failed engine's step never ends (faults.go).
	gen uint32
}

func (a event) less(b event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.class != b.class {
		return a.class < b.class
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap; hand-rolled so that pushing and popping
// neither boxes nor allocates.
type eventHeap []event

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	q := *h
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q[i].less(q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q[r].less(q[l]) {
			m = r
		}
		if !q[m].less(q[i]) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// flight is one request in the simulated fleet. The engine.Request is
// embedded so that one allocation carries both.
type flight struct {
	engine.Request
	a       *scheduler.Assignment
	arrival time.Duration
	first   time.Duration
	last    time.Duration
	itl     []time.Duration
	backend int32
	oracle  time.Duration
	k       int // the request's index in the workload
	// leg links the legs of a split request (pd.go); prefill marks its
	// prefill leg.
	leg     *leg
	prefill bool
	// c is the account of a request an engine fault touched, shared by
	// its legs (faults.go); nil for every other. contd marks a leg that
	// continues a moved stream, gone a leg its failed engine lost.
	c     *cont
	contd bool
	gone  bool
}

// delivery is an engine event waiting for the end of the step that made it.
type delivery struct {
	f     *flight
	first bool // first token; otherwise finished
}

// node is one simulated engine and what the driver knows about it.
type node struct {
	eng  *engine.Engine
	b    *fleet.Backend
	busy bool // a step is scheduled or under way
	// out holds the step's events until the step's end.
	out    []delivery
	routed int
	// kv holds the engine's event batches on their way to the router.
	kv []kvBatch
	// kvBlocks is the KV capacity the engine reports (Faults).
	kvBlocks int
	// itlN and itlSum count the output tokens after each request's first
	// since the last step began and the time between them: the engine's
	// inter-token latency histogram.
	itlN   int
	itlSum time.Duration
	// wakeAt is when an evWake is due for the idle engine (pd.go), 0
	// for none.
	wakeAt time.Duration
	// computed is the engine's prompt tokens computed at the last reading
	// (costs.go).
	computed int64
	// loads is the engine's counts of its CPU tier's loads as last taught
	// (costs.go).
	loads fleet.Counters
	// gen counts the engine's failures: a step pushed before one is
	// dropped. down is set from a failure (a kill, a hang, a restart's
	// stop) until the engine starts again, if ever; the rest is the
	// fault's state (faults.go).
	gen  uint32
	down nodeFault
}

// sim is one run's state.
type sim struct {
	cfg   Config
	reqs  []workload.Request
	order []int // indices of reqs in arrival order
	model string
	sched *scheduler.Scheduler
	nodes []node
	heap  eventHeap
	seq   uint64
	now   time.Duration
	cur   int // the node whose step is running (for the sink)
	// tiered: an engine has a CPU tier, whose loads it waits for (kick).
	tiered  bool
	samples []report.Sample
	arena   []time.Duration
	// shareHashes is set when the router's blocks are the engine's (same
	// size, and both hash with prefix.Hash): each prompt is then hashed
	// once, into hashArena, for both.
	shareHashes bool
	hashArena   []uint64
	end         time.Duration
	nextID      uint64
	arrivals    uint64   // requests admitted so far, bypassing ones included
	tokens      []uint32 // the prompt's token ids, scratch of route
	// rep is the router replicas; nil with one router.
	rep *replicaSet
	// fleet is the router's fleet; held the admission gate holding
	// requests for late binding, nil without Config.Hold (hold.go).
	fleet *fleet.Fleet
	held  *admission.Gate
	// granted is the held request whose grant is in transit until its
	// evBind (Hold.Transit), or nil.
	granted *held
	// pd is a disaggregated run's state (pd.go), nil otherwise.
	pd *pdState
	// flt is the account of the run's engine fault (faults.go), nil
	// without one.
	flt *faultState
}

func newSim(reqs []workload.Request, cfg Config) (*sim, error) {
	if len(cfg.Engines) == 0 {
		return nil, errors.New("sim: no engines")
	}
	p, err := policy.New(cfg.Policy, policy.Options{Seed: cfg.Seed})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	f := fleet.New()
	if cfg.Hold != nil && cfg.Replicas > 1 {
		return nil, fmt.Errorf("sim: late binding with several router replicas is not modelled")
	}
	s := &sim{
		fleet:   f,
		cfg:     cfg,
		reqs:    reqs,
		nodes:   make([]node, len(cfg.Engines)),
		samples: make([]report.Sample, 0, len(reqs)),
	}
	s.model = cfg.model()
	for i, pr := range cfg.Engines {
		// Backends serve any model, so that a heterogeneous fleet (whose
		// presets name different models) still takes every request.
		s.nodes[i].b = f.Add(fmt.Sprintf("engine-%d", i), nil, nil)
		s.nodes[i].eng = engine.New(pr, cfg.KVBlocks)
		// An engine loading from its CPU tier waits for the load, as
		// for a KV transfer: it is woken at its end (kick).
		s.tiered = s.tiered || pr.CPUBlocks > 0
	}
	s.setupKV()
	if err := s.setupPD(); err != nil {
		return nil, err
	}
	s.sched = scheduler.New(f, p, s.cfg.Scheduler)
	s.sched.SetAdapters(adapters(reqs, s.model))
	blockChars := s.sched.BlockChars()
	if blockChars != cfg.blockChars() {
		return nil, fmt.Errorf("sim: scheduler blocks of %d characters, want %d", blockChars, cfg.blockChars())
	}
	s.shareHashes = blockChars == engine.BlockSize*engine.BytesPerToken
	for i := range s.nodes {
		// The router learns a backend's capacity from its metrics (vLLM's
		// cache_config_info): engine blocks of BlockSize tokens of
		// BytesPerToken bytes, converted to the router's blocks.
		s.sched.SetKVCapacity(s.nodes[i].b.ID, int64(s.nodes[i].kvBlocks)*engine.BlockSize)
		if !cfg.TierBlindIndex {
			s.sched.SetCPUCapacity(s.nodes[i].b.ID, int64(s.nodes[i].eng.Preset().CPUBlocks)*engine.BlockSize)
		}
	}
	s.startKV()
	if kind, _ := cfg.Faults.engineFault(); kind != "" {
		if cfg.Replicas > 1 || cfg.Hold != nil || s.pd != nil {
			return nil, fmt.Errorf("sim: an engine %s with several router replicas, late binding or a disaggregated fleet is not modelled", kind)
		}
		s.startFaults()
	}
	if cfg.Replicas > 1 {
		if cfg.KVEvents != nil {
			return nil, fmt.Errorf("sim: KV events with several router replicas are not modelled")
		}
		if err := s.newReplicas(f); err != nil {
			return nil, err
		}
	}
	for i := range s.nodes {
		// The context length, as the engine's /v1/models reports it
		// (max_model_len). Its cap on running sequences and its token
		// budget per step are not reported (vLLM exports neither): they
		// are configured (ConfigureLimits), or the router learns the cap
		// from the engine's running and waiting counts, as the live one
		// does (see stepStart).
		p := s.nodes[i].eng.Preset()
		s.forBackends(i, func(b *fleet.Backend) {
			b.SetContextLen(p.MaxModelLen)
			if cfg.TrueCoefficients {
				b.SetCostModel(costmodel.Frozen(p.Costs()))
			}
			if cfg.ConfigureLimits {
				b.SetMaxNumSeqs(p.MaxNumSeqs)
				b.SetMaxBatchedTokens(p.MaxBatchedTokens)
			}
		})
	}
	if cfg.Hold != nil {
		s.held = cfg.Hold.gate(f)
	}
	s.order = make([]int, len(reqs))
	for i := range s.order {
		s.order[i] = i
	}
	sortByArrival(s.order, reqs)
	return s, nil
}

// forBackends calls fn with node i's backend in every router replica's
// fleet.
func (s *sim) forBackends(i int, fn func(*fleet.Backend)) {
	fn(s.nodes[i].b)
	if s.rep != nil {
		for r := 1; r < len(s.rep.backends); r++ {
			fn(s.rep.backends[r][i])
		}
	}
}

// sortByArrival sorts order, indices into reqs, by arrival time; equal
// times keep their workload order.
func sortByArrival(order []int, reqs []workload.Request) {
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(reqs[a].At, reqs[b].At)
	})
}

func (s *sim) push(at time.Duration, class uint8, engine int) {
	s.seq++
	s.heap.push(event{at: at, class: class, seq: s.seq, engine: int32(engine), gen: s.nodes[engine].gen})
}

// loop runs the simulation to the last event.
func (s *sim) loop() {
	for _, k := range s.order {
		r := &s.reqs[k]
		s.until(r.At)
		s.arrive(k)
	}
	s.until(-1)
	s.finish()
}

// until handles, in order, the events that come before an arrival at at
// (every event when at < 0), and sets the clock to at.
func (s *sim) until(at time.Duration) {
	arrival := event{at: at, class: evArrival}
	for len(s.heap) > 0 && (at < 0 || s.heap[0].less(arrival)) {
		e := s.heap.pop()
		s.sync(e.at)
		s.now = e.at
		switch e.class {
		case evStepDone, evStepStart:
			if e.gen != s.nodes[e.engine].gen {
				break // the engine failed meanwhile (faults.go)
			}
			if e.class == evStepDone {
				s.stepDone(int(e.engine))
			} else {
				s.stepStart(int(e.engine))
			}
		case evKV:
			s.deliverKV(int(e.engine))
		case evFault:
			s.restart(int(e.engine))
		case evBind:
			s.bindGranted()
		case evWake:
			s.wake(int(e.engine), e.at)
		case evKill, evHang, evDetect, evDrain, evGrace, evUp:
			s.engineFault(e.class, int(e.engine))
		}
	}
	if at >= 0 {
		s.sync(at)
		s.now = at
	} else {
		s.sync(time.Duration(1 << 62))
	}
}

// sync applies the replicas' batches due by at; nothing with one router.
func (s *sim) sync(at time.Duration) {
	if s.rep != nil {
		s.rep.deliverUntil(at)
	}
}

// view parses r as this run's router would see it, and hashes its prompt
// when the router and engines share hashes.
func (s *sim) view(r *workload.Request) (*request.View, []uint64, *openai.Error) {
	v, perr := request.Parse(r.Kind, r.Body(s.model), s.cfg.Request)
	if perr != nil {
		return nil, nil, perr
	}
	v.SessionKey = r.Session
	v.Objective = r.Objective
	var hashes []uint64
	if s.shareHashes {
		hashes = s.hash(v.Prompt, s.sched.Salt(v))
	}
	return v, hashes, nil
}

// arrive routes the k-th request and queues it on its engine.
func (s *sim) arrive(k int) {
	r := &s.reqs[k]
	v, hashes, perr := s.view(r)
	s.admit(k, v, hashes, perr)
}

// admit routes the k-th request, parsed (see view), and queues it on its
// engine, or holds it (hold.go). v and hashes are only read, so runs in
// lockstep may share them.
func (s *sim) admit(k int, v *request.View, hashes []uint64, perr *openai.Error) {
	if perr != nil {
		s.fail(k, 0, 0, "parse: "+perr.Message)
		return
	}
	s.arrivals++
	if s.cfg.Routed != nil {
		s.cfg.Routed.Add(1)
	}
	if e, ok := s.bypass(); ok {
		s.queue(k, v, hashes, nil, e)
		return
	}
	if s.hold(k, v, hashes) {
		return
	}
	s.bind(k, v, hashes)
}

// bind routes the k-th request and queues it on the chosen engine (or
// engines: bindPD).
func (s *sim) bind(k int, v *request.View, hashes []uint64) {
	if s.pd != nil {
		s.bindPD(k, v, hashes)
		return
	}
	s.bindOne(k, v, hashes)
}

// bindOne routes the k-th request and queues it on the chosen engine.
func (s *sim) bindOne(k int, v *request.View, hashes []uint64) {
	sched := s.sched
	if s.rep != nil {
		sched = s.rep.route()
		defer s.rep.collect(s.now)
	}
	a, err := s.route(sched, v, hashes, nil)
	if err != nil {
		s.fail(k, v.PromptTokens, 0, err.Error())
		// A sheddable request refused for its objectives (scheduler.ShedError).
		_, s.samples[len(s.samples)-1].Shed = errors.AsType[*scheduler.ShedError](err)
		return
	}
	s.nodes[a.Backend.ID].routed++
	s.queue(k, v, hashes, a, a.Backend.ID)
}

// queue puts a request on engine e; a is its routing, nil for a request
// that reached the engine without the router (Faults.Bypass), which is
// left out of the run's samples.
func (s *sim) queue(k int, v *request.View, hashes []uint64, a *scheduler.Assignment, e int) {
	s.queueOne(k, v, hashes, a, e, nil)
}

// queueOne is queue with prep, when not nil, called on the flight before
// it reaches its engine (a leg of a split request, pd.go); it returns the
// flight, nil when the engine refused it.
func (s *sim) queueOne(k int, v *request.View, hashes []uint64, a *scheduler.Assignment, e int, prep func(*flight)) *flight {
	r := &s.reqs[k]
	n := &s.nodes[e]
	s.nextID++
	f := &flight{a: a, arrival: r.At, backend: int32(e), k: k}
	if k < len(s.cfg.OracleTTFT) {
		f.oracle = s.cfg.OracleTTFT[k]
	}
	f.ID = s.nextID
	f.Prompt = v.Prompt
	f.PromptHashes = hashes
	f.Adapter = r.Adapter
	if r.Adapter != "" && s.sched.Salt(v) != prefix.AdapterSalt(r.Adapter, "") {
		// An adapter-blind router's hashes are not the engine's.
		f.PromptHashes = nil
	}
	f.SetOutput(v.MaxTokens, v.MinTokens, v.IgnoreEOS, n.eng.Preset().MaxModelLen)
	f.Tag = f
	if prep != nil {
		prep(f)
	}
	if err := n.eng.Add(&f.Request, s.now); err != nil {
		if a != nil {
			a.Done(Epoch.Add(s.now))
			s.fail(k, v.PromptTokens, e, err.Error())
		}
		return nil
	}
	if f.OutputTokens > 1 {
		f.itl = s.alloc(f.OutputTokens - 1)
	}
	s.started(f, e)
	return f
}

// started has engine e, which f was just added to, step if it is idle.
func (s *sim) started(f *flight, e int) {
	n := &s.nodes[e]
	if n.down.hung {
		s.hungOn(f, e) // faults.go
	}
	if !n.busy {
		n.busy = true
		s.push(s.now, evStepStart, e)
	}
}

// alloc hands out n zero-length slots from a shared arena, so that recording
// inter-token gaps costs no allocation per request.
func (s *sim) alloc(n int) []time.Duration {
	if n > 1<<14 {
		return make([]time.Duration, 0, n)
	}
	if cap(s.arena)-len(s.arena) < n {
		s.arena = make([]time.Duration, 0, 1<<16)
	}
	out := s.arena[len(s.arena) : len(s.arena) : len(s.arena)+n]
	s.arena = s.arena[:len(s.arena)+n]
	return out
}

// hash returns prefix.HashSalted(nil, prompt, engine block bytes, salt), carved from a
// shared arena so that hashing a prompt costs no allocation of its own. The
// slice is never written again: the router reads it during Route and the
// engine until the request finishes.
func (s *sim) hash(prompt, salt string) []uint64 {
	n := len(prompt) / (engine.BlockSize * engine.BytesPerToken)
	if n > 1<<12 {
		return prefix.HashSalted(make([]uint64, 0, n), prompt, engine.BlockSize*engine.BytesPerToken, salt)
	}
	if cap(s.hashArena)-len(s.hashArena) < n {
		s.hashArena = make([]uint64, 0, 1<<15)
	}
	l := len(s.hashArena)
	out := prefix.HashSalted(s.hashArena[l:l:l+n], prompt, engine.BlockSize*engine.BytesPerToken, salt)
	s.hashArena = s.hashArena[:l+n]
	return out
}

// fail records the k-th request as failed.
func (s *sim) fail(k, prompt, backend int, msg string) {
	s.samples = append(s.samples, report.Sample{
		Request:      k,
		Start:        s.reqs[k].At,
		PromptTokens: prompt,
		Err:          msg,
		Backend:      s.nodes[backend].b.Name,
		Objective:    s.reqs[k].Objective,
	})
}

// stepStart runs one engine iteration. The engine's state already reflects
// the step's outcome; its token events are held back until the step's end,
// when a real engine would send them.
func (s *sim) stepStart(i int) {
	n := &s.nodes[i]
	s.cur = i
	d := n.eng.Step(s.now, s)
	s.collectKV(i)
	st := n.eng.Stats()
	// A fresh metrics scrape after every step: the live router scrapes on
	// an interval, so the simulated one sees engine state at least as fresh.
	es := &fleet.EngineState{
		At:        Epoch.Add(s.now),
		Running:   st.Running,
		Waiting:   st.Waiting,
		KVUsage:   st.KVUsage,
		KVBlocks:  n.kvBlocks,
		BlockSize: engine.BlockSize,
		LoRA:      loraState(n.eng),
	}
	// Taught as the live monitor teaches a scrape (fleet.Backend.Learn),
	// to every replica's picture of the engine: the report, and the
	// inter-token latency since the last reading, and its CPU tier's
	// loads. As from the emulated engine's /metrics, no running-sequence
	// cap (vLLM exports none) and no prefill time (kvroute engine exports
	// none), so no prefill rate.
	r := fleet.Reading{State: es, DecodeTokens: float64(n.itlN), DecodeSeconds: n.itlSum.Seconds(),
		ComputedTokens: n.computedSince(st)}
	n.learnLoads(&r, st)
	n.itlN, n.itlSum = 0, 0
	s.forBackends(i, func(b *fleet.Backend) { b.Learn(r) })
	if d <= 0 {
		// Nothing could run: the engine waits for the next arrival (or
		// a KV transfer's end, pd.go).
		n.busy = false
		s.deliver(i)
		if s.pd != nil || s.tiered {
			s.kick(i)
		}
		return
	}
	s.push(s.now+d, evStepDone, i)
}

// stepDone delivers a finished step's events and starts the next step if
// there is work.
func (s *sim) stepDone(i int) {
	s.deliver(i)
	n := &s.nodes[i]
	if n.eng.Idle() {
		n.busy = false
		if s.pd != nil || s.tiered {
			s.kick(i)
		}
		if n.down.draining {
			s.stop(i) // faults.go
		}
		return
	}
	s.push(s.now, evStepStart, i)
}

// deliver feeds the held events of node i to the scheduler at s.now.
func (s *sim) deliver(i int) {
	n := &s.nodes[i]
	at := Epoch.Add(s.now)
	for _, d := range n.out {
		f := d.f
		if f.a == nil {
			continue // bypassed the router: not this run's traffic
		}
		if d.first {
			f.a.FirstByte(at)
			if f.leg != nil && !f.prefill {
				s.received(f) // pd.go
			}
			continue
		}
		// The engine's report of its cache hit checks the router's
		// picture, as the live relay's does.
		// A moved stream's last leg teaches neither (faults.go): the
		// client's usage has no cached detail of the new engine's, and
		// its chunks came from two engines.
		rep := scheduler.Report{Cached: f.CachedTokens, Prompt: f.PromptTokens}
		if f.Generated > 0 {
			rep.TTFT = f.first - f.arrival
		}
		if !f.contd {
			f.a.Reported(rep, at)
		}
		if !f.prefill && !f.contd && f.Generated > 1 {
			// The stream's inter-token timings, as a live router's
			// relay teaches them (lifecycle's settle).
			f.a.Decoded(int64(f.Generated-1), f.FinishedAt-f.first, at)
		}
		f.a.Done(at)
		if f.prefill {
			s.prefilled(f) // a split request's prefill leg (pd.go)
			continue
		}
		smp := report.Sample{
			Start:         f.arrival,
			E2E:           f.FinishedAt - f.arrival,
			ITL:           f.itl,
			PromptTokens:  f.PromptTokens,
			CachedTokens:  f.CachedTokens,
			OutputTokens:  f.Generated,
			Backend:       n.b.Name,
			OracleTTFT:    f.oracle,
			Request:       f.k,
			MatchedTokens: f.a.MatchedTokens,
			Route:         f.a.Reason,
			Held:          f.Arrival - f.arrival,
			Queued:        f.ScheduledAt - f.Arrival,
			Objective:     s.reqs[f.k].Objective,
			PredTTFT:      f.a.Pred.TTFT,
			PredITL:       f.a.Pred.ITL,
		}
		if f.Generated > 0 {
			smp.TTFT = f.first - f.arrival
		} else {
			smp.TTFT = smp.E2E
		}
		if f.leg != nil {
			s.recordLegs(f, &smp)
		}
		if f.c != nil {
			s.recordMoved(f, &smp) // faults.go
		}
		smp.Prefill = smp.TTFT - smp.Held - smp.Queued
		s.samples = append(s.samples, smp)
		s.end = max(s.end, f.FinishedAt)
	}
	clear(n.out)
	n.out = n.out[:0]
	if s.rep != nil {
		s.rep.collect(s.now)
	}
	// First tokens and completions are what free an engine's queue.
	s.bindHeld()
}

// Token implements engine.Sink: times are recorded now (they are stamped
// with the step's end); the first byte reaches the scheduler at delivery.
func (s *sim) Token(r *engine.Request, at time.Duration) {
	f := r.Tag.(*flight)
	if f.c != nil {
		s.tokenMoved(f, r, at) // faults.go
		return
	}
	if r.Generated == 1 {
		f.first = at
		f.last = at
		n := &s.nodes[s.cur]
		n.out = append(n.out, delivery{f: f, first: true})
		return
	}
	gap := at - f.last
	if len(f.itl) < cap(f.itl) {
		f.itl = append(f.itl, gap)
	}
	n := &s.nodes[s.cur]
	n.itlN++
	n.itlSum += gap
	f.last = at
}

// Finished implements engine.Sink.
func (s *sim) Finished(r *engine.Request, at time.Duration) {
	f := r.Tag.(*flight)
	n := &s.nodes[s.cur]
	n.out = append(n.out, delivery{f: f})
}

// result summarises the run.
func (s *sim) result() report.Run {
	wall := s.end
	name := s.cfg.Name
	if name == "" {
		name = s.cfg.Policy
	}
	run := report.Summarize(name, s.samples, wall)
	run.OfferedLoad = s.cfg.OfferedLoad
	total := 0
	var computed, loads int64
	var capacity float64
	for i := range s.nodes {
		total += s.nodes[i].routed
		computed += s.nodes[i].eng.Stats().PrefillTokensComputed + s.nodes[i].down.computed
		loads += s.nodes[i].eng.Stats().LoRALoads + s.nodes[i].down.loads
		capacity += s.nodes[i].eng.Preset().PrefillTokensPerSec()
	}
	run.EngineShare = make([]float64, len(s.nodes))
	for i := range s.nodes {
		if total > 0 {
			run.EngineShare[i] = float64(s.nodes[i].routed) / float64(total)
		}
	}
	if wall > 0 && capacity > 0 {
		run.PrefillUtilisation = float64(computed) / (capacity * wall.Seconds())
	}
	if run.Completed > 0 {
		run.AdapterLoads = 1000 * float64(loads) / float64(run.Completed)
	}
	s.pdResult(&run)
	run.Fault = s.faultResult() // faults.go
	return run
}

var _ engine.Sink = (*sim)(nil)

// Job is one run of RunAll: a workload on a fleet with one policy.
type Job struct {
	Reqs   []workload.Request
	Config Config
}

// RunAll runs jobs, up to parallel at once (at least one), and returns
// their results in job order. Each run is single-threaded and owns its
// fleet, so running several side by side changes nothing in any result;
// jobs may share their Reqs.
//
// Jobs that share their Reqs (the same slice), model, parser options and
// block size run in lockstep, split over at most parallel goroutines: each
// arrival's body is built, parsed and hashed once per goroutine and the
// read-only view is handed to every run of the group, instead of once per
// run. Every run still sees exactly the events it would see alone, so
// results are the same byte for byte; a rate of simulated requests per
// CPU-second counts each run's requests (jobs x requests), the parsing
// shared among them counted once.
func RunAll(jobs []Job, parallel int) ([]report.Run, error) {
	parallel = max(parallel, 1)
	runs := make([]report.Run, len(jobs))
	errs := make([]error, len(jobs))
	// Group the jobs; a group's members are split round-robin into at most
	// parallel units, each run by one goroutine.
	type key struct {
		reqs  *workload.Request
		n     int
		model string
		opt   request.Options
		block int
	}
	var order []key
	groups := map[key][]int{}
	for i, j := range jobs {
		k := key{n: len(j.Reqs), model: j.Config.model(), opt: j.Config.Request, block: j.Config.blockChars()}
		if len(j.Reqs) > 0 {
			k.reqs = &j.Reqs[0]
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	var units [][]int
	for _, k := range order {
		g := groups[k]
		n := min(parallel, len(g))
		split := make([][]int, n)
		for i, j := range g {
			split[i%n] = append(split[i%n], j)
		}
		units = append(units, split...)
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var sims []*sim
			var idx []int
			for _, i := range u {
				s, err := newSim(jobs[i].Reqs, jobs[i].Config)
				if err != nil {
					errs[i] = err
					continue
				}
				sims = append(sims, s)
				idx = append(idx, i)
			}
			lockstep(sims)
			for k, s := range sims {
				runs[idx[k]] = s.result()
			}
		}()
	}
	wg.Wait()
	return runs, errors.Join(errs...)
}

// lockstepWindow is how many arrivals lockstep parses before it hands them
// to each run in turn. One run at a time over a window keeps that run's
// prefix index and engines in the processor's caches; handing every arrival
// to every run at once made each of them evict the others' and cost about
// a third more CPU time with twelve runs on 64 engines (BenchmarkSimAll64).
const lockstepWindow = 256

// lockstep runs sims, which share their requests, model, parser options
// and block size, side by side on one goroutine: each arrival is parsed
// and hashed once, by the first run, and admitted by every run at its own
// clock. Arrivals go to the runs a window at a time.
func lockstep(sims []*sim) {
	if len(sims) == 0 {
		return
	}
	first := sims[0]
	type parsed struct {
		k      int
		r      *workload.Request
		v      *request.View
		hashes []uint64
		perr   *openai.Error
	}
	var window []parsed
	for w := 0; w < len(first.order); w += lockstepWindow {
		window = window[:0]
		for _, k := range first.order[w:min(w+lockstepWindow, len(first.order))] {
			r := &first.reqs[k]
			v, hashes, perr := first.view(r)
			window = append(window, parsed{k, r, v, hashes, perr})
		}
		for _, s := range sims {
			for _, p := range window {
				s.until(p.r.At)
				s.admit(p.k, p.v, p.hashes, p.perr)
			}
		}
	}
	for _, s := range sims {
		s.until(-1)
		s.finish()
	}
}

// model is the model name the run's requests ask for.
func (c *Config) model() string {
	if c.Model == "" && len(c.Engines) > 0 {
		return c.Engines[0].Model
	}
	return c.Model
}

// blockChars is the router's block size of the run.
func (c *Config) blockChars() int {
	if c.Scheduler.BlockChars <= 0 {
		return prefix.DefaultBlockChars
	}
	return c.Scheduler.BlockChars
}
