package tokenize

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
)

// Tokenizer is the router's use of a Client for precise routing, built
// from the kv_events section: where to ask (kv_events.tokenizer, or a
// backend the caller picks), which prompts are worth asking about, and
// the metrics of the calls made before routing.
type Tokenizer struct {
	*Client
	// Service is kv_events.tokenizer's URL; nil: the caller asks a
	// backend's /tokenize.
	Service *url.URL
	// MinTokens is kv_events.min_prompt_tokens: shorter prompts (by the
	// router's estimate) are routed approximately, unasked.
	MinTokens int
	latency   prometheus.Histogram
	failures  *prometheus.CounterVec
}

// Reasons a request is routed approximately for want of its token ids
// (kvroute_tokenize_failures_total's reason label).
const (
	FailTimeout   = "timeout"
	FailError     = "error"
	FailNoBackend = "no_backend"
	FailBody      = "body"
)

// NewTokenizer builds the router's tokenizer from k, its calls carried by
// transport, and registers its metrics in reg.
func NewTokenizer(k config.KVEvents, transport http.RoundTripper, reg prometheus.Registerer) (*Tokenizer, error) {
	c, err := New(Config{Timeout: k.TokenizeTimeout, CacheEntries: k.TokenizeCache, CacheBytes: int64(k.TokenizeCacheBytes), Transport: transport})
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{
		Client:    c,
		MinTokens: k.MinPromptTokens,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_tokenize_seconds",
			Help:    "Duration of the /tokenize calls made before routing a request precisely (cache hits are not observed).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenize_failures_total",
			Help: "Requests routed approximately because their token ids could not be had: timeout, error (the call or its answer failed), no_backend (no healthy backend serving the model to ask), body.",
		}, []string{"reason"}),
	}
	if k.Tokenizer != config.DefaultTokenizer {
		if t.Service, err = config.ParseBackendURL(k.Tokenizer); err != nil {
			return nil, err
		}
	}
	reg.MustRegister(t.latency, t.failures)
	// Every reason starts at 0, so that a dashboard's rate over them
	// reads 0 rather than no data until the first failure.
	for _, r := range []string{FailTimeout, FailError, FailNoBackend, FailBody} {
		t.failures.WithLabelValues(r)
	}
	return t, nil
}

// Ask asks base's /tokenize for the token ids of the prompt of body, a
// request for model (an answer not cached: see Cached), timing the call.
// On failure it returns the error and counts its reason.
func (t *Tokenizer) Ask(ctx context.Context, base *url.URL, key Key, model string, body []byte) ([]uint32, error) {
	req, err := RequestOf(model, body)
	if err != nil {
		t.Failed(FailBody)
		return nil, err
	}
	start := time.Now()
	toks, err := t.Tokens(ctx, base, key, req)
	if err != nil {
		reason := FailError
		if errors.Is(err, context.DeadlineExceeded) {
			reason = FailTimeout
		}
		t.Failed(reason)
		return nil, err
	}
	t.latency.Observe(time.Since(start).Seconds())
	return toks, nil
}

// Failed counts a request routed approximately for reason (one of the
// Fail constants).
func (t *Tokenizer) Failed(reason string) { t.failures.WithLabelValues(reason).Inc() }

// Failures is the counter of the requests routed approximately for
// reason.
func (t *Tokenizer) Failures(reason string) prometheus.Counter {
	return t.failures.WithLabelValues(reason)
}
