package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Prefill/decode disaggregation (Config.Roles with a prefill engine). A
// request is split or served whole as the decider says (Config.Split:
// disagg.Decider, as kvroute serve's proxy asks it); a split one is
// given its legs by disagg.Legs and routed leg by leg through the same
// scheduler with the disagg.Roles filter, each on its leg's View, as the
// live lifecycle routes them: both at arrival, the prefill leg first (and
// skipped when no prefill engine can take it). The prefill leg runs on its
// engine with one output token (vLLM's max_tokens 1); when it ends, its
// assignment is done and the decode leg is queued on its engine as a
// remote prefill (engine.Request.RemotePrefill): the decode engine
// allocates the prompt's blocks, waits the transfer of those it does not
// hold, and decodes. A whole request is routed as any other (Roles sends
// it to a both engine, else a decode one).

// The values of Config.Split, the router's (disaggregation.split).
const (
	// SplitConditional splits a request when the decider says so: the
	// policy's own (policy.PairDecider), else kvroute's (disagg.Decide).
	SplitConditional = config.SplitConditional
	// SplitAlways splits every request that a prefill engine can take.
	SplitAlways = config.SplitAlways
)

// XPYD returns the roles of a fleet of n engines of which the first
// prefill are prefill engines, the next decode decode engines, and the
// rest both; nil when prefill is 0 (an aggregated fleet).
func XPYD(n, prefill, decode int) ([]string, error) {
	if prefill < 0 || decode < 0 {
		return nil, fmt.Errorf("--prefill and --decode must not be negative")
	}
	if prefill == 0 {
		if decode > 0 {
			return nil, fmt.Errorf("--decode %d without --prefill: a fleet with decode engines needs prefill engines", decode)
		}
		return nil, nil
	}
	if prefill+decode > n {
		return nil, fmt.Errorf("--prefill %d and --decode %d are more than the %d engines", prefill, decode, n)
	}
	if decode == 0 && prefill == n {
		return nil, fmt.Errorf("--prefill %d leaves no engine to decode", prefill)
	}
	roles := make([]string, n)
	for i := range roles {
		switch {
		case i < prefill:
			roles[i] = config.RolePrefill
		case i < prefill+decode:
			roles[i] = config.RoleDecode
		default:
			roles[i] = config.RoleBoth
		}
	}
	return roles, nil
}

// pdState is a disaggregated run's: the roles by backend ID, what the
// decider weighs (the role filter, the transfer costs) and the legs'
// figures.
type pdState struct {
	roles  []string
	always bool
	costs  disagg.Costs
	filter disagg.Roles
	// The split requests' legs (report.PDRun).
	split                      int
	prefill, transfer, decodeT []time.Duration
}

// leg is a split request's state between its legs, carried by its prefill
// flight.
type leg struct {
	dec  *scheduler.Assignment
	v    *request.View
	at   time.Duration // the prefill leg's end
	pre  *flight       // the prefill leg's flight, for the sample
	hash []uint64
}

// setupPD makes the run's fleet disaggregated when its config has roles:
// the role filter in the scheduler's config, the decider.
func (s *sim) setupPD() error {
	roles := s.cfg.Roles
	if roles == nil || !slices.Contains(roles, config.RolePrefill) {
		return nil
	}
	if len(roles) != len(s.cfg.Engines) {
		return fmt.Errorf("sim: %d roles for %d engines", len(roles), len(s.cfg.Engines))
	}
	if s.cfg.Replicas > 1 || s.cfg.Hold != nil || s.cfg.KVEvents != nil {
		return fmt.Errorf("sim: prefill/decode disaggregation with replicas, late binding or KV events is not modelled")
	}
	pd := &pdState{roles: roles, always: s.cfg.Split == SplitAlways}
	pd.filter = disagg.Roles{Of: func(b *fleet.Backend) string { return pd.roles[b.ID] }}
	for i, r := range roles {
		if r == config.RoleDecode {
			p := s.cfg.Engines[i]
			pd.costs = disagg.Costs{TransferLatency: p.KVTransferLatency, TransferPerToken: p.KVTransferPerToken}
			break
		}
	}
	s.pd = pd
	s.cfg.Scheduler.Filters = append(slices.Clip(s.cfg.Scheduler.Filters), pd.filter)
	return nil
}

// splits reports whether request v is split: the decider's answer
// (disagg.Decider, the one kvroute serve asks: the policy's own decision
// when it has one, else disagg.Decide), every request under SplitAlways.
func (s *sim) splits(v *request.View, hashes []uint64) bool {
	pd := s.pd
	if pd.always {
		return true
	}
	if hashes == nil {
		hashes = s.sched.Hashes(v)
	}
	d := disagg.Decider{Sched: s.sched, Roles: pd.filter, Costs: pd.costs}
	return d.Split(v, hashes, Epoch.Add(s.now)).Split
}

