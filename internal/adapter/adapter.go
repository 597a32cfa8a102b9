// Package adapter reads an inference engine's own picture of its load from
// what the engine really exposes: its Prometheus /metrics (vLLM, SGLang,
// llama.cpp server, Text Generation Inference) and llama.cpp's /slots. It
// turns one scrape into a State; the proxy decides when to scrape and feeds
// the result to the fleet.
//
// Parsing uses the Prometheus text parser of prometheus/common; this package
// does no I/O of its own and never panics on malformed input.
package adapter

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind is an engine family.
type Kind string

// The engine kinds kvroute understands.
const (
	Unknown  Kind = ""
	VLLM     Kind = "vllm"
	SGLang   Kind = "sglang"
	LlamaCpp Kind = "llamacpp"
	TGI      Kind = "tgi"
)

// Kinds lists the kinds a config may name.
var Kinds = []Kind{VLLM, SGLang, LlamaCpp, TGI}

// ParseKind validates a configured kind ("" or "auto" mean detect).
func ParseKind(s string) (Kind, error) {
	if s == "" || s == "auto" {
		return Unknown, nil
	}
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return Unknown, fmt.Errorf("unknown engine kind %q (known: vllm, sglang, llamacpp, tgi, auto)", s)
}

// State is one scrape's reading. Fields an engine does not expose are -1.
type State struct {
	Kind Kind
	// Running and Waiting are requests in the engine's batch and queue.
	Running, Waiting float64
	// KVUsage is the KV cache fill, 0..1.
	KVUsage float64
	// PrefixHitRate is cached prompt tokens / prompt tokens, 0..1, over the
	// engine's lifetime (vLLM counters) or as the engine reports it (SGLang).
	PrefixHitRate float64
	// BlockSize (tokens) and NumGPUBlocks come from vLLM's cache_config_info.
	BlockSize, NumGPUBlocks int
	// PrefillTokens and PrefillSeconds are the engine's own lifetime
	// counts of prompt tokens it computed (cached ones excluded) and of
	// the time it spent prefilling, -1 when not exposed: their ratio
	// between two scrapes is its prefill throughput. vLLM: the sum of
	// request_prefill_kv_computed_tokens, else prompt_tokens_total less
	// prefix_cache_hits_total, over the sum of request_prefill_time_seconds;
	// llama.cpp: prompt_tokens_total over prompt_seconds_total.
	PrefillTokens, PrefillSeconds float64
	// ContextLen is the context length of one request in tokens
	// (llama.cpp's /slots n_ctx, per slot), 0 when not reported.
	ContextLen int
	// MaxNumSeqs is the engine's cap on running sequences (llama.cpp's
	// /slots count), 0 when not reported: vLLM and SGLang export none.
	MaxNumSeqs int
	// DecodeTokens and DecodeSeconds are the engine's own lifetime counts
	// of output tokens after each request's first and of the time between
	// them, -1 when not exposed: their ratio between two scrapes is its
	// time per output token. vLLM and SGLang: the count and sum of the
	// inter_token_latency_seconds histogram (vLLM before it:
	// time_per_output_token_seconds); llama.cpp: tokens_predicted_total
	// over tokens_predicted_seconds_total.
	DecodeTokens, DecodeSeconds float64
	// ComputedTokens is the engine's lifetime count of prompt tokens it
	// computed (found in no cache), -1 when it exports none; its growth
	// between scrapes is the prefill that ran in the steps its
	// inter-token latency timed. vLLM: the sum of
	// request_prefill_kv_computed_tokens, else prompt_tokens_total less
	// prefix_cache_hits_total; SGLang: prompt_tokens_total less
	// cached_tokens_total (every cache source); llama.cpp:
	// prompt_tokens_total, which counts only the tokens it evaluated.
	ComputedTokens float64
	// HostLoadTokens and HostLoadSeconds are the engine's lifetime counts
	// of prompt tokens loaded from its CPU tier and of the time the loads
	// took, -1 when not exposed: their ratio between two scrapes is its
	// load time per token (costmodel.Model.LoadPerToken). vLLM with its
	// OffloadingConnector: external_prefix_cache_hits_total over
	// kv_offload_total_time_total{transfer_type="CPU_to_GPU"}.
	HostLoadTokens, HostLoadSeconds float64
	// LoRA is the engine's report of its LoRA adapters (lora.go), nil when
	// it reports none.
	LoRA *LoRA
}

