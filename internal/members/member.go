package members

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
)

// Member is everything the router knows about one backend beyond its load
// (which package fleet accounts): one record per fleet.Backend, created
// when the backend joins and kept after it is retired, so that a request
// still in flight there finds it.
type Member struct {
	// B is the backend in the fleet.
	B *fleet.Backend
	// Entry is the config entry it came from: its own, or its DNS pool's.
	Entry config.Entry
	// Pool names the DNS entry it came from; "" for a static entry.
	Pool string

	// configured is the entry's max_model_len (a reload updates it);
	// discovered the context lengths its /v1/models reported, by model;
	// reported the context length per request its engine reports while
	// serving (llama.cpp's /slots n_ctx), 0 if none.
	configured atomic.Int64
	discovered map[string]int
	// adapters are the LoRA adapters its /v1/models listed, with their
	// base models; nil for none. Set under the Set's mu.
	adapters map[string]string
	reported atomic.Int64

	// The circuit breaker (see breaker): quiet is set while it is closed
	// with no failure counted, and notClosed while it is not closed, so
	// that the hot path's Succeeded and Allow cost one atomic load.
	quiet, notClosed atomic.Bool
	mu               sync.Mutex // guards br and timer; held while a transition is applied
	br               breaker
	timer            *time.Timer

	// Metric series, resolved once (by model, for those labelled so).
	ttft, e2e, itl            *prometheus.HistogramVec
	tokensIn, tokensOut       *prometheus.CounterVec
	ejections, upstreamErrors prometheus.Counter
	requestsVec               *prometheus.CounterVec
	requests                  atomic.Pointer[statusCounters]

	// stopStream ends its KV event stream (kvstream.go); nil without one.
	// Set and read under the Set's mu.
	stopStream func()
	// cpuTier is Config.SetCPUCapacity, nil without it.
	cpuTier func(id int, tokens int64)
}

func newMember(b *fleet.Backend, e config.Entry, pool string, found *ModelList, se Series, cpuTier func(int, int64)) *Member {
	m := &Member{B: b, Entry: e, Pool: pool, requestsVec: se.Requests, cpuTier: cpuTier}
	m.configured.Store(int64(e.MaxModelLen))
	if found != nil {
		m.discovered, m.adapters = found.Lens, found.Parents
	}
	m.setLimits(e)
	m.quiet.Store(true)
	if se.TTFT != nil {
		m.ttft, m.e2e, m.itl, m.tokensIn, m.tokensOut = se.TTFT, se.E2E, se.ITL, se.InputTokens, se.OutputTokens
		m.ejections = se.Ejections.WithLabelValues(b.Name)
		m.upstreamErrors = se.UpstreamErrors.WithLabelValues(b.Name)
	}
	return m
}

// initSeries puts the backend's base models in its families from its
// start, at zero, under their labels (labels.go); refresh calls it for
// every record.
func (m *Member) initSeries(label func(string) string) {
	if m.ttft == nil {
		return
	}
	for _, model := range m.baseModels() {
		l := label(model)
		if l == Other {
			continue
		}
		m.ttft.WithLabelValues(m.B.Name, l)
		m.e2e.WithLabelValues(m.B.Name, l)
		if m.itl != nil {
			m.itl.WithLabelValues(m.B.Name, l)
			m.tokensIn.WithLabelValues(m.B.Name, l)
			m.tokensOut.WithLabelValues(m.B.Name, l)
		}
	}
}

// ContextOf returns the backend's context length for model, 0 when
// unknown. The configured max_model_len wins; else the smaller of what
// /v1/models said and what the engine reports per request (a llama.cpp
// server's /v1/models gives the context of all its slots together, its
// /slots that of one).
func (m *Member) ContextOf(model string) int {
	if n := m.configured.Load(); n > 0 {
		return int(n)
	}
	d, r := m.discovered[model], int(m.reported.Load())
	if d > 0 && r > 0 {
		return min(d, r)
	}
	return max(d, r)
}