// bindPD routes the k-th request of a disaggregated run: whole, or its
// two legs.
func (s *sim) bindPD(k int, v *request.View, hashes []uint64) {
	if !s.splits(v, hashes) {
		s.bindOne(k, v, hashes)
		return
	}
	legs := disagg.Legs(v, config.ProtocolVLLM, disagg.Transfer{})
	pre, dec := legs[0].View, legs[1].View
	pa, err := s.route(s.sched, pre, hashes, nil)
	if err != nil {
		// The prefill leg is optional: the decode engine serves it whole.
		pa = nil
	}
	da, err := s.route(s.sched, dec, hashes, nil)
	if err != nil {
		if pa != nil {
			pa.Done(Epoch.Add(s.now))
		}
		s.fail(k, v.PromptTokens, 0, err.Error())
		return
	}
	if pa == nil {
		s.nodes[da.Backend.ID].routed++
		s.queue(k, v, hashes, da, da.Backend.ID)
		return
	}
	s.nodes[pa.Backend.ID].routed++
	l := &leg{dec: da, v: v, hash: hashes}
	f := s.queueOne(k, pre, hashes, pa, pa.Backend.ID, func(f *flight) {
		// vLLM's prefill leg: max_tokens 1, one token computed.
		f.SetOutput(1, 0, false, s.nodes[pa.Backend.ID].eng.Preset().MaxModelLen)
		f.leg, f.prefill = l, true
		f.HoldKV = true // kept for the decode engine to read
	})
	if f == nil {
		da.Done(Epoch.Add(s.now))
	}
}

// prefilled queues the decode leg of a split request whose prefill
// flight f has ended, on the decode engine its leg was routed to.
func (s *sim) prefilled(f *flight) {
	l := f.leg
	l.at, l.pre = s.now, f
	d := l.dec.Backend.ID
	s.nodes[d].routed++
	s.queueOne(f.k, l.v, l.hash, l.dec, d, func(g *flight) {
		g.leg, g.arrival, g.oracle = l, f.arrival, f.oracle
		g.RemotePrefill = true
	})
	s.kick(d)
}

// received releases the prefill engine's hold on the blocks of a split
// request whose decode flight f has its first token: the decode engine
// has read them.
func (s *sim) received(f *flight) {
	pre := f.leg.pre
	if pre == nil {
		return
	}
	i := int(pre.backend)
	s.nodes[i].eng.ReleaseKV(&pre.Request)
	n := &s.nodes[i]
	if !n.busy {
		// The freed blocks may let a waiting request in.
		n.busy = true
		s.push(s.now, evStepStart, i)
	}
}

// recordLegs notes the legs' times of a split request whose decode flight
// f has finished, and sets its sample's prefix figures to the prefill
// leg's (the prompt computed there).
func (s *sim) recordLegs(f *flight, smp *report.Sample) {
	l := f.leg
	pd := s.pd
	pd.split++
	pd.prefill = append(pd.prefill, l.at-f.arrival)
	pd.decodeT = append(pd.decodeT, f.first-l.at)
	pd.transfer = append(pd.transfer, f.KVReadyAt-f.Arrival)
	smp.CachedTokens = l.pre.CachedTokens
	smp.MatchedTokens = l.pre.a.MatchedTokens
	smp.Queued = l.pre.ScheduledAt - l.pre.Arrival
	smp.Route = l.pre.a.Reason + " | " + f.a.Reason
}

// pdResult adds the legs' figures to run.
func (s *sim) pdResult(run *report.Run) {
	if s.pd == nil {
		return
	}
	pd := s.pd
	run.PD = report.SummarizePD(run.Completed, pd.split, pd.prefill, pd.transfer, pd.decodeT)
}

// kick has node i stepped at the engine's next transfer completion (or
// hold timeout) when it is idle until then.
func (s *sim) kick(i int) {
	n := &s.nodes[i]
	if n.busy {
		return
	}
	if at, ok := n.eng.Wake(); ok && (n.wakeAt == 0 || at < n.wakeAt) {
		n.wakeAt = max(at, s.now)
		s.push(n.wakeAt, evWake, i)
	}
}

// wake steps node i at the evWake due at at, unless a step runs already
// (an arrival started one) or a later kick moved it.
func (s *sim) wake(i int, at time.Duration) {
	n := &s.nodes[i]
	if n.wakeAt != at {
		return
	}
	n.wakeAt = 0
	if n.busy {
		return
	}
	n.busy = true
	s.stepStart(i)
}