// metric names, exactly as the engines export them.
const (
	vllmRunning       = "vllm:num_requests_running"
	vllmWaiting       = "vllm:num_requests_waiting"
	vllmKVUsage       = "vllm:kv_cache_usage_perc"
	vllmKVUsageLegacy = "vllm:gpu_cache_usage_perc"
	vllmHits          = "vllm:prefix_cache_hits_total"
	vllmQueries       = "vllm:prefix_cache_queries_total"
	vllmCacheConfig   = "vllm:cache_config_info"
	vllmPrompt        = "vllm:prompt_tokens_total"
	vllmComputed      = "vllm:request_prefill_kv_computed_tokens"
	vllmPrefillTime   = "vllm:request_prefill_time_seconds"
	vllmITL           = "vllm:inter_token_latency_seconds"
	vllmTPOT          = "vllm:time_per_output_token_seconds"
	vllmExternalHits  = "vllm:external_prefix_cache_hits_total"
	vllmOffloadTime   = "vllm:kv_offload_total_time_total"

	sglRunning      = "sglang:num_running_reqs"
	sglWaiting      = "sglang:num_queue_reqs"
	sglTokens       = "sglang:token_usage"
	sglHitRate      = "sglang:cache_hit_rate"
	sglITL          = "sglang:inter_token_latency_seconds"
	sglPrompt       = "sglang:prompt_tokens_total"
	sglCached       = "sglang:cached_tokens_total"
	llamaProc       = "llamacpp:requests_processing"
	llamaDefer      = "llamacpp:requests_deferred"
	llamaKV         = "llamacpp:kv_cache_usage_ratio"
	llamaPrompt     = "llamacpp:prompt_tokens_total"
	llamaPromptTime = "llamacpp:prompt_seconds_total"
	llamaGen        = "llamacpp:tokens_predicted_total"
	llamaGenTime    = "llamacpp:tokens_predicted_seconds_total"
	tgiQueue        = "tgi_queue_size"
	tgiBatch        = "tgi_batch_current_size"
)

// ParseMetrics parses a Prometheus text exposition. kind Unknown detects
// the engine from the metric names present; a kind given but not matching
// what the exposition holds is an error, as is an exposition of no known
// engine.
func ParseMetrics(r io.Reader, kind Kind) (State, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return State{}, fmt.Errorf("parse metrics: %w", err)
	}
	if kind == Unknown {
		kind = detect(fams)
		if kind == Unknown {
			return State{}, fmt.Errorf("parse metrics: no vLLM, SGLang, llama.cpp or TGI metrics found")
		}
	}
	s := State{Kind: kind, Running: -1, Waiting: -1, KVUsage: -1, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1,
		PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1,
		HostLoadTokens: -1, HostLoadSeconds: -1}
	switch kind {
	case VLLM:
		s.Running = sum(fams[vllmRunning])
		s.Waiting = sum(fams[vllmWaiting])
		s.KVUsage = maxOf(fams[vllmKVUsage])
		if s.KVUsage < 0 {
			s.KVUsage = maxOf(fams[vllmKVUsageLegacy])
		}
		hits := sum(counter(fams, vllmHits))
		if q := sum(counter(fams, vllmQueries)); hits >= 0 && q > 0 {
			s.PrefixHitRate = hits / q
		}
		s.ComputedTokens = histSum(fams[vllmComputed])
		if s.ComputedTokens < 0 {
			s.ComputedTokens = less(sum(counter(fams, vllmPrompt)), hits)
		}
		if s.PrefillSeconds = histSum(fams[vllmPrefillTime]); s.PrefillSeconds >= 0 {
			s.PrefillTokens = s.ComputedTokens
		}
		if f := fams[vllmITL]; f != nil {
			s.DecodeTokens, s.DecodeSeconds = hist(f)
		} else {
			s.DecodeTokens, s.DecodeSeconds = hist(fams[vllmTPOT])
		}
		if secs := sumWhere(counter(fams, vllmOffloadTime), "transfer_type", "CPU_to_GPU"); secs >= 0 {
			s.HostLoadTokens, s.HostLoadSeconds = sum(counter(fams, vllmExternalHits)), secs
		}
		s.LoRA = vllmLoRA(fams[vllmLoRAInfo])
		if f := fams[vllmCacheConfig]; f != nil && len(f.Metric) > 0 {
			for _, lp := range f.Metric[0].Label {
				switch lp.GetName() {
				case "block_size":
					s.BlockSize = atoi(lp.GetValue())
				case "num_gpu_blocks":
					s.NumGPUBlocks = atoi(lp.GetValue())
				}
			}
		}
	case SGLang:
		s.Running = sum(fams[sglRunning])
		s.Waiting = sum(fams[sglWaiting])
		s.KVUsage = maxOf(fams[sglTokens])
		s.PrefixHitRate = maxOf(fams[sglHitRate])
		s.DecodeTokens, s.DecodeSeconds = hist(fams[sglITL])
		s.ComputedTokens = less(sum(counter(fams, sglPrompt)), sum(counter(fams, sglCached)))
		s.LoRA = sglangLoRA(fams)
	case LlamaCpp:
		s.Running = sum(fams[llamaProc])
		s.Waiting = sum(fams[llamaDefer])
		s.KVUsage = maxOf(fams[llamaKV])
		s.PrefillTokens = sum(counter(fams, llamaPrompt))
		s.ComputedTokens = s.PrefillTokens
		s.PrefillSeconds = sum(counter(fams, llamaPromptTime))
		s.DecodeTokens = sum(counter(fams, llamaGen))
		s.DecodeSeconds = sum(counter(fams, llamaGenTime))
	case TGI:
		s.Running = sum(fams[tgiBatch])
		s.Waiting = sum(fams[tgiQueue])
	default:
		return State{}, fmt.Errorf("parse metrics: unknown engine kind %q", kind)
	}
	// -1 is absent here; a family the engine exports with a value no
	// engine has (a negative, NaN) is present, and sanitize makes it
	// unknown.
	if s.Running == -1 && s.Waiting == -1 {
		return State{}, fmt.Errorf("parse metrics: no %s load metrics found (%s engine expected)", kind, kind)
	}
	s.sanitize()
	return s, nil
}

