// Package scheduler is kvroute's one routing decision, shared by the live
// proxy and the virtual-time simulator: it computes a request's prefix
// blocks once, matches them against the prefix index, asks the policy for a
// pick among the candidates, records the routed blocks and opens the
// load-accounting ticket. The caller reports the request's fate (first
// byte, done) back through the Assignment; time is always passed in, never
// read from a clock, so that the simulator can drive it in virtual time.
//
// It does no I/O and never sleeps.
package scheduler

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/slo"
)

// Errors Route returns.
var (
	// ErrUnknownModel: no backend, healthy or not, serves the model (404).
	ErrUnknownModel = errors.New("no backend serves this model")
	// ErrNoBackend: backends serve the model but none is available (503).
	ErrNoBackend = errors.New("no healthy backend for this model")
)

// Config tunes a Scheduler.
type Config struct {
	// BlockChars is the prefix block size in characters; default
	// prefix.DefaultBlockChars.
	BlockChars int
	// Capacity is the default per-backend prefix index capacity in blocks;
	// default prefix.DefaultCapacity.
	Capacity int
	// Precise, when set, makes the scheduler keep a precise index fed by
	// the engines' KV cache events (see RoutePrecise).
	Precise *prefix.PreciseConfig
	// Filters narrow every request's candidates before the pick, and
	// Scorers add their costs to each candidate's (policy.Input.Extra):
	// the seams of features the policies need not weigh themselves
	// (policy.Filter, policy.Scorer). None by default.
	Filters []policy.Filter
	Scorers []policy.Scorer
	// ProbeInterval is the probe rule's interval (probe.go); 0 means
	// DefaultProbeInterval, a negative one turns probes off.
	ProbeInterval time.Duration
}

// Scheduler routes requests over a fleet with one policy.
type Scheduler struct {
	fleet *fleet.Fleet
	// pol is the current policy; SetPolicy swaps it while requests route.
	pol atomic.Pointer[active]
	// decide makes a pick and the chosen backend's load increment one
	// step (see route).
	decide  sync.Mutex
	index   *prefix.Index
	audit   *prefix.Audit
	precise *prefix.Precise // nil unless Config.Precise
	// cpu is the approximate index's CPU tier, nil until SetCPUCapacity
	// gives one; caps are the tiers' sizes it is set from, under tierMu
	// (tiers.go).
	cpu     atomic.Pointer[prefix.Index]
	tierMu  sync.Mutex
	caps    tierCaps
	blockCh int
	filters []policy.Filter
	scorers []policy.Scorer
	scratch sync.Pool
	// picks counts routings whose request has no key for warm-up (see
	// warmKey).
	picks atomic.Uint64
	// events, when set, hears of every routing and load change for peer
	// replicas (replica.go); requests numbers the routings it hears of.
	events Events
	// homes are the engines of stored responses (responses.go).
	homes    homes
	requests atomic.Uint64
	// replicas is the live router replicas and this one's place among
	// them (SetReplicas); nil for one router. blind is how long a peer's
	// decision takes to reach this replica, in nanoseconds
	// (SetBlindWindow); presumed are this replica's routings of the last
	// blind window, whose like each peer is presumed to be making
	// (replica.go), guarded by decide.
	replicas atomic.Pointer[replicaPlace]
	// replicaID is this replica's ID hashed (SetReplicaID), 0 for one
	// router: what its policy's session claims carry.
	replicaID atomic.Uint64
	blind     atomic.Int64
	presumed  []presumption
	// adapters maps each known LoRA adapter to its base model (lora.go).
	adapters   atomic.Pointer[map[string]string]
	adaptersMu sync.Mutex // serialises writers of adapters
	// resident is the router's picture of the adapters each backend
	// keeps loaded (lora.go).
	resident residents
	// probes is the probe rule (probe.go), guarded by decide.
	probes *probes
}

