package proxy

import (
	"crypto/sha256"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/slo"
)

// objectives are the configured default objectives (config's objectives
// section), swapped with the credentials on a reload.
type objectives struct {
	defaults slo.Defaults
	// keys are the API keys' defaults by digest.
	keys map[[sha256.Size]byte]slo.Objective
}

// newObjectives reads the objectives section.
func newObjectives(c config.Objectives) (*objectives, error) {
	o := &objectives{defaults: slo.Defaults{Models: map[string]slo.Objective{}, Objectives: map[string]int{}},
		keys: map[[sha256.Size]byte]slo.Objective{}}
	for _, m := range c.Models {
		o.defaults.Models[strings.TrimSpace(m.Model)] = slo.Objective{TTFT: m.TTFT, ITL: m.ITL}
	}
	for _, io := range c.InferenceObjectives {
		o.defaults.Objectives[strings.TrimSpace(io.Name)] = io.Priority
	}
	kd, err := c.KeyDigests()
	if err != nil {
		return nil, err
	}
	for d, k := range kd {
		class, err := slo.ParseClass(k.Criticality)
		if err != nil {
			return nil, err
		}
		o.keys[d] = slo.Objective{TTFT: k.TTFT, ITL: k.ITL, Class: class}
	}
	return o, nil
}

// objectiveOf reads r's objectives (slo.Defaults.Resolve) for a request
// of model: its headers over its API key's defaults over its model's; its
// criticality header trusted as its priority is (priorities: from a
// trusted front, and from anyone when it only lowers the request's
// standing). A malformed header is a 400.
func (s *Server) objectiveOf(r *http.Request, model string) (slo.Objective, *openai.Error) {
	c := s.creds.Load()
	src := slo.Source{Model: model}
	if len(c.objectives.keys) > 0 {
		if tok, ok := openai.ClientKey(r.Header); ok {
			src.Tenant = c.objectives.keys[sha256.Sum256([]byte(tok))]
		}
	}
	if len(c.prio.fronts) > 0 && r.Header.Get(slo.HeaderClass) != "" {
		src.FromFront = c.prio.fromFront(r.RemoteAddr)
	}
	return c.objectives.defaults.Resolve(r.Header, src)
}

// sloMetrics are the kvroute_slo_* families: what the requests with
// objectives attained, by model and criticality, the requests shed, and
// the prediction's error.
type sloMetrics struct {
	requests, met, goodTokens, shed *prometheus.CounterVec
	ratio                           *prometheus.HistogramVec
}

func newSLOMetrics(reg prometheus.Registerer) sloMetrics {
	m := sloMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_slo_requests_total",
			Help: "Requests with latency objectives that were served or refused, by model and criticality.",
		}, []string{"model", "criticality"}),
		met: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_slo_met_total",
			Help: "Served requests within their objectives, by model, criticality and objective (ttft, itl, both); rate(both) is the goodput in requests per second.",
		}, []string{"model", "criticality", "objective"}),
		goodTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_slo_goodput_tokens_total",
			Help: "Output tokens of the requests within both their objectives: its rate is the goodput in tokens per second.",
		}, []string{"model", "criticality"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_slo_shed_total",
			Help: "Sheddable requests refused at once (429) because no backend was predicted to meet their objectives.",
		}, []string{"model", "criticality"}),
		ratio: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_slo_prediction_ratio",
			Help:    "Observed over predicted latency of the requests with objectives, by backend and latency (ttft, itl): the prediction's error.",
			Buckets: []float64{0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5},
		}, []string{"backend", "latency"}),
	}
	reg.MustRegister(m.requests, m.met, m.goodTokens, m.shed, m.ratio)
	return m
}

// record records what a settled request with objectives attained
// (lifecycle.Attainment, whatever front carried it: Plane.Attained): its
// attainment and its prediction's error, or its shedding.
func (m *sloMetrics) record(a lifecycle.Attainment) {
	class := a.Class.String()
	m.requests.WithLabelValues(a.Model, class).Inc()
	switch {
	case a.Shed:
		m.shed.WithLabelValues(a.Model, class).Inc()
		return
	case !a.Judged:
		return
	}
	if a.Met.TTFT {
		m.met.WithLabelValues(a.Model, class, "ttft").Inc()
	}
	if a.Met.ITL {
		m.met.WithLabelValues(a.Model, class, "itl").Inc()
	}
	if a.Met.Both() {
		m.met.WithLabelValues(a.Model, class, "both").Inc()
		m.goodTokens.WithLabelValues(a.Model, class).Add(float64(a.Goodput))
	}
	if a.TTFTRatio > 0 {
		m.ratio.WithLabelValues(a.Backend, "ttft").Observe(a.TTFTRatio)
	}
	if a.ITLRatio > 0 {
		m.ratio.WithLabelValues(a.Backend, "itl").Observe(a.ITLRatio)
	}
}