// Bounds beyond which an engine's number describes no engine that exists:
// such a reading (and NaN, an infinity or a negative number) is a broken
// or hostile exporter's, and is taken as unknown (-1), never as a load.
// Each is orders of magnitude above the largest real figure, so that no
// honest reading is lost, and low enough that the router's sums over them
// stay far inside an int64 (see policy's estimate).
const (
	// MaxRequests bounds running and waiting requests and slots: 2^20,
	// a thousand times vLLM's largest default max_num_seqs (1,024), where
	// an engine's queue of requests (each holding its prompt in host
	// memory) would hold tens of gigabytes. 2^20 requests of a 2^24-token
	// context are 2^44 tokens, inside an int64 with room to spare.
	MaxRequests = 1 << 20
	// MaxContextTokens bounds one request's context: 2^24 (16.8M) tokens,
	// sixteen times the longest context windows served (1M, and 10M for
	// the largest research models).
	MaxContextTokens = 1 << 24
	// MaxBlockSize bounds tokens per KV block: vLLM's attention blocks
	// are 1 to 256 tokens, hybrid (Mamba) models' a few thousand;
	// 2^16 is a block longer than most contexts.
	MaxBlockSize = 1 << 16
	// MaxKVTokens bounds an engine's KV cache in tokens (num_gpu_blocks x
	// block_size): 2^36 (68.7 billion) tokens. The smallest KV footprint
	// of a real model is about 1 KB a token (a sub-billion-parameter
	// model with grouped-query attention in fp8), so 2^36 tokens are 64
	// TiB of accelerator memory, 28 times an eight-GPU node of 288 GB
	// each (2.3 TB).
	MaxKVTokens = 1 << 36
	// MaxCounter bounds a lifetime counter (tokens, seconds): 2^53, the
	// largest integer a float64 holds exactly; a million tokens a second
	// would take 285 years to reach it.
	MaxCounter = 1 << 53
)

// sanitize makes every number of s that no engine could report unknown
// (-1): NaN, infinities, negatives, and values beyond the bounds above.
// A fraction (KV usage, hit rate) is unknown outside [0, 1]. A lifetime
// counter and the seconds that go with it are unknown together, since
// their ratio is what is read.
func (s *State) sanitize() {
	s.Running = bounded(s.Running, MaxRequests)
	s.Waiting = bounded(s.Waiting, MaxRequests)
	s.KVUsage = bounded(s.KVUsage, 1)
	s.PrefixHitRate = bounded(s.PrefixHitRate, 1)
	s.PrefillTokens, s.PrefillSeconds = pair(s.PrefillTokens, s.PrefillSeconds)
	s.DecodeTokens, s.DecodeSeconds = pair(s.DecodeTokens, s.DecodeSeconds)
	s.HostLoadTokens, s.HostLoadSeconds = pair(s.HostLoadTokens, s.HostLoadSeconds)
	s.ComputedTokens = bounded(s.ComputedTokens, MaxCounter)
	s.BlockSize = boundedInt(s.BlockSize, MaxBlockSize)
	s.NumGPUBlocks = boundedInt(s.NumGPUBlocks, MaxKVTokens)
	if s.BlockSize > 0 && s.NumGPUBlocks > MaxKVTokens/s.BlockSize {
		s.NumGPUBlocks = -1
	}
	// 0 is "not reported" for these two.
	s.ContextLen = max(boundedInt(s.ContextLen, MaxContextTokens), 0)
	s.MaxNumSeqs = max(boundedInt(s.MaxNumSeqs, MaxRequests), 0)
}

