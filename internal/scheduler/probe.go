package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// Probes. A policy that picks by estimates (kvroute) learns each engine's
// speed from the requests it sends there, so an engine whose figure went
// bad (a prefill rate taught during an overload, when every TTFT was
// queueing) is avoided, gets no request, and so never teaches a better
// figure: it is locked out however healthy it is. The probe rule breaks
// that circle. An engine is avoided at now when
//   - it is a candidate for the request (healthy, serving the model, not
//     excluded, admitted by warm-up and the filters),
//   - no request was routed to it for an interval, although the router
//     routed at least as many requests as there are candidates since its
//     last (a fair spread would have given it one of them),
//   - nothing routed to it is in flight (this router's or a peer's), and
//   - its prefill figures, learned and engine-reported alike, have not
//     changed for an interval: its estimate rests on an old reading;
//
// and it was not probed for an interval. The next suitable request then
// goes to it, with the note "probe": a streaming one (only a streamed
// first byte teaches a rate) whose uncached tokens there are at least
// fleet.MinRateWork (the least that teaches) and at most ProbeMaxTokens.
// A probe to an engine that really is slow costs one short prefill
// there; one to a healthy engine teaches its rate from a TTFT measured on
// an idle engine, and the policy routes by that from then on. Among
// several avoided engines, the one avoided longest is probed first.
//
// The rule applies to the picks of a policy that estimates the time to
// first token (policy.Decision.EstTTFT > 0): the baselines and the peers'
// policies route as they are published. It keeps per-backend state
// guarded by Scheduler.decide, and reads time only from the now it is
// given, so that the simulator runs it in virtual time.

// DefaultProbeInterval is how long an engine must have been avoided (and
// its figures unchanged) before a probe, and the least time between two
// probes of one engine: a handful of chances within the half-minute an
// operator watches a dashboard, while an engine that really is slow gets
// at most one short request in five seconds. policy_options.probe_interval
// sets it.
const DefaultProbeInterval = 5 * time.Second

// ProbeMaxTokens bounds a probe's uncached prompt tokens on the probed
// engine: twice the least work that teaches a rate (fleet.MinRateWork),
// so that requests of the smallest teaching size qualify while a probe
// to a slow engine costs the prefill of at most 512 tokens.
const ProbeMaxTokens = 2 * fleet.MinRateWork

// ProbeNote is the Decision note, and so the Reason's last word, of a
// request routed as a probe.
const ProbeNote = "probe"

// probeState is what the probe rule remembers of one backend slot.
type probeState struct {
	// b is the backend the state is of: a slot given to another backend
	// starts afresh.
	b *fleet.Backend
	// routed is the last routing to b (a probe or not) and routedPick its
	// number among the scheduler's picks; probed is the last probe,
	// changed when b's prefill figures were last seen to change.
	routed, probed, changed time.Time
	routedPick              uint64
	// samples is b's cost model's sample count as last seen
	// (fleet.Backend.CostSamples): it changes with every TTFT, relayed
	// stream or engine reading that teaches the model.
	samples int64
}

// probes is the scheduler's probe rule.
type probes struct {
	// every is the interval; 0 turns probes off.
	every time.Duration
	// picks numbers the routings; state is by backend ID. Both are
	// guarded by Scheduler.decide.
	picks uint64
	state []probeState
	total *prometheus.CounterVec
}

func newProbes(every time.Duration) *probes {
	return &probes{
		every: probeEvery(every),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_probes_total",
			Help: "Requests routed to a backend as a probe: the policy had avoided it for policy_options.probe_interval while its estimate rested on an old reading (docs/routing.md, \"Probes\").",
		}, []string{"backend"}),
	}
}

// probeEvery is Config.ProbeInterval as probes.every keeps it.
func probeEvery(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultProbeInterval
	case d < 0:
		return 0
	}
	return d
}

// SetProbeInterval changes the probe rule's interval as
// Config.ProbeInterval sets it (a configuration reload).
func (s *Scheduler) SetProbeInterval(d time.Duration) {
	s.decide.Lock()
	defer s.decide.Unlock()
	s.probes.every = probeEvery(d)
}

// Collector is the probe metrics (kvroute_probes_total), for the router's
// registry.
func (s *Scheduler) Collector() prometheus.Collector { return s.probes.total }

// probe applies the probe rule to the policy's decision d for the request
// in sc at now, and records the routing. It returns d, or the probe that
// replaces it. The caller holds s.decide.
//
// Only a request that could probe looks at the other candidates, and
// only at those where it would teach a rate: the rule adds nothing to
// the pick of the rest. A candidate's state is brought up to date when it
// is looked at, so a change of its figures is noticed at the next
// request that could probe it.
func (s *Scheduler) probe(sc *scratch, ids int, d policy.Decision, now time.Time) policy.Decision {
	p := s.probes
	if p.every <= 0 {
		return d
	}
	if len(p.state) < ids {
		p.state = append(p.state, make([]probeState, ids-len(p.state))...)
	}
	p.picks++
	if d.EstTTFT > 0 && sc.in.View.Stream {
		pick := -1
		for i, b := range sc.cands {
			if i == d.Index || !teaches(sc.uncached[i]) {
				continue
			}
			if st := p.see(b, now); p.avoided(st, len(sc.cands), now) && (pick < 0 || st.routed.Before(p.state[sc.cands[pick].ID].routed)) {
				pick = i
			}
		}
		if pick >= 0 {
			b := sc.cands[pick]
			p.state[b.ID].probed = now
			p.total.WithLabelValues(b.Name).Inc()
			d = policy.Decision{Index: pick, Note: ProbeNote}
		}
	}
	st := p.see(sc.cands[d.Index], now)
	st.routed, st.routedPick = now, p.picks
	return d
}

// see returns b's state, with its prefill figures' latest change noted.
// A backend new to its slot starts as if routed to by the previous pick:
// a newcomer is not avoided.
func (p *probes) see(b *fleet.Backend, now time.Time) *probeState {
	st := &p.state[b.ID]
	samples := b.CostSamples()
	if st.b != b {
		*st = probeState{b: b, routed: now, routedPick: p.picks - 1, changed: now, samples: samples}
	}
	if samples != st.samples {
		st.samples, st.changed = samples, now
	}
	return st
}

// avoided reports whether the backend of st is avoided at now among n
// candidates (see the rule above): passed over for at least n routings
// (those of the router's requests since its last, this one's before it),
// and the intervals passed.
func (p *probes) avoided(st *probeState, n int, now time.Time) bool {
	return p.picks-st.routedPick-1 >= uint64(n) && now.Sub(st.routed) >= p.every && now.Sub(st.changed) >= p.every &&
		now.Sub(st.probed) >= p.every && st.b.KnownLoad().InFlight == 0
}

// teaches reports whether a probe with uncached prompt tokens not cached
// on the probed engine is suitable: a prefill that teaches a rate and is
// short. (The request must also be streamed: only a streamed first byte
// teaches.)
func teaches(uncached int64) bool {
	return uncached >= fleet.MinRateWork && uncached <= ProbeMaxTokens
}
