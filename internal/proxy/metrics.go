package proxy

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/version"
)

// policyName is the policy label of kvroute_requests_total: the policy
// routing new requests now, so that a reload that changes it shows.
func (s *Server) policyName() string { return s.sched.Policy().Name() }

// noBackend is the backend label of requests the router answered itself.
const noBackend = "none"

// Metrics are the router's Prometheus metrics, in a registry of their own
// so that several routers can live in one process (tests, compare): the
// data plane's families, the fleet's gauges and the process's. The other
// parts of the router register theirs in Registry.
type Metrics struct {
	reg *prometheus.Registry

	requests       *prometheus.CounterVec
	ttft, e2e, itl *prometheus.HistogramVec
	// tokensIn and tokensOut count the served requests' tokens.
	tokensIn, tokensOut *prometheus.CounterVec
	prefixHit           prometheus.Counter
	promptTokens        prometheus.Counter
	retries             prometheus.Counter
	ejections           *prometheus.CounterVec
	upstreamErrors      *prometheus.CounterVec
	// bodyBudgetRejects counts bodies refused for limits.max_buffered_bytes.
	bodyBudgetRejects prometheus.Counter
	// pd are the prefill/decode disaggregation's (disagg.go).
	pd pdMetrics
	// mig are the moved streams' (migrate.go).
	mig migrationMetrics
	// slo are the latency objectives' (objectives.go).
	slo sloMetrics
}

// NewMetrics returns the router's metrics over f, in a new registry.
func NewMetrics(f *fleet.Fleet) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_requests_total",
			Help: "Requests by the backend that answered (\"none\" when the router did), policy, model (a model the fleet serves, \"other\", or \"\" when the request named none) and HTTP status (499: the client went away first).",
		}, []string{"backend", "policy", "model", "status"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_ttft_seconds",
			Help:    "Router-observed time from receiving a streaming request to the first response body byte of a 2xx response, retries included (a JSON answer's first byte comes with its last: see kvroute_e2e_seconds).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"backend", "model"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_e2e_seconds",
			Help:    "Router-observed time from receiving a completion request to the end of its response.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"backend", "model"}),
		// vLLM's vllm:inter_token_latency_seconds, seen from the router:
		// chunks that arrive together have a gap near zero.
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_inter_token_latency_seconds",
			Help:    "Router-observed time between consecutive token chunks of a streamed response.",
			Buckets: []float64{.001, .005, .01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 2.5, 5, 10},
		}, []string{"backend", "model"}),
		// vLLM's vllm:prompt_tokens_total and vllm:generation_tokens_total,
		// with OpenTelemetry's gen_ai.token.type names (input, output):
		// kvroute_prompt_tokens_total is the router's own estimate.
		tokensIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_input_tokens_total",
			Help: "Prompt tokens of the requests a backend served, as the response's usage reports them (the router's estimate when it has none).",
		}, []string{"backend", "model"}),
		tokensOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_output_tokens_total",
			Help: "Generated tokens of the requests a backend served, as the response's usage reports them (the stream's token chunks when it has none).",
		}, []string{"backend", "model"}),
		prefixHit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_prefix_hit_tokens_total",
			Help: "Prompt tokens the router predicted to be in the chosen backend's prefix cache.",
		}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_prompt_tokens_total",
			Help: "Estimated prompt tokens of routed requests (the denominator of the predicted hit rate).",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_retries_total",
			Help: "Requests re-routed to another backend after a failure before the first response byte.",
		}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_ejections_total",
			Help: "Times a backend was taken out of rotation after consecutive failures.",
		}, []string{"backend"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_upstream_errors_total",
			Help: "Backend failures: connection errors, 5xx, broken responses and failed health checks.",
		}, []string{"backend"}),
		bodyBudgetRejects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_body_budget_rejections_total",
			Help: "Requests answered 503 server_busy because their body would exceed limits.max_buffered_bytes.",
		}),
	}
	m.reg.MustRegister(m.bodyBudgetRejects, m.requests, m.ttft, m.e2e, m.itl, m.tokensIn, m.tokensOut, buildInfo(), m.prefixHit, m.promptTokens, m.retries, m.ejections, m.upstreamErrors,
		&fleetCollector{f: f}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.pd = newPDMetrics(m.reg)
	m.mig = newMigrationMetrics(m.reg)
	m.slo = newSLOMetrics(m.reg)
	return m
}

