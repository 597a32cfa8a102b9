package proxy

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
)

// split gives a completion its prefill and decode legs when the live fleet
// has a prefill engine for its model (backends[].role, or a Kubernetes
// pod's kvroute.io/role label: fleetRoles) and an engine to decode it;
// otherwise it keeps its one leg. A model with prefill engines and none
// to decode it is served whole (a discovered pool can be left so; a
// configuration cannot), counted and logged.
func (s *Server) split(ex *exchange) {
	if s.splitProto == "" {
		return
	}
	switch s.fleetRoles(ex.View.Model) {
	case noPrefill:
		return
	case noDecode:
		ex.Whole = wholeNoDecode
		s.metrics.pd.requests.WithLabelValues(ex.Model, pdNoDecode).Inc()
		s.warnNoDecode(ex.View.Model)
		return
	}
	if s.decider != nil {
		if ch := s.decider.Split(ex.View, ex.Hashes, time.Now()); !ch.Split {
			ex.Whole = wholeWhy(ch)
			s.metrics.pd.requests.WithLabelValues(ex.Model, pdDecidedWhole).Inc()
			return
		}
	}
	if legs := disagg.Legs(ex.View, s.splitProto, s.transfer); legs != nil {
		ex.SetLegs(legs...)
	}
}

// wholeWhy is the Whole of a request the conditional split serves whole:
// why, and the two estimates it compared (the whole TTFT plus the stall
// of the whole engine's streams, the split TTFT).
func wholeWhy(ch disagg.Choice) string {
	var why string
	switch ch.Reason {
	case "short":
		why = "not worth a transfer"
	case "prefill-busy":
		why = "prefill engines busier"
	case "no-prefill":
		return "no prefill engine can take it"
	case "policy":
		return "the policy's own split decision"
	default:
		why = ch.Reason
	}
	return fmt.Sprintf("%s: whole %s <= split %s", why, seconds(ch.WholeCost), seconds(ch.SplitCost))
}

// seconds is s seconds as a duration rounded to 10 µs.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond)
}

// bind gives a routed SGLang request's legs their body (the prefill
// engine named in it, a fresh bootstrap room): the lifecycle's Bind, after
// routing and each time it sends the pair again; nothing for other
// requests.
func (s *Server) bind(r *lifecycle.Request) {
	if s.splitProto == config.ProtocolSGLang {
		disagg.Bootstrap(r.Legs, r.Body, s.cfg.Disaggregation.BootstrapPort)
	}
}

// What the live fleet has for a model (fleetRoles).
const (
	noPrefill = iota // no prefill engine: not split
	noDecode         // prefill engines, none to decode: served whole
	splittable
)

// wholeNoDecode is the Whole of a request served whole for want of a
// decode engine.
const wholeNoDecode = "no decode engine for the model"

// fleetRoles is what the live fleet has for model: a prefill engine
// serving it (its role is its entry's, a pod's label for a Kubernetes
// pool), and an engine to decode it (a decode or both engine serving
// it), among the engines that may take new requests (healthy, not
// draining: an ejected engine counts for nothing). It reads the fleet's
// snapshot, never blocks.
func (s *Server) fleetRoles(model string) int {
	var prefill, decode bool
	for _, b := range s.fleet.Snapshot().Healthy {
		if !b.Serves(model) {
			continue
		}
		if s.set.RoleOf(b) == config.RolePrefill {
			prefill = true
		} else {
			decode = true
		}
	}
	switch {
	case !prefill:
		return noPrefill
	case !decode:
		return noDecode
	}
	return splittable
}

// warnNoDecode logs, at most once a minute, that model's requests are
// served whole for want of a decode engine.
func (s *Server) warnNoDecode(model string) {
	now := time.Now().UnixNano()
	last := s.noDecodeWarned.Load()
	if now-last < int64(time.Minute) || !s.noDecodeWarned.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("prefill engines serve a model no decode engine serves: its requests are served whole (kvroute_pd_requests_total{outcome=\"no_decode_engine\"})",
		"model", model)
}

