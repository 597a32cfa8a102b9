package policy

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// LoRA adapters. A request whose model is a LoRA adapter runs well only
// where the adapter is in the batch already or can join it: an engine
// whose adapter slots are all taken by other adapters' requests holds it
// back until one of them leaves (vLLM's --max-loras), and one that must
// load it pays the load in a step of its batch. AdapterTiers is the stage
// that narrows the candidates to the engines that would not hold such a
// request back, before the policy's own pick weighs load and prefix as
// for any request; the scheduler runs it for a policy that implements
// AdapterAffinity (scheduler/lora.go).

// AdapterAffinity is implemented by a policy that wants the scheduler's
// adapter stage (AdapterTiers) before its pick, and its prefix hashes
// salted with the adapter.
type AdapterAffinity interface {
	AdapterAffinity() bool
}

// LoRA affinity scores, as llm-d's lora-affinity-scorer gives them
// (gateway-api-inference-extension, pkg/epp/scheduling/framework/plugins/
// scorer/lora_affinity.go).
const (
	LoRAScoreRunning = 1.0 // the adapter is in the engine's batch
	LoRAScoreFree    = 0.8 // the engine can take one more adapter
	LoRAScoreWaiting = 0.6 // the adapter's requests wait there already
	LoRAScoreFull    = 0.0 // taken by others: the request would wait
)

// LoRAScore scores an engine's report l for a request of adapter as
// llm-d's scorer does: running, then a free slot (running plus waiting
// adapters below the cap), then waiting, else full. An engine that names
// no adapters (SGLang's counts) scores by its free slots alone.
func LoRAScore(l *fleet.LoRAState, adapter string) float64 {
	switch {
	case l.HasRunning(adapter):
		return LoRAScoreRunning
	case l.Free():
		return LoRAScoreFree
	case l.HasWaiting(adapter):
		return LoRAScoreWaiting
	}
	return LoRAScoreFull
}

// AdapterSpill is how far above the candidates' mean in-flight count the
// least loaded engine running an adapter may be before the adapter's
// requests also go to an engine with a free slot (and so load it there).
var AdapterSpill = 1.5

// AdapterTiers narrows cands, in place and in order, for a request of
// adapter at now, and returns them with the name of the tier kept (below;
// "" when no report tells the engines apart and all are kept). Each engine is in one class by its
// last fresh report: running the adapter, a free slot (or no report:
// nothing against it), the adapter's requests waiting there, or full. The
// tier kept, the first that applies:
//
//  1. the engines running it, while the least loaded of them has at most
//     AdapterSpill times the candidates' mean in-flight count (plus one):
//     an adapter in demand stays on as few engines as its load needs, so
//     that the others keep their slots for the rest;
//  2. those and the engines with a free slot (a load, no wait); else those
//     and the engines whose slots hold only idle adapters (a load that
//     evicts one, no wait);
//  3. those and the engines where its requests wait already (one wait
//     for a slot, not one on each engine);
//  4. those running it, however loaded: elsewhere it would wait;
//  5. the full engines with the fewest other adapters waiting for a slot
//     (the shortest queue for one);
//  6. all of them.
//
// The policy's pick then weighs load and prefix among the engines kept,
// as for any request. A report older than EngineStateMaxAge counts as
// none.
//
// resident, when not nil, gives the adapters the router sent each engine
// last, most recent first (the scheduler's picture of the adapters the
// engine keeps loaded; scheduler/lora.go). An engine reports only the
// adapters of the requests it runs or holds at the time of a scrape, so
// between two requests an adapter it has just served, and keeps loaded,
// is absent from its report, and the engine reads as a free slot to every
// other adapter: with short requests, four engines of --max-loras 2 each
// served 3.75 of 8 adapters. So an adapter among the first max_lora of an
// engine's resident ones counts as running there, and an engine whose
// resident adapters fill its max_lora has no free slot, whatever its
// batch holds at the moment: it comes after the engines with a free slot,
// as one that would evict an idle adapter to load this one (tier 2b).
func AdapterTiers(cands []*fleet.Backend, adapter string, now time.Time, resident func(b *fleet.Backend) []string) ([]*fleet.Backend, string) {
	const (
		full = iota
		waiting
		evictable
		free
		running
	)
	var reports [8]*fleet.LoRAState // most fleets: no allocation
	var held [8][]string
	lora, res := reports[:0], held[:0]
	for _, b := range cands {
		var l *fleet.LoRAState
		if e := freshEngine(b, now); e != nil {
			l = e.LoRA
		}
		lora = append(lora, l)
		var r []string
		if resident != nil && l != nil && l.Max > 0 {
			r = resident(b)
			r = r[:min(len(r), l.Max)]
		}
		res = append(res, r)
	}
	class := func(i int) int {
		l := lora[i]
		switch {
		case l == nil:
			return free
		case l.HasRunning(adapter) || slices.Contains(res[i], adapter):
			return running
		case l.Free() && len(res[i]) < l.Max:
			return free
		case l.Free():
			return evictable
		case l.HasWaiting(adapter):
			return waiting
		}
		return full
	}
	queue := func(i int) int { return len(lora[i].Waiting) } // full engines only
	var total, minRunning int64 = 0, -1
	minQueue := -1
	has := [running + 1]bool{}
	for i, b := range cands {
		c := class(i)
		has[c] = true
		n := b.Load().InFlight
		total += n
		if c == running && (minRunning < 0 || n < minRunning) {
			minRunning = n
		}
		if c == full && (minQueue < 0 || queue(i) < minQueue) {
			minQueue = queue(i)
		}
	}
	mean := float64(total) / float64(len(cands))
	var keep func(i, c int) bool
	var tier string
	switch {
	case has[running] && float64(minRunning) <= AdapterSpill*mean+1:
		keep, tier = func(_, c int) bool { return c == running }, TierLoaded
	case has[free]:
		keep, tier = func(_, c int) bool { return c == running || c == free }, TierFreeSlot
	case has[evictable]:
		keep, tier = func(_, c int) bool { return c == running || c == evictable }, TierEvictIdle
	case has[waiting]:
		keep, tier = func(_, c int) bool { return c == running || c == waiting }, TierWaiting
	case has[running]:
		keep, tier = func(_, c int) bool { return c == running }, TierLoadedBusy
	case has[full]:
		keep, tier = func(i, c int) bool { return c == full && queue(i) == minQueue }, TierShortestQueue
	default:
		return cands, ""
	}
	n := 0
	for i, b := range cands {
		if keep(i, class(i)) {
			cands[n] = b
			n++
		}
	}
	return cands[:n], tier
}