// bounded is x when it is a number in [0, limit], else -1.
func bounded(x, limit float64) float64 {
	if !(x >= 0 && x <= limit) { // NaN fails both
		return -1
	}
	return x
}

// boundedInt is n when it is in [0, limit], else -1.
func boundedInt(n, limit int) int {
	if n < 0 || n > limit {
		return -1
	}
	return n
}

// less is the prompt tokens of a lifetime count of prompt tokens that
// its count of cached ones leaves: -1 when either is absent.
func less(prompt, cached float64) float64 {
	if prompt < 0 || cached < 0 {
		return -1
	}
	return max(prompt-cached, 0)
}

// pair sanitises a lifetime counter and its seconds: both, or both -1.
func pair(tokens, seconds float64) (float64, float64) {
	tokens, seconds = bounded(tokens, MaxCounter), bounded(seconds, MaxCounter)
	if tokens < 0 || seconds < 0 {
		return -1, -1
	}
	return tokens, seconds
}

func detect(fams map[string]*dto.MetricFamily) Kind {
	switch {
	case fams[vllmRunning] != nil || fams[vllmWaiting] != nil:
		return VLLM
	case fams[sglRunning] != nil || fams[sglWaiting] != nil:
		return SGLang
	case fams[llamaProc] != nil || fams[llamaDefer] != nil:
		return LlamaCpp
	case fams[tgiQueue] != nil || fams[tgiBatch] != nil:
		return TGI
	}
	return Unknown
}

// sumWhere is the sum of f's series whose label name is want, -1 when
// none has it (or f is nil).
func sumWhere(f *dto.MetricFamily, name, want string) float64 {
	if f == nil {
		return -1
	}
	total, found := 0.0, false
	for _, m := range f.Metric {
		for _, l := range m.GetLabel() {
			if l.GetName() == name && l.GetValue() == want {
				total += value(m)
				found = true
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

// counter is the family of the counter named name, which ends in _total
// as Prometheus names counters; an exposition that names it without the
// suffix (llm-d's inference simulator exports vllm:prefix_cache_hits) is
// read the same.
func counter(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f := fams[name]; f != nil {
		return f
	}
	return fams[strings.TrimSuffix(name, "_total")]
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// sum adds a family's series (an engine with several data-parallel ranks
// exports one series each); -1 when absent.
func sum(f *dto.MetricFamily) float64 {
	if f == nil || len(f.Metric) == 0 {
		return -1
	}
	var t float64
	for _, m := range f.Metric {
		t += value(m)
	}
	return t
}

// histSum adds the sums of a histogram family's series; -1 when absent.
func histSum(f *dto.MetricFamily) float64 {
	_, sum := hist(f)
	return sum
}

// hist adds the sample counts and the sums of a histogram family's
// series; -1 and -1 when absent.
func hist(f *dto.MetricFamily) (count, sum float64) {
	if f == nil || len(f.Metric) == 0 {
		return -1, -1
	}
	for _, m := range f.Metric {
		if m.Histogram == nil {
			return -1, -1
		}
		count += float64(m.Histogram.GetSampleCount())
		sum += m.Histogram.GetSampleSum()
	}
	return count, sum
}

// maxOf takes the fullest rank's value; -1 when absent.
func maxOf(f *dto.MetricFamily) float64 {
	if f == nil || len(f.Metric) == 0 {
		return -1
	}
	x := value(f.Metric[0])
	for _, m := range f.Metric[1:] {
		x = max(x, value(m))
	}
	return x
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// Slots is llama.cpp's /slots reading.
type Slots struct {
	Total, Processing int
	// NCtx is the context size of a slot (0 when not reported).
	NCtx int
}

// ParseSlots parses llama.cpp server's GET /slots: a JSON array of slots,
// each with "id", "n_ctx" and "is_processing" (older servers report "state",
// 0 idle and non-zero busy).
func ParseSlots(r io.Reader) (Slots, error) {
	var raw []struct {
		NCtx         int   `json:"n_ctx"`
		IsProcessing *bool `json:"is_processing"`
		State        *int  `json:"state"`
	}
	if err := json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(&raw); err != nil {
		return Slots{}, fmt.Errorf("parse /slots: %w", err)
	}
	if len(raw) > MaxRequests {
		return Slots{}, fmt.Errorf("parse /slots: %d slots, more than any engine runs (%d)", len(raw), MaxRequests)
	}
	s := Slots{Total: len(raw)}
	for _, sl := range raw {
		if (sl.IsProcessing != nil && *sl.IsProcessing) || (sl.IsProcessing == nil && sl.State != nil && *sl.State != 0) {
			s.Processing++
		}
		s.NCtx = max(s.NCtx, sl.NCtx)
	}
	// A context beyond any model's is not reported.
	s.NCtx = max(boundedInt(s.NCtx, MaxContextTokens), 0)
	return s, nil
}
