package emulator

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/engine"
)

// engineIndex is vLLM v1's "engine" label: the data-parallel rank, 0 for a
// single engine.
const engineIndex = "0"

// TTFTBuckets are vLLM v1's buckets for vllm:time_to_first_token_seconds.
var TTFTBuckets = []float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
}

// ITLBuckets are vLLM v1's buckets for vllm:inter_token_latency_seconds.
var ITLBuckets = []float64{
	0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
}

// RequestLatencyBuckets are vLLM v1's buckets for its request-level
// timing histograms: vllm:e2e_request_latency_seconds and
// vllm:request_{queue,inference,prefill,decode}_time_seconds.
var RequestLatencyBuckets = []float64{
	0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
}

// tokenBuckets are vLLM's 1-2-5 buckets up to max (its
// build_1_2_5_buckets), for histograms of token counts per request.
func tokenBuckets(max int) []float64 {
	var b []float64
	for e := 1; ; e *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*e > max {
				return b
			}
			b = append(b, float64(m*e))
		}
	}
}

// Finish reasons: the OpenAI finish_reason of a response, and vLLM's
// finished_reason label values.
const (
	finishStop   = "stop"
	finishLength = "length"
	finishAbort  = "abort"
)

// requestMetrics are vLLM v1's request-level metrics, observed once per
// request when it ends, as vLLM's output processor does: its timings
// from the engine model's Arrival, ScheduledAt, FirstTokenAt and
// FinishedAt (queue = scheduled - arrival, prefill = first token -
// scheduled, decode = finish - first token, inference = finish -
// scheduled, e2e = finish - arrival), the prompt tokens it computed (its
// cached ones excluded), and the success counter by finish reason. Like
// the inter-token latency, the timings are on the real clock: the router
// learns the engine's prefill rate from request_prefill_time_seconds
// against request_prefill_kv_computed_tokens, and weighs it against the
// TTFTs it measures itself.
type requestMetrics struct {
	e2e, queue, inference, prefill, decode, computed prometheus.Observer
	success                                          map[string]prometheus.Counter
}

func (s *Server) newRequestMetrics(labels prometheus.Labels) []prometheus.Collector {
	var cs []prometheus.Collector
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		cs = append(cs, h)
		return h
	}
	m := &requestMetrics{
		e2e:       hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", RequestLatencyBuckets),
		queue:     hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", RequestLatencyBuckets),
		inference: hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", RequestLatencyBuckets),
		prefill:   hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", RequestLatencyBuckets),
		decode:    hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", RequestLatencyBuckets),
		computed: hist("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
			tokenBuckets(s.preset.MaxModelLen)),
		success: map[string]prometheus.Counter{},
	}
	success := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
		ConstLabels: labels}, []string{"finished_reason"})
	// vLLM exports every reason from the start, at 0. A request the
	// emulated engine finishes stops or reaches its length; "abort" stays
	// at 0.
	for _, r := range []string{finishStop, finishLength, finishAbort} {
		m.success[r] = success.WithLabelValues(r)
	}
	s.requests = m
	return append(cs, success)
}

// finished observes p's request, which the engine has finished (a
// request abandoned by its client never finishes, and is not counted).
// The caller holds s.mu.
func (s *Server) finished(p *pending) {
	m := s.requests
	c := m.success[p.finish]
	if c == nil {
		c = m.success[finishStop]
	}
	c.Inc()
	r := &p.r
	real := func(d time.Duration) float64 { return d.Seconds() / s.scale }
	m.e2e.Observe(real(r.FinishedAt - r.Arrival))
	m.queue.Observe(real(r.ScheduledAt - r.Arrival))
	m.inference.Observe(real(r.FinishedAt - r.ScheduledAt))
	m.prefill.Observe(real(r.FirstTokenAt - r.ScheduledAt))
	m.decode.Observe(real(r.FinishedAt - r.FirstTokenAt))
	m.computed.Observe(float64(r.PromptTokens - r.CachedTokens))
}

