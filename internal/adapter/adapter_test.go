package adapter

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func open(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		file string
		kind Kind
		want State
	}{
		{"vllm.prom", Unknown, State{Kind: VLLM, Running: 12, Waiting: 5, KVUsage: 0.42, PrefixHitRate: 0.25, BlockSize: 16, NumGPUBlocks: 27000, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"vllm.prom", VLLM, State{Kind: VLLM, Running: 12, Waiting: 5, KVUsage: 0.42, PrefixHitRate: 0.25, BlockSize: 16, NumGPUBlocks: 27000, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"vllm_v0.prom", Unknown, State{Kind: VLLM, Running: 3, Waiting: 0, KVUsage: 0.9, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"sglang.prom", Unknown, State{Kind: SGLang, Running: 7, Waiting: 2, KVUsage: 0.28, PrefixHitRate: 0.0075, BlockSize: -1, NumGPUBlocks: -1, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"llamacpp.prom", Unknown, State{Kind: LlamaCpp, Running: 4, Waiting: 9, KVUsage: -1, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1, PrefillTokens: 4096, PrefillSeconds: 2.048, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: 4096, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"vllm_itl.prom", Unknown, State{Kind: VLLM, Running: 8, Waiting: 3, KVUsage: -1, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: 400, DecodeSeconds: 6.5, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
		{"tgi.prom", TGI, State{Kind: TGI, Running: 32, Waiting: 6, KVUsage: -1, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1, PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1, ComputedTokens: -1, HostLoadTokens: -1, HostLoadSeconds: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+string(tt.kind), func(t *testing.T) {
			got, err := ParseMetrics(open(t, tt.file), tt.kind)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// llm-d's inference simulator names vLLM's prefix-cache counters without
// the _total suffix; both spellings read the same.
func TestParseMetricsCounterSuffix(t *testing.T) {
	for _, suffix := range []string{"_total", ""} {
		text := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n" +
			"# TYPE vllm:prefix_cache_hits" + suffix + " counter\nvllm:prefix_cache_hits" + suffix + " 30\n" +
			"# TYPE vllm:prefix_cache_queries" + suffix + " counter\nvllm:prefix_cache_queries" + suffix + " 120\n"
		got, err := ParseMetrics(strings.NewReader(text), Unknown)
		if err != nil {
			t.Fatalf("suffix %q: %v", suffix, err)
		}
		if got.PrefixHitRate != 0.25 {
			t.Errorf("suffix %q: PrefixHitRate = %v, want 0.25", suffix, got.PrefixHitRate)
		}
	}
}

// The engine's own prefill counters: vLLM's computed-token histogram
// when it has one, else its prompt tokens less its prefix-cache hits, over
// its prefill-time histogram.
func TestParseMetricsPrefill(t *testing.T) {
	const head = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
	const hist = "# TYPE vllm:request_prefill_time_seconds histogram\n" +
		"vllm:request_prefill_time_seconds_bucket{le=\"+Inf\"} 3\nvllm:request_prefill_time_seconds_sum 0.5\nvllm:request_prefill_time_seconds_count 3\n"
	const counters = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 12000\n" +
		"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 2000\n"
	const computed = "# TYPE vllm:request_prefill_kv_computed_tokens histogram\n" +
		"vllm:request_prefill_kv_computed_tokens_bucket{le=\"+Inf\"} 3\nvllm:request_prefill_kv_computed_tokens_sum 9000\nvllm:request_prefill_kv_computed_tokens_count 3\n"
	checkCounterPairs(t, "prefill", []counterCase{
		{"counters", head + hist + counters, 10000, 0.5},
		{"computed histogram wins", head + hist + counters + computed, 9000, 0.5},
		{"no prefill time", head + counters, -1, -1},
		{"llama.cpp", "llamacpp:requests_processing 1\nllamacpp:prompt_tokens_total 4096\nllamacpp:prompt_seconds_total 2\n", 4096, 2},
	}, func(s State) (float64, float64) { return s.PrefillTokens, s.PrefillSeconds })
}

// counterCase is an exposition and the pair of lifetime counters (tokens,
// seconds) it should give.
type counterCase struct {
	name            string
	text            string
	tokens, seconds float64
}

// checkCounterPairs parses each case, detecting the engine, and compares
// the pair of counters that pair reads off the State.
func checkCounterPairs(t *testing.T, what string, tests []counterCase, pair func(State) (float64, float64)) {
	t.Helper()
	for _, tt := range tests {
		got, err := ParseMetrics(strings.NewReader(tt.text), Unknown)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if tokens, seconds := pair(got); tokens != tt.tokens || seconds != tt.seconds {
			t.Errorf("%s: %s %v tokens in %v s, want %v in %v", tt.name, what, tokens, seconds, tt.tokens, tt.seconds)
		}
	}
}

// The engine's own decode timing: vLLM's and SGLang's inter-token latency
// histogram (vLLM's older time_per_output_token_seconds when it has no
// other), llama.cpp's predicted-token counters.
func TestParseMetricsDecode(t *testing.T) {
	const head = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
	hist := func(name string, sum float64, count int) string {
		return fmt.Sprintf("# TYPE %[1]s histogram\n%[1]s_bucket{le=\"+Inf\"} %[3]d\n%[1]s_sum %[2]g\n%[1]s_count %[3]d\n", name, sum, count)
	}
	checkCounterPairs(t, "decode", []counterCase{
		{"vLLM inter-token latency", head + hist("vllm:inter_token_latency_seconds", 2.5, 250), 250, 2.5},
		{"vLLM time per output token, older", head + hist("vllm:time_per_output_token_seconds", 1.5, 100), 100, 1.5},
		{"vLLM inter-token latency wins", head + hist("vllm:time_per_output_token_seconds", 1.5, 100) + hist("vllm:inter_token_latency_seconds", 2.5, 250), 250, 2.5},
		{"vLLM without either", head, -1, -1},
		{"SGLang", "sglang:num_running_reqs 2\n" + hist("sglang:inter_token_latency_seconds", 0.8, 40), 40, 0.8},
		{"llama.cpp", "llamacpp:requests_processing 1\nllamacpp:tokens_predicted_total 300\nllamacpp:tokens_predicted_seconds_total 6\n", 300, 6},
	}, func(s State) (float64, float64) { return s.DecodeTokens, s.DecodeSeconds })
}

func TestParseMetricsErrors(t *testing.T) {
	tests := []struct {
		name, text string
		kind       Kind
		want       string
	}{
		{"garbage", "this is { not prometheus", Unknown, "parse metrics"},
		{"no engine", "# TYPE go_goroutines gauge\ngo_goroutines 5\n", Unknown, "no vLLM"},
		{"wrong kind", "sglang:num_running_reqs 1\n", VLLM, "no vllm load metrics"},
		{"empty", "", Unknown, "no vLLM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseMetrics(strings.NewReader(tt.text), tt.kind)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want containing %q", err, tt.want)
			}
		})
	}
}

func TestParseKind(t *testing.T) {
	for _, s := range []string{"", "auto", "vllm", "sglang", "llamacpp", "tgi"} {
		if _, err := ParseKind(s); err != nil {
			t.Errorf("ParseKind(%q): %v", s, err)
		}
	}
	if _, err := ParseKind("triton"); err == nil {
		t.Error("ParseKind(triton) succeeded")
	}
}

func TestParseSlots(t *testing.T) {
	got, err := ParseSlots(open(t, "slots.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Slots{Total: 3, Processing: 2, NCtx: 8192}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	old, err := ParseSlots(strings.NewReader(`[{"id":0,"state":1},{"id":1,"state":0}]`))
	if err != nil || old.Processing != 1 || old.Total != 2 {
		t.Fatalf("legacy slots: %+v %v", old, err)
	}
	if _, err := ParseSlots(strings.NewReader(`{"not":"an array"}`)); err == nil {
		t.Fatal("object accepted as /slots")
	}
}

// fuzzSeeds are the expositions in testdata that seed FuzzParseMetrics.
var fuzzSeeds = []string{"vllm.prom", "vllm_v0.prom", "vllm_itl.prom", "sglang.prom", "llamacpp.prom", "tgi.prom"}

// FuzzParseMetrics: whatever an engine (or something pretending to be one)
// serves on /metrics, parsing never panics.
func FuzzParseMetrics(f *testing.F) {
	for _, name := range fuzzSeeds {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(hostile("1e17", "NaN", "+Inf", "600000000000000000", "16"))
	f.Add(`[{"n_ctx": 99999999999, "is_processing": true}]`)
	f.Fuzz(func(t *testing.T, text string) {
		for _, k := range []Kind{Unknown, VLLM, SGLang, LlamaCpp, TGI} {
			if s, err := ParseMetrics(strings.NewReader(text), k); err == nil {
				checkSane(t, s)
			}
		}
		if sl, err := ParseSlots(strings.NewReader(text)); err == nil {
			if sl.Total < 0 || sl.Total > MaxRequests || sl.Processing < 0 || sl.Processing > sl.Total || sl.NCtx < 0 || sl.NCtx > MaxContextTokens {
				t.Fatalf("slots beyond any engine: %+v", sl)
			}
		}
	})
}

// checkSane fails t unless every number of s is unknown (-1; 0 for the
// context length and the slot count) or a number a real engine could
// report, and lifetime counters are known or unknown with their seconds.
func checkSane(t *testing.T, s State) {
	t.Helper()
	in := func(name string, x, limit float64) {
		if x != -1 && !(x >= 0 && x <= limit) {
			t.Fatalf("%s = %v: neither unknown nor in [0, %v] (%+v)", name, x, limit, s)
		}
	}
	in("Running", s.Running, MaxRequests)
	in("Waiting", s.Waiting, MaxRequests)
	in("KVUsage", s.KVUsage, 1)
	in("PrefixHitRate", s.PrefixHitRate, 1)
	in("PrefillTokens", s.PrefillTokens, MaxCounter)
	in("PrefillSeconds", s.PrefillSeconds, MaxCounter)
	in("DecodeTokens", s.DecodeTokens, MaxCounter)
	in("DecodeSeconds", s.DecodeSeconds, MaxCounter)
	in("BlockSize", float64(s.BlockSize), MaxBlockSize)
	in("NumGPUBlocks", float64(s.NumGPUBlocks), MaxKVTokens)
	in("ContextLen", float64(s.ContextLen), MaxContextTokens)
	in("MaxNumSeqs", float64(s.MaxNumSeqs), MaxRequests)
	if s.ContextLen < 0 || s.MaxNumSeqs < 0 {
		t.Fatalf("ContextLen and MaxNumSeqs are 0 when unknown: %+v", s)
	}
	if (s.PrefillTokens < 0) != (s.PrefillSeconds < 0) || (s.DecodeTokens < 0) != (s.DecodeSeconds < 0) {
		t.Fatalf("a counter known without its seconds: %+v", s)
	}
	if l := s.LoRA; l != nil {
		if l.Max < 0 || l.Max > MaxLoRAs || l.Used < 0 || len(l.Running) > MaxLoRAs || len(l.Waiting) > MaxLoRAs || (!l.Named && l.Used > l.Max) {
			t.Fatalf("LoRA report beyond any engine: %+v", l)
		}
		for _, n := range append(slices.Clone(l.Running), l.Waiting...) {
			if n == "" || len(n) > MaxAdapterName {
				t.Fatalf("adapter name %q", n)
			}
		}
	}
	if s.BlockSize > 0 && s.NumGPUBlocks > 0 && int64(s.BlockSize)*int64(s.NumGPUBlocks) > MaxKVTokens {
		t.Fatalf("KV cache of %d x %d tokens, beyond any engine", s.NumGPUBlocks, s.BlockSize)
	}
}

// hostile is a vLLM exposition with the given waiting count, running
// count, KV usage, num_gpu_blocks and block_size, as text.
func hostile(waiting, running, kv, blocks, blockSize string) string {
	return "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting " + waiting + "\n" +
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running " + running + "\n" +
		"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc " + kv + "\n" +
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"" + blockSize + "\",num_gpu_blocks=\"" + blocks + "\"} 1\n" +
		"# TYPE vllm:request_prefill_time_seconds histogram\nvllm:request_prefill_time_seconds_bucket{le=\"+Inf\"} 1\n" +
		"vllm:request_prefill_time_seconds_sum NaN\nvllm:request_prefill_time_seconds_count 1\n" +
		"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 1e300\n"
}

// An engine's numbers that no engine could report are unknown, not load:
// a waiting queue of 1e17 attracted every request (its product with the
// mean prompt overflowed), NaN and infinities became the minimum int, and
// num_gpu_blocks of 6e17 overflowed the KV capacity negative.
func TestParseMetricsHostileNumbers(t *testing.T) {
	tests := []struct {
		name                             string
		waiting, running, kv, blocks, bs string
	}{
		{"huge", "1e17", "1e17", "7", "600000000000000000", "16"},
		{"NaN", "NaN", "NaN", "NaN", "27000", "99999999"},
		{"+Inf", "+Inf", "+Inf", "+Inf", "-5", "16"},
		{"-Inf", "-Inf", "-Inf", "-Inf", "5000000000", "65536"},
		{"negative", "-3", "-0.5", "-0.1", "1", "-16"},
		{"just past", "1048577", "2e6", "1.0001", "68719476737", "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseMetrics(strings.NewReader(hostile(tt.waiting, tt.running, tt.kv, tt.blocks, tt.bs)), VLLM)
			if err != nil {
				t.Fatal(err)
			}
			checkSane(t, s)
			if s.Waiting != -1 || s.Running != -1 || s.KVUsage != -1 {
				t.Fatalf("running %v, waiting %v, KV usage %v: want all unknown (-1)", s.Running, s.Waiting, s.KVUsage)
			}
			if s.PrefillTokens != -1 || s.PrefillSeconds != -1 {
				t.Fatalf("prefill counters %v over %v s: want unknown", s.PrefillTokens, s.PrefillSeconds)
			}
			if s.BlockSize > 0 && s.NumGPUBlocks > 0 {
				t.Fatalf("KV cache of %d blocks of %d tokens taken as known", s.NumGPUBlocks, s.BlockSize)
			}
		})
	}
	// The largest figures of a real engine stay.
	s, err := ParseMetrics(strings.NewReader(hostile("1048576", "1024", "1", "4294967296", "16")), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != MaxRequests || s.Running != 1024 || s.KVUsage != 1 || s.NumGPUBlocks != 1<<32 || s.BlockSize != 16 {
		t.Fatalf("real figures lost: %+v", s)
	}
}

// The engine's lifetime count of prompt tokens it computed, whether or
// not it exports a prefill time: vLLM's computed-token histogram, else
// its prompt tokens less its prefix-cache hits; SGLang's prompt tokens
// less its cached ones over every cache source; llama.cpp's prompt tokens,
// which are those it evaluated. Unknown without the counts.
func TestParseMetricsComputed(t *testing.T) {
	const vllm = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
	const counters = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 12000\n" +
		"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 2000\n"
	const computed = "# TYPE vllm:request_prefill_kv_computed_tokens histogram\n" +
		"vllm:request_prefill_kv_computed_tokens_bucket{le=\"+Inf\"} 3\nvllm:request_prefill_kv_computed_tokens_sum 9000\nvllm:request_prefill_kv_computed_tokens_count 3\n"
	const sgl = "sglang:num_running_reqs 2\n# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total 5000\n"
	const sglCached = "# TYPE sglang:cached_tokens_total counter\n" +
		"sglang:cached_tokens_total{cache_source=\"device\"} 1500\nsglang:cached_tokens_total{cache_source=\"host\"} 500\n"
	for _, tt := range []struct {
		name string
		text string
		want float64
	}{
		{"vLLM counters, no prefill time", vllm + counters, 10000},
		{"vLLM computed histogram wins", vllm + counters + computed, 9000},
		{"vLLM without hits", vllm + "vllm:prompt_tokens_total 12000\n", -1},
		{"SGLang", sgl + sglCached, 3000},
		{"SGLang without cached count", sgl, -1},
		{"llama.cpp", "llamacpp:requests_processing 1\nllamacpp:prompt_tokens_total 4096\n", 4096},
		{"TGI", "tgi_queue_size 1\ntgi_batch_current_size 2\n", -1},
		{"hostile", vllm + computed[:len(computed)-len("9000\nvllm:request_prefill_kv_computed_tokens_count 3\n")] + "NaN\n", -1},
	} {
		got, err := ParseMetrics(strings.NewReader(tt.text), Unknown)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got.ComputedTokens != tt.want {
			t.Errorf("%s: ComputedTokens %v, want %v", tt.name, got.ComputedTokens, tt.want)
		}
	}
}

// vLLM's OffloadingConnector: the tokens loaded from the CPU tier
// (external prefix cache hits) and the loads' time, the CPU-to-GPU
// direction only.
func TestParseHostLoad(t *testing.T) {
	const prom = `vllm:num_requests_running{engine="0"} 1
vllm:external_prefix_cache_hits_total{engine="0"} 4096
vllm:kv_offload_total_time_total{engine="0",transfer_type="CPU_to_GPU"} 0.25
vllm:kv_offload_total_time_total{engine="0",transfer_type="GPU_to_CPU"} 9
`
	st, err := ParseMetrics(strings.NewReader(prom), Unknown)
	if err != nil {
		t.Fatal(err)
	}
	if st.HostLoadTokens != 4096 || st.HostLoadSeconds != 0.25 {
		t.Errorf("host load %g tokens in %g s, want 4096 in 0.25", st.HostLoadTokens, st.HostLoadSeconds)
	}
}