// scratch is one Route's working memory, pooled so that routing allocates
// only what outlives it (the Assignment, its Ticket and Reason).
type scratch struct {
	all     []int32 // Match output, indexed by backend ID
	cands   []*fleet.Backend
	matched []int32
	exact   []int32 // precise Match output, indexed by backend ID
	trusted []bool  // whether exact[b] is trusted
	reason  []byte
	in      policy.Input
	// cached, uncached and extra are policy.Input's, per candidate;
	// tiers is a Filter's tier per candidate (narrow).
	cached, uncached []int64
	extra            []float64
	tiers            []int
	// adapterTier is the adapter stage's tier when it decided among the
	// candidates (candidates), for the Reason.
	adapterTier string
	// raw is all before untrust zeroed the untrusted backends' matches
	// (empty when none is); best the largest match of a candidate.
	raw  []int32
	best int32
	// tiered: some backend has a lower cache tier, and ktiers[b] is how
	// all[b] spreads over b's (ptiers: the precise index's, in its
	// blocks); ctiers and load are policy.Input's Tiers and Load, per
	// candidate (tiers.go).
	tiered         bool
	ktiers, ptiers []prefix.Tiers
	ctiers         []policy.TierTokens
	load           []float64
}

// New returns a scheduler over f using p.
func New(f *fleet.Fleet, p policy.Policy, cfg Config) *Scheduler {
	if cfg.BlockChars <= 0 {
		cfg.BlockChars = prefix.DefaultBlockChars
	}
	if cfg.Capacity <= 0 {
		cfg.Capacity = prefix.DefaultCapacity
	}
	s := &Scheduler{
		fleet:   f,
		index:   prefix.NewIndex(cfg.Capacity),
		audit:   prefix.NewAudit(prefix.AuditConfig{DefaultCapacity: cfg.Capacity}),
		blockCh: cfg.BlockChars,
		filters: cfg.Filters,
		scorers: cfg.Scorers,
		probes:  newProbes(cfg.ProbeInterval),
	}
	if cfg.Precise != nil {
		s.precise = prefix.NewPrecise(*cfg.Precise)
	}
	s.SetPolicy(p)
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// Index exposes the prefix index (to set capacities, or forget a crashed
// backend).
func (s *Scheduler) Index() *prefix.Index { return s.index }

// SetKVCapacity sizes backend's prefix index from its engine's KV cache of
// kvTokens tokens (vLLM: num_gpu_blocks x block_size): at
// request.BytesPerToken characters a token, in blocks of BlockChars. The
// one conversion the live router (from engine metrics) and the simulator
// (from the engine preset) share.
func (s *Scheduler) SetKVCapacity(backend int, kvTokens int64) {
	s.index.SetCapacity(backend, s.audit.SetBase(backend, int(s.blocksOf(kvTokens))))
	s.noteGPU(backend, kvTokens)
}

// Forget forgets everything the picture holds of backend (it crashed, was
// removed, or restarted with an empty cache): its blocks, and its audit's
// window and verdicts.
func (s *Scheduler) Forget(backend int) {
	s.index.RemoveBackend(backend)
	s.audit.Reset(backend)
	s.resident.forget(backend)
}

// Policy returns the scheduler's policy.
func (s *Scheduler) Policy() policy.Policy { return s.pol.Load().policy }

// active is one policy with what Route derives from it.
type active struct {
	policy   policy.Policy
	observer policy.Observer       // policy as an Observer, or nil
	sessions policy.SessionLearner // policy as a SessionLearner, or nil
	prefix   string                // "policy=<name> ", the constant head of every Reason
}

// SetPolicy makes p the policy of every Route that starts after it returns
// (a configuration reload); routings under way finish with the old one.
// The prefix index and the fleet's accounting carry over.
func (s *Scheduler) SetPolicy(p policy.Policy) {
	a := &active{policy: p, prefix: "policy=" + p.Name() + " "}
	a.observer, _ = p.(policy.Observer)
	a.sessions, _ = p.(policy.SessionLearner)
	s.pol.Store(a)
}

// Assignment is one routing decision and the request's claim on the chosen
// backend's load.
type Assignment struct {
	Backend *fleet.Backend
	// Reason is short and human-readable, e.g.
	// "policy=kvroute prefix=812/1024 est_ttft=0.210s sticky": the policy,
	// the prompt's blocks held by the chosen backend out of its full
	// blocks, the policy's TTFT estimate when it makes one, and its note.
	Reason string
	// MatchedTokens is the predicted prefix-cache hit in tokens.
	MatchedTokens int
	// EstTTFT is the policy's estimate of the time to first token in
	// seconds, 0 when it makes none.
	EstTTFT float64
	// Objective is the request's objectives as routed (none when the
	// scheduler ignores them); Pred the policy's prediction for the
	// chosen backend, and Met whether it was predicted to meet them
	// (slo.go).
	Objective slo.Objective
	Pred      slo.Prediction
	Met       bool
	// Predicted is the prompt tokens the prefix index matched for the
	// chosen backend, as MatchedTokens but also when the audit untrusted
	// its picture; Best the most any candidate held (the cache available
	// elsewhere at decision time).
	Predicted, Best int

	// sched, policy, prompt, routed and age are what Reported needs: the
	// scheduler, the policy's name, the prompt's estimated tokens, the
	// routing's time and how fresh the predicted blocks were in the
	// index; reported is set by its first call. transferred marks a
	// split request's decode leg, whose prompt arrives from the prefill
	// engine: what its engine reports as cached is the transfer, not its
	// cache, and says nothing of the picture.
	sched       *Scheduler
	policy      string
	prompt      int
	routed      time.Time
	age         prefix.Age
	reported    atomic.Bool
	transferred bool

	ticket *fleet.Ticket
	events Events
	id     uint64
	// index and hashes are the prompt's blocks pinned in the prefix index
	// for the chosen backend until Done releases them; nodes are the
	// index's handles for them.
	index    *prefix.Index
	hashes   []uint64
	nodes    []int32
	released atomic.Bool
}

// BlockChars is the prefix block size in characters that Route hashes
// prompts with.
func (s *Scheduler) BlockChars() int { return s.blockCh }

// Route picks a backend for v, skipping the backends whose IDs are in
// exclude (those that already failed this request).
func (s *Scheduler) Route(v *request.View, exclude []int, now time.Time) (*Assignment, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.put(sc)
	return s.route(sc, v, s.Hashes(v), nil, exclude, now)
}

// Hashes returns the block hashes of v's prompt as Route computes them, for
// a caller that routes one prompt more than once (a retry) with
// RouteHashed. The assignment keeps the hashes until Done, so they get a
// slice of their own, of exactly the prompt's full blocks, rather than a
// pooled buffer.
func (s *Scheduler) Hashes(v *request.View) []uint64 {
	return prefix.HashSalted(make([]uint64, 0, len(v.Prompt)/s.blockCh), v.Prompt, s.blockCh, s.Salt(v))
}

// RouteHashed is Route for a caller that has already hashed v.Prompt:
// hashes must be prefix.HashSalted(nil, v.Prompt, s.BlockChars(),
// s.Salt(v)) (Hashes). The simulator
// hashes each prompt once for the router and its engine alike. hashes is
// never modified, and the Assignment keeps it until Done: the caller must
// not change it before then.
func (s *Scheduler) RouteHashed(v *request.View, hashes []uint64, exclude []int, now time.Time) (*Assignment, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.put(sc)
	return s.route(sc, v, hashes, nil, exclude, now)
}

// route is Route with the prompt's hashes given, and its token-block keys
// when it has them (see RoutePrecise).
func (s *Scheduler) route(sc *scratch, v *request.View, hashes, keys []uint64, exclude []int, now time.Time) (*Assignment, error) {
	snap := s.fleet.Snapshot()
	session := policy.HashSession(v.SessionKey)
	if err := s.candidates(sc, snap, v, s.warmKey(v, session, hashes), exclude, now); err != nil {
		return nil, err
	}

	if cap(sc.all) < snap.IDs {
		sc.all = make([]int32, snap.IDs)
	}
	sc.all = sc.all[:snap.IDs]
	s.match(sc, hashes, keys, now)
	s.matchTiers(sc, hashes, keys, now)
	s.untrust(sc)
	s.tokens(sc, v)

	sc.in = policy.Input{
		View:        v,
		Hashes:      hashes,
		BlockChars:  s.blockCh,
		Candidates:  sc.cands,
		Matched:     sc.matched,
		Cached:      sc.cached,
		Uncached:    sc.uncached,
		Extra:       s.score(sc, v),
		Tiers:       sc.ctiers,
		Load:        sc.load,
		Now:         now,
		SessionHash: session,
	}
	if rp := s.replicas.Load(); rp != nil {
		sc.in.Replicas, sc.in.ReplicaArc = rp.n, rp.arc
	}
	sc.in.Replica = s.replicaID.Load()
	if v.Role == "" {
		// A leg of a split request is routed without objectives: its
		// prediction would leave out the other leg and the transfer,
		// and a prefill leg refused would only fall back to the whole
		// request (docs/routing.md, "Objectives").
		sc.in.Objective = v.Objective
	}
	budget := v.MaxTokens
	if budget <= 0 {
		budget = request.DefaultOutputBudget
	}
	act := s.pol.Load()
	// Pick and count are one step: without the lock, a burst of requests
	// would all read the same loads before any of them is counted, and
	// all land on the one backend that looked best (a herd). The lock
	// covers only the pick (no I/O, a few microseconds) and the counters.
	s.decide.Lock()
	s.forgetPresumed(now)
	sc.in.Burst = len(s.presumed) > 0
	d := act.policy.Pick(&sc.in)
	if d.Index < 0 || d.Index >= len(sc.cands) {
		// A policy bug must not take the router down; the first candidate
		// is as good as any when the policy has no answer.
		d.Index = 0
	}
	if d.Shed {
		s.decide.Unlock()
		return nil, shed(sc.in.Objective, d)
	}
	d = s.probe(sc, snap.IDs, d, now)
	b := sc.cands[d.Index]
	blocks := int(sc.matched[d.Index])
	a := &Assignment{
		Backend:       b,
		MatchedTokens: int(sc.cached[d.Index]),
		EstTTFT:       d.EstTTFT,
		Objective:     sc.in.Objective,
		Pred:          d.Pred,
		Met:           d.Met,
		ticket:        b.Start(int64(v.PromptTokens), pendingOf(v, sc.uncached[d.Index]), int64(budget), now),
	}
	if sc.load != nil {
		a.ticket.SetLoad(time.Duration(sc.load[d.Index] * float64(time.Second)))
	}
	s.presume(b, a.ticket.Started(), sc.in.Replicas, now)
	s.routedAdapter(b, v.Model)
	s.decide.Unlock()
	predicted, _ := s.split(v, sc.rawMatch(b.ID))
	best, _ := s.split(v, sc.best)
	a.Predicted, a.Best = int(predicted), int(best)
	a.sched, a.policy, a.prompt, a.routed = s, act.policy.Name(), v.PromptTokens, now
	a.transferred = v.Role == policy.RoleDecodeLeg
	if act.observer != nil {
		act.observer.Routed(&sc.in, d)
	}
	// The blocks stay pinned while the request is in flight there, as the
	// engine cannot evict the blocks of a queued or running request.
	a.nodes, a.age = s.index.AcquireNodesNoWait(b.ID, hashes, int(sc.rawMatch(b.ID)), nil)
	a.index, a.hashes = s.index, hashes
	s.speculate(b.ID, keys, now)
	if s.events != nil {
		a.events, a.id = s.events, s.requests.Add(1)
		s.events.Routed(a.id, b, hashes, claimOf(act.sessions, session, b.ID), a.ticket.Started())
	}

	if !v.Stream && v.MaxTokens != 1 {
		// The first byte of a non-streaming response comes after the whole
		// generation; its delay says nothing of the prefill rate, unless
		// the generation is one token (a split request's prefill leg).
		a.ticket.NoRateSample()
	}
	a.Reason = s.reason(sc, act.prefix, blocks, len(hashes), d, s.matchNote(sc, b.ID), v.Model)
	return a, nil
}

// reason renders "policy=<name> prefix=<matched>/<total>[ est_ttft=<s>s][ match=<precise|approximate>][ adapter=<model> adapter_tier=<tier>][ <note>]",
// the adapter when the adapter stage decided among the candidates
// (policy.AdapterTiers' tiers: loaded, free-slot, ...).
func (s *Scheduler) reason(sc *scratch, head string, matched, total int, d policy.Decision, match, model string) string {
	r := append(sc.reason[:0], head...)
	r = append(r, "prefix="...)
	r = strconv.AppendInt(r, int64(matched), 10)
	r = append(r, '/')
	r = strconv.AppendInt(r, int64(total), 10)
	if d.EstTTFT > 0 {
		r = append(r, " est_ttft="...)
		r = strconv.AppendFloat(r, d.EstTTFT, 'f', 3, 64)
		r = append(r, 's')
	}
	if match != "" {
		r = append(r, " match="...)
		r = append(r, match...)
	}
	if sc.adapterTier != "" {
		r = append(r, " adapter="...)
		r = append(r, model...)
		r = append(r, " adapter_tier="...)
		r = append(r, sc.adapterTier...)
	}
	if d.Note != "" {
		r = append(r, ' ')
		r = append(r, d.Note...)
	}
	sc.reason = r
	return string(r)
}

// put returns sc to the pool without keeping references to the request or
// the fleet alive.
func (s *Scheduler) put(sc *scratch) {
	clear(sc.cands)
	sc.in = policy.Input{}
	s.scratch.Put(sc)
}

func excluded(ids []int, id int) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// FirstByte reports that the first response byte arrived.
func (a *Assignment) FirstByte(now time.Time) {
	if d := a.ticket.FirstByte(now); a.events != nil && !d.IsZero() {
		a.events.Changed(a.id, a.Backend, d)
	}
}

// Decoded reports the stream's tokens after its first and the time they
// took as relayed (fleet.Ticket.Decoded). Call it before Done.
func (a *Assignment) Decoded(tokens int64, span time.Duration, now time.Time) {
	a.ticket.Decoded(tokens, span, now)
}

// Done reports that the request ended (any outcome): its load is released,
// and its blocks in the prefix index become evictable, most recent first.
// Only the first call counts.
func (a *Assignment) Done(now time.Time) {
	if d := a.ticket.Done(now); a.events != nil && !d.IsZero() {
		a.events.Changed(a.id, a.Backend, d)
	}
	if a.index != nil && a.released.CompareAndSwap(false, true) {
		a.index.ReleaseNodesNoWait(a.Backend.ID, a.hashes, a.nodes)
		a.hashes, a.nodes = nil, nil
	}
}

// Uncached is the router's estimate of how many of v's prompt tokens no
// healthy backend serving its model holds: the prompt less the longest
// match among them in the prefix index (approximate). hashes are the
// prompt's blocks as Hashes returns them. The admission queue orders held
// requests by this work (admission.Cost); it changes nothing.
func (s *Scheduler) Uncached(v *request.View, hashes []uint64) int {
	least := int64(max(v.PromptTokens, 0))
	s.Holdings(v, hashes, func(_ *fleet.Backend, _, uncached int64) { least = min(least, uncached) })
	return int(least)
}