// collector exports engine.Stats under vLLM's names, read under the engine
// lock at scrape time, so that a scrape sees one consistent state.
type collector struct {
	s                                      *Server
	running, waiting, kvUsage              *prometheus.Desc
	prefixQueries, prefixHits, preemptions *prometheus.Desc
	// externalQueries and externalHits are the CPU tier's (vLLM's KV
	// connector counters), exported only when the engine has one.
	externalQueries, externalHits *prometheus.Desc
	// offloadTime is vLLM's kv_offload_total_time, of which the engine
	// has the CPU-to-GPU loads.
	offloadTime                    *prometheus.Desc
	promptTokens, generationTokens *prometheus.Desc
	cacheConfig                    *prometheus.Desc
	cacheLabels                    []string
}

func (s *Server) initMetrics() {
	labels := prometheus.Labels{"model_name": s.model, "engine": engineIndex}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, nil, labels)
	}
	p := s.preset
	// vLLM's cache_config_info carries every CacheConfig field as a label
	// and no model_name; model_name is added so that every family here can
	// be selected by model.
	c := &collector{
		s:               s,
		running:         d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:         d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:         d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		prefixQueries:   d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:      d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		externalQueries: d("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens."),
		externalHits:    d("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens."),
		offloadTime: prometheus.NewDesc("vllm:kv_offload_total_time_total", "Total time measured by all KV offloading operations",
			[]string{"transfer_type"}, labels),
		preemptions:      d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		promptTokens:     d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		cacheConfig: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			[]string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype", "engine", "model_name"}, nil),
		cacheLabels: []string{strconv.Itoa(engine.BlockSize), strconv.Itoa(p.KVBlocks), "True", "auto", engineIndex, s.model},
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
	}
	ttft := hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFTBuckets)
	s.ttft = ttft
	// vLLM v1's inter-token latency (time_per_output_token_seconds before
	// it), one observation per output token after the first: the router
	// learns the engine's decode time from it. Unlike the TTFT histogram
	// (emulated time, for reports), it is on the real clock: at a time
	// scale other than 1 the router, which times everything else on the
	// real clock, must see one consistent engine.
	itl := hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITLBuckets)
	s.itl = itl
	if len(s.loras) > 0 {
		s.loraInfo = newLoRAHistory()
	}
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(c, ttft, itl)
	s.reg.MustRegister(s.newRequestMetrics(labels)...)
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kvUsage, c.prefixQueries, c.prefixHits,
		c.preemptions, c.promptTokens, c.generationTokens, c.cacheConfig} {
		ch <- d
	}
	if c.s.loraInfo != nil {
		ch <- c.s.loraInfo.desc
	}
	if c.s.Preset().CPUBlocks > 0 {
		ch <- c.externalQueries
		ch <- c.externalHits
		ch <- c.offloadTime
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	k := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	g(c.running, float64(st.Running))
	g(c.waiting, float64(st.Waiting))
	g(c.kvUsage, st.KVUsage)
	k(c.prefixQueries, st.PrefixQueries)
	k(c.prefixHits, st.PrefixHits)
	if c.s.Preset().CPUBlocks > 0 {
		k(c.externalQueries, st.ExternalQueries)
		k(c.externalHits, st.ExternalHits)
		ch <- prometheus.MustNewConstMetric(c.offloadTime, prometheus.CounterValue, st.HostLoadTime.Seconds(), "CPU_to_GPU")
	}
	k(c.preemptions, st.Preemptions)
	k(c.promptTokens, st.PromptTokens)
	k(c.generationTokens, st.GenerationTokens)
	ch <- prometheus.MustNewConstMetric(c.cacheConfig, prometheus.GaugeValue, 1, c.cacheLabels...)
	if c.s.loraInfo != nil {
		l := c.s.LoRA()
		c.s.loraInfo.observe([3]string{strconv.Itoa(l.MaxLoras), strings.Join(l.Waiting, ","), strings.Join(l.Running, ",")}, time.Now(), ch)
	}
}