// The tiers of AdapterTiers, as a routing decision's reason names them.
const (
	TierLoaded        = "loaded"         // 1: the engines running it
	TierFreeSlot      = "free-slot"      // 2: those and the engines with a free slot
	TierEvictIdle     = "evict-idle"     // 2b: those and the engines with only idle adapters
	TierWaiting       = "waiting"        // 3: those and the engines where its requests wait
	TierLoadedBusy    = "loaded-busy"    // 4: the engines running it, however loaded
	TierShortestQueue = "shortest-queue" // 5: the full engines with the fewest adapters waiting
)

// AdapterAffinity implements AdapterAffinity: kvroute routes an adapter's
// requests through AdapterTiers.
func (*KVRoute) AdapterAffinity() bool { return true }

func init() {
	register("kvroute-lora-blind", func(o Options) Policy { return &LoRABlind{k: NewKVRoute(o)} })
}

// LoRABlind is kvroute without its adapter stage: an adapter's requests
// are weighed as the base model's, and their prefixes hashed unsalted, as
// a router that does not know adapters exist would. The baseline of the
// LoRA benchmark.
type LoRABlind struct{ k *KVRoute }

// Name implements Policy.
func (*LoRABlind) Name() string { return "kvroute-lora-blind" }

// Pick implements Policy.
func (p *LoRABlind) Pick(in *Input) Decision { return p.k.Pick(in) }

// Routed implements Observer.
func (p *LoRABlind) Routed(in *Input, d Decision) { p.k.Routed(in, d) }

// LearnSession implements SessionLearner.
func (p *LoRABlind) LearnSession(c Claim, id int) { p.k.LearnSession(c, id) }

// SessionOf implements SessionLearner.
func (p *LoRABlind) SessionOf(h uint64) (int, Claim) { return p.k.SessionOf(h) }

var (
	_ AdapterAffinity = (*KVRoute)(nil)
	_ Policy          = (*LoRABlind)(nil)
	_ Observer        = (*LoRABlind)(nil)
	_ SessionLearner  = (*LoRABlind)(nil)
)

// AdapterBlind is implemented by a policy that must not know adapters: the
// scheduler neither salts its prefix hashes with the adapter nor runs its
// adapter stage.
type AdapterBlind interface {
	AdapterBlind()
}

// AdapterBlind implements AdapterBlind.
func (*LoRABlind) AdapterBlind() {}

var _ AdapterBlind = (*LoRABlind)(nil)
