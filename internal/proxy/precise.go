package proxy

import (
	"context"
	"errors"
	"net/url"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// precise is the exchange's part of precise prefix routing: getting a
// request's token ids before it is routed. It is nil when no backend has a
// KV event stream.
type precise struct {
	tok *tokenize.Client
	// service is kv_events.tokenizer's URL; nil: a backend's /tokenize.
	service   *url.URL
	minTokens int
	latency   prometheus.Histogram
	failures  *prometheus.CounterVec
}

// wantsPrecise reports whether any entry has a KV event stream.
func wantsPrecise(entries []config.Entry) bool {
	for i := range entries {
		if entries[i].KVEvents != "" {
			return true
		}
	}
	return false
}

// newPrecise returns the exchange's tokenizer, registering its metrics and
// the precise index's in reg.
func newPrecise(cfg *config.Config, f *fleet.Fleet, ix *prefix.Precise, reg *prometheus.Registry, dialTLS dialFunc) (*precise, error) {
	k := cfg.KVEvents
	tok, err := tokenize.New(tokenize.Config{Timeout: k.TokenizeTimeout, CacheEntries: k.TokenizeCache, CacheBytes: k.TokenizeCacheBytes, Transport: newTransport(cfg.Upstream, dialTLS)})
	if err != nil {
		return nil, err
	}
	p := &precise{
		tok:       tok,
		minTokens: k.MinPromptTokens,
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
		if p.service, err = config.ParseBackendURL(k.Tokenizer); err != nil {
			return nil, err
		}
	}
	reg.MustRegister(p.latency, p.failures, &preciseCollector{f: f, ix: ix})
	return p, nil
}

// tokenized is a request's answer from the tokenizer, kept by its
// exchange until the engine's answer says whether to cache it.
type tokenized struct {
	key    tokenize.Key
	tokens []uint32
}

// rememberTokens caches the exchange's token ids once the engine has
// accepted its request (a 2xx): a prompt the engine refused (too long, an
// unknown model) is never cached, so that refused requests cannot fill
// the cache.
func (ex *exchange) rememberTokens() {
	if p := ex.s.precise; p != nil && ex.tokenized.tokens != nil && ex.Status/100 == 2 {
		p.tok.Remember(ex.tokenized.key, ex.tokenized.tokens)
	}
}

// tokenKeys returns the precise index's keys of v's prompt, or nil (the
// request is then routed approximately): without a precise index, for a
// prompt under kv_events.min_prompt_tokens, or when the tokenizer fails in
// any way. It is called before routing, never inside the pick. The token
// ids are kept in ex.tokenized for rememberTokens.
func (ex *exchange) tokenKeys(ctx context.Context, v *request.View, body []byte) []uint64 {
	s, p := ex.s, ex.s.precise
	if p == nil || v.PromptTokens < p.minTokens {
		return nil
	}
	base := p.service
	if base == nil {
		base = s.tokenizerBackend(v)
		if base == nil {
			p.failures.WithLabelValues("no_backend").Inc()
			return nil
		}
	}
	key := tokenize.Key{Model: v.Model, Prompt: xxhash.Sum64String(v.Prompt)}
	toks, ok := p.tok.Cached(key)
	if !ok {
		if toks = ex.askTokens(ctx, base, key, v, body); toks == nil {
			return nil
		}
	}
	ex.tokenized = tokenized{key, toks}
	// The chain is salted as the engine salts it: the LoRA adapter, then
	// the request's cache_salt (and its tenant's, with isolate_prefix) on
	// the first block, as the engines' events' extra keys carry it.
	return s.sched.TokenKeys(toks, prefix.JoinSalt(s.sched.Precise().Salt(v.Model), v.PrefixSalt))
}

// askTokens asks base's /tokenize for the ids of v's prompt (an answer
// not cached), or returns nil, counting why.
func (ex *exchange) askTokens(ctx context.Context, base *url.URL, key tokenize.Key, v *request.View, body []byte) []uint32 {
	s, p := ex.s, ex.s.precise
	req, err := tokenize.RequestOf(v.Model, body)
	if err != nil {
		p.failures.WithLabelValues("body").Inc()
		return nil
	}
	start := time.Now()
	toks, err := p.tok.Tokens(ctx, base, key, req)
	if err != nil {
		reason := "error"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		p.failures.WithLabelValues(reason).Inc()
		s.log.Debug("tokenize failed: routing approximately", "err", err)
		return nil
	}
	p.latency.Observe(time.Since(start).Seconds())
	return toks
}

// tokenizerBackend picks the healthy backend serving v's model to ask for
// its tokens: one with a KV event stream (an engine that publishes events
// is one whose tokenizer the index's keys follow) if any, spread over them
// by the prompt's hash.
func (s *Server) tokenizerBackend(v *request.View) *url.URL {
	snap := s.fleet.Snapshot()
	var fallback, pick *fleet.Backend
	n := 0
	h := xxhash.Sum64String(v.Model)
	for _, b := range snap.Healthy {
		if !b.Serves(v.Model) || b.URL == nil {
			continue
		}
		if fallback == nil {
			fallback = b
		}
		if m := s.set.Of(b); m != nil && m.Entry.KVEvents != "" {
			n++
			if h%uint64(n) == 0 { // reservoir: each with probability 1/n
				pick = b
			}
			h = prefix.Mix64(h)
		}
	}
	if pick == nil {
		pick = fallback
	}
	if pick == nil {
		return nil
	}
	return pick.URL
}

// preciseCollector reads the precise index's per-backend counters at
// scrape time.
type preciseCollector struct {
	f  *fleet.Fleet
	ix *prefix.Precise
}

var (
	descKVBlocks = prometheus.NewDesc("kvroute_kv_blocks",
		"Blocks the backend's KV events say it holds, as the router's precise index keeps them.", []string{"backend"}, nil)
	descKVTrusted = prometheus.NewDesc("kvroute_kv_stream_trusted",
		"1 while the backend is routed on its KV events, 0 while it is routed approximately (no stream yet, a gap, a restart being re-learned, or stale).", []string{"backend"}, nil)
	descKVEvents = prometheus.NewDesc("kvroute_kv_events_applied_total",
		"KV cache events applied to the precise index, by type (BlockStored, BlockRemoved, AllBlocksCleared).", []string{"backend", "type"}, nil)
	descKVSkipped = prometheus.NewDesc("kvroute_kv_blocks_skipped_total",
		"Blocks or events the precise index skipped: orphan (parent unknown), block_size (another block size), unknown_removed (never seen stored).", []string{"backend", "reason"}, nil)
	descKVEvicted = prometheus.NewDesc("kvroute_kv_blocks_evicted_total",
		"Blocks dropped from the precise index for kv_events.max_blocks_per_backend.", []string{"backend"}, nil)
	descKVResets = prometheus.NewDesc("kvroute_kv_resets_total",
		"Times the backend's precise entries were dropped (a gap replay could not fill, an engine restart).", []string{"backend"}, nil)
)

func (c *preciseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVBlocks, descKVTrusted, descKVEvents, descKVSkipped, descKVEvicted, descKVResets} {
		ch <- d
	}
}

func (c *preciseCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, b := range c.f.Snapshot().All {
		st := c.ix.Stats(b.ID, now)
		trusted := 0.0
		if st.Trusted {
			trusted = 1
		}
		gauge(descKVBlocks, float64(st.Blocks), b.Name)
		gauge(descKVTrusted, trusted, b.Name)
		counter(descKVEvents, st.Stored, b.Name, "BlockStored")
		counter(descKVEvents, st.Removed, b.Name, "BlockRemoved")
		counter(descKVEvents, st.Cleared, b.Name, "AllBlocksCleared")
		counter(descKVSkipped, st.Orphans, b.Name, "orphan")
		counter(descKVSkipped, st.Mismatched, b.Name, "block_size")
		counter(descKVSkipped, st.UnknownRemoved, b.Name, "unknown_removed")
		counter(descKVEvicted, st.Evicted, b.Name)
		counter(descKVResets, st.Resets, b.Name)
	}
}