// The outcomes of kvroute_pd_requests_total.
const (
	pdSplit          = "split"            // both legs ran
	pdPrefillFailed  = "prefill_failed"   // the prefill leg failed on every attempt: served whole
	pdPrefillNoRoute = "prefill_unrouted" // no prefill engine could take it: served whole
	pdNoDecode       = "no_decode_engine" // not split: nothing to decode it
	pdDecidedWhole   = "decided_whole"    // not split: the conditional split serves it whole
	pdUnusable       = "prefill_unusable" // the prefill answer's parameters were refused: served whole
)

// pdMetrics are the metrics of prefill/decode disaggregation: what became
// of the requests that could be split, and each leg's timing
// (lifecycle.LegTimes). They are families of their own rather than a leg
// label on kvroute_ttft_seconds and kvroute_e2e_seconds: a prefill leg's
// time and a transfer wait are other intervals than a TTFT, and a label
// would change the meaning of every existing query over those families.
type pdMetrics struct {
	requests                  *prometheus.CounterVec
	prefill, wait, decodeTTFT *prometheus.HistogramVec
}

func newPDMetrics(reg prometheus.Registerer) pdMetrics {
	buckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := pdMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_pd_requests_total",
			Help: "Requests to a fleet with prefill engines for their model, by model and outcome: split (both legs ran), prefill_failed and prefill_unrouted (served whole by the decode engine after the prefill leg failed on every attempt, or found no prefill engine), prefill_unusable (served whole by the decode engine: the prefill answer's transfer parameters were refused), no_decode_engine (served whole: no engine to decode the model), decided_whole (served whole: the conditional split found the whole request cheaper, the most common outcome under split: conditional).",
		}, []string{"model", "outcome"}),
		prefill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_pd_prefill_seconds",
			Help:    "Time of a split request's prefill leg on its prefill engine (backend), from its first sending to the end of its answer, retries included.",
			Buckets: buckets,
		}, []string{"backend", "model"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_pd_transfer_wait_seconds",
			Help:    "A split streaming request's decode leg's first byte less the end of its prefill leg, by decode engine (backend): the decode engine's wait for the prompt's KV cache plus its first step.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"backend", "model"}),
		decodeTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_pd_decode_ttft_seconds",
			Help:    "A split streaming request's decode leg's time from its first sending to its first byte, by decode engine (backend), retries included.",
			Buckets: buckets,
		}, []string{"backend", "model"}),
	}
	reg.MustRegister(m.requests, m.prefill, m.wait, m.decodeTTFT)
	return m
}

// families are the families labelled backend, whose series a backend that
// leaves takes with it.
func (m *pdMetrics) families() []members.Family {
	return []members.Family{m.prefill, m.wait, m.decodeTTFT}
}

// observe counts a settled split request and observes its legs' timings
// (the lifecycle's Split). A request whose decode leg was never routed is
// counted as the router's answer (kvroute_requests_total), not here.
func (m *pdMetrics) observe(r *lifecycle.Request, t lifecycle.LegTimes) {
	pre, dec := &r.Legs[0], &r.Legs[len(r.Legs)-1]
	if dec.A == nil {
		return
	}
	outcome := pdSplit
	switch {
	case pre.A == nil:
		outcome = pdPrefillNoRoute
	case pre.Skipped():
		outcome = pdPrefillFailed
	case dec.Whole != "":
		outcome = pdUnusable
	}
	m.requests.WithLabelValues(r.Model, outcome).Inc()
	if t.HasPrefill {
		m.prefill.WithLabelValues(pre.Target.B.Name, r.Model).Observe(t.Prefill.Seconds())
	}
	if t.HasTransferWait {
		m.wait.WithLabelValues(dec.Target.B.Name, r.Model).Observe(t.TransferWait.Seconds())
	}
	if t.HasDecodeTTFT {
		m.decodeTTFT.WithLabelValues(dec.Target.B.Name, r.Model).Observe(t.DecodeTTFT.Seconds())
	}
}