// Registry is the registry every part of the router registers in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Series are the per-backend families whose children each backend's
// record resolves once.
func (m *Metrics) Series() members.Series {
	return members.Series{Requests: m.requests, TTFT: m.ttft, E2E: m.e2e, ITL: m.itl, InputTokens: m.tokensIn, OutputTokens: m.tokensOut,
		Ejections: m.ejections, UpstreamErrors: m.upstreamErrors, Others: m.pd.families()}
}

// routed counts a routing decision's prompt and predicted cache hit.
func (m *Metrics) routed(v *request.View, a *scheduler.Assignment) {
	m.promptTokens.Add(float64(v.PromptTokens))
	if a.MatchedTokens > 0 {
		m.prefixHit.Add(float64(a.MatchedTokens))
	}
}

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// cacheFamilies are the name prefixes of the families that move by the
// prompt tokens a backend's cache held for a request: the router's
// predicted hits, the audit's, the precise index's blocks and events. On a
// page every tenant may read they answer a prefix guess (a right guess of
// another tenant's prompt moves them further than a wrong one), so the
// client listener shows them only to a scrape that may see the decision
// headers (Server.metricsPage).
var cacheFamilies = []string{"kvroute_prefix_", "kvroute_cache_", "kvroute_kv_blocks", "kvroute_kv_events_"}

// cacheFamily reports whether the family named name is one of cacheFamilies.
func cacheFamily(name string) bool {
	for _, p := range cacheFamilies {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// openHandler is the page without cacheFamilies.
func (m *Metrics) openHandler() http.Handler {
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := m.reg.Gather()
		return slices.DeleteFunc(fams, func(f *dto.MetricFamily) bool { return cacheFamily(f.GetName()) }), err
	})
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{Registry: m.reg})
}

// fleetCollector reads the fleet's load accounting at scrape time, so the
// gauges cost nothing on the request path and are never stale.
type fleetCollector struct{ f *fleet.Fleet }

var (
	descInflight = prometheus.NewDesc("kvroute_inflight_requests",
		"Requests routed to the backend and not yet done.", []string{"backend"}, nil)
	descFleetInflight = prometheus.NewDesc("kvroute_fleet_inflight_requests",
		"Requests in flight on the backend as this router sees the fleet: its own (kvroute_inflight_requests) plus those its live peer replicas report (sync).", []string{"backend"}, nil)
	descPending = prometheus.NewDesc("kvroute_pending_prefill_tokens",
		"Estimated uncached prompt tokens of requests routed to the backend that have not had their first byte.", []string{"backend"}, nil)
	descDecoding = prometheus.NewDesc("kvroute_decoding_requests",
		"Requests past their first byte and not yet done.", []string{"backend"}, nil)
	descHealthy = prometheus.NewDesc("kvroute_backend_healthy",
		"1 when the backend receives requests, 0 when it is ejected.", []string{"backend"}, nil)
	descRate = prometheus.NewDesc("kvroute_prefill_rate_tokens_per_second",
		"The backend's prefill rate as learned from observed TTFTs.", []string{"backend"}, nil)
	descEngineRate = prometheus.NewDesc("kvroute_engine_prefill_rate_tokens_per_second",
		"The backend's prefill rate as its engine's own counters show it (absent when the engine reports none); kvroute prefers it.", []string{"backend"}, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInflight, descFleetInflight, descPending, descDecoding, descHealthy, descRate, descEngineRate} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range fleet.Named(c.f.Snapshot().All) {
		l := b.OwnLoad()
		healthy := 0.0
		if b.Healthy() {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(l.InFlight), b.Name)
		ch <- prometheus.MustNewConstMetric(descFleetInflight, prometheus.GaugeValue, float64(l.InFlight+b.PeerLoad().InFlight), b.Name)
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(l.PendingPrefill), b.Name)
		ch <- prometheus.MustNewConstMetric(descDecoding, prometheus.GaugeValue, float64(l.Decoding), b.Name)
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, b.Name)
		ch <- prometheus.MustNewConstMetric(descRate, prometheus.GaugeValue, b.PrefillRate(time.Now()), b.Name)
		if r := b.EnginePrefillRate(); r > 0 {
			ch <- prometheus.MustNewConstMetric(descEngineRate, prometheus.GaugeValue, r, b.Name)
		}
	}
}

// buildInfo is kvroute_build_info: 1, labelled with the build's identity
// (Prometheus's own prometheus_build_info convention), so that a
// dashboard can tell replicas and rollouts apart.
func buildInfo() prometheus.Collector {
	i := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "kvroute_build_info",
		Help:        "1, labelled with the running kvroute's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}
