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

// collector exports engine.Stats under vLLM's names, read under the engine
// lock at scrape time, so that a scrape sees one consistent state.
type collector struct {
	s                                      *Server
	running, waiting, kvUsage              *prometheus.Desc
	prefixQueries, prefixHits, preemptions *prometheus.Desc
	promptTokens, generationTokens         *prometheus.Desc
	cacheConfig                            *prometheus.Desc
	cacheLabels                            []string
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
		s:                s,
		running:          d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:          d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:          d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		prefixQueries:    d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
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
	k(c.preemptions, st.Preemptions)
	k(c.promptTokens, st.PromptTokens)
	k(c.generationTokens, st.GenerationTokens)
	ch <- prometheus.MustNewConstMetric(c.cacheConfig, prometheus.GaugeValue, 1, c.cacheLabels...)
	if c.s.loraInfo != nil {
		l := c.s.LoRA()
		c.s.loraInfo.observe([3]string{strconv.Itoa(l.MaxLoras), strings.Join(l.Waiting, ","), strings.Join(l.Running, ",")}, time.Now(), ch)
	}
}