// SetReportedContext records the context length per request, in tokens,
// that the backend's engine reports (see ContextOf).
func (m *Member) SetReportedContext(tokens int) {
	m.reported.Store(int64(max(tokens, 0)))
	m.B.SetContextLen(m.contextLen())
}

// setLimits hands the backend's configured limits (entry e) and its
// context length to the fleet, where the kvroute policy reads them.
func (m *Member) setLimits(e config.Entry) {
	m.configured.Store(int64(e.MaxModelLen))
	m.B.SetMaxNumSeqs(e.MaxNumSeqs)
	m.B.SetMaxBatchedTokens(e.MaxNumBatchedTokens)
	m.B.SetContextLen(m.contextLen())
	setPrior(m.B, e.Prior)
	if m.cpuTier != nil {
		// Blocks of 16 tokens, as vLLM's num_cpu_blocks.
		m.cpuTier(m.B.ID, int64(e.CPUKVBlocks)*16)
	}
}

// setPrior starts b's cost model from prior (nil: the generic one) unless
// it already started from it: a reload that keeps the entry's preset keeps
// what the backend learned.
func setPrior(b *fleet.Backend, prior *costmodel.Prior) {
	p := costmodel.Generic()
	if prior != nil {
		p = *prior
	}
	if m := costmodel.New(p); m.Prior() != b.Cost().Prior() {
		b.SetCostModel(m)
	}
}

// contextLen is the backend's context length for all its models: the
// configured one, else the smallest that ContextOf gives a model it
// reported, 0 when unknown.
func (m *Member) contextLen() int {
	if n := m.configured.Load(); n > 0 {
		return int(n)
	}
	c := 0
	for model := range m.discovered {
		if n := m.ContextOf(model); n > 0 && (c == 0 || n < c) {
			c = n
		}
	}
	if c == 0 {
		c = int(m.reported.Load())
	}
	return c
}

// ObserveTTFT records a time to first byte of a request for model (its
// metric label: see Series).
func (m *Member) ObserveTTFT(model string, d time.Duration) {
	if m.ttft != nil {
		m.ttft.WithLabelValues(m.B.Name, model).Observe(d.Seconds())
	}
}

// ObserveE2E records a request's whole duration.
func (m *Member) ObserveE2E(model string, d time.Duration) {
	if m.e2e != nil {
		m.e2e.WithLabelValues(m.B.Name, model).Observe(d.Seconds())
	}
}

// ITL is the observer of model's inter-token gaps on this backend; nil
// without the family.
func (m *Member) ITL(model string) prometheus.Observer {
	if m.itl == nil {
		return nil
	}
	return m.itl.WithLabelValues(m.B.Name, model)
}

// CountTokens counts the input and output tokens of a request for model
// that this backend served.
func (m *Member) CountTokens(model string, in, out int) {
	if m.tokensIn == nil {
		return
	}
	m.tokensIn.WithLabelValues(m.B.Name, model).Add(float64(in))
	m.tokensOut.WithLabelValues(m.B.Name, model).Add(float64(out))
}

// Count counts one request that this backend answered, with the policy
// that routed it, its model label and its status.
func (m *Member) Count(policy, model string, status int) {
	if m.requestsVec == nil {
		return
	}
	c := m.requests.Load()
	if c == nil || c.policy != policy {
		// The policy changed (a reload): a new set of children.
		c = &statusCounters{policy: policy}
		m.requests.Store(c)
	}
	c.get(m.requestsVec, m.B.Name, model, status).Inc()
}

// statusCounters caches one backend's kvroute_requests_total children for
// one policy, by model and status.
type statusCounters struct {
	policy string
	m      sync.Map // modelStatus -> prometheus.Counter
}

// modelStatus keys a child of kvroute_requests_total under one policy.
type modelStatus struct {
	model  string
	status int
}

func (c *statusCounters) get(vec *prometheus.CounterVec, backend, model string, status int) prometheus.Counter {
	k := modelStatus{model, status}
	if v, ok := c.m.Load(k); ok {
		return v.(prometheus.Counter)
	}
	ctr := vec.WithLabelValues(backend, c.policy, model, strconv.Itoa(status))
	c.m.Store(k, ctr)
	return ctr
}
