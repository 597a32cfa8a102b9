package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
)

// split gives a completion its prefill and decode legs when the split
// decision (disagg.Splitter, which every front asks) splits it; otherwise
// it keeps its one leg, and a request served whole for want of a decode
// engine or by the conditional split is counted (and the first logged).
func (s *Server) split(ex *exchange) {
	plan := s.splitter.Split(ex.View, ex.Hashes, time.Now())
	s.applyPlan(&ex.Request, plan)
}

// applyPlan gives r the legs of plan, or its Whole, counted: the HTTP
// front's and the external processor's one step after the split decision.
func (s *Server) applyPlan(r *lifecycle.Request, plan disagg.Plan) {
	if plan.Legs != nil {
		r.SetLegs(plan.Legs...)
		return
	}
	if plan.Outcome == "" {
		return
	}
	r.Whole = plan.Whole
	s.metrics.pd.requests.WithLabelValues(r.Model, plan.Outcome).Inc()
	if plan.Outcome == disagg.OutcomeNoDecode {
		s.warnNoDecode(r.View.Model)
	}
}

// bind gives a routed SGLang request's legs their body (the prefill
// engine named in it, a fresh bootstrap room): the lifecycle's Bind, after
// routing and each time it sends the pair again; nothing for other
// requests.
func (s *Server) bind(r *lifecycle.Request) {
	if s.splitter.Protocol == config.ProtocolSGLang {
		disagg.Bootstrap(r.Legs, r.Body, s.cfg.Disaggregation.BootstrapPort)
	}
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
