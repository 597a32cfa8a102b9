package adapter

import (
	"reflect"
	"strings"
	"testing"
)

// vLLM's gauge keeps a series for every state it was ever in: the state
// is the latest series (the largest value, a time), not the first or the
// last listed.
func TestParseLoRAvLLM(t *testing.T) {
	s, err := ParseMetrics(open(t, "vllm_lora.prom"), Unknown)
	if err != nil {
		t.Fatal(err)
	}
	want := &LoRA{Running: []string{"sql-lora", "chat-lora"}, Waiting: []string{"math-lora", "sql-lora"}, Named: true, Max: 4, Used: 3}
	if !reflect.DeepEqual(s.LoRA, want) {
		t.Fatalf("LoRA %+v, want %+v", s.LoRA, want)
	}
	plain, err := ParseMetrics(open(t, "vllm.prom"), VLLM)
	if err != nil || plain.LoRA != nil {
		t.Fatalf("an engine without LoRA: %+v %v", plain.LoRA, err)
	}
}

func TestParseLoRASGLang(t *testing.T) {
	s, err := ParseMetrics(open(t, "sglang_lora.prom"), Unknown)
	if err != nil {
		t.Fatal(err)
	}
	if want := (&LoRA{Max: 4, Used: 2}); !reflect.DeepEqual(s.LoRA, want) {
		t.Fatalf("LoRA %+v, want %+v", s.LoRA, want)
	}
}

// Names are split on commas, trimmed, without empties or repeats, and a
// report beyond any engine's is dropped or cut.
func TestParseLoRAHostile(t *testing.T) {
	info := func(max, running, waiting, value string) string {
		return "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n" +
			"# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"" + max +
			"\",running_lora_adapters=\"" + running + "\",waiting_lora_adapters=\"" + waiting + "\"} " + value + "\n"
	}
	s, err := ParseMetrics(strings.NewReader(info("2", " a,,a , b,", ",", "NaN")), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	if s.LoRA == nil || !reflect.DeepEqual(s.LoRA.Running, []string{"a", "b"}) || s.LoRA.Waiting != nil || s.LoRA.Used != 2 {
		t.Fatalf("LoRA %+v", s.LoRA)
	}
	for _, max := range []string{"-1", "x", "100000"} {
		s, err := ParseMetrics(strings.NewReader(info(max, "a", "", "1")), VLLM)
		if err != nil || s.LoRA != nil {
			t.Errorf("max_lora %q: LoRA %+v (%v), want none", max, s.LoRA, err)
		}
	}
	many := strings.Repeat("x,", 10) + strings.Repeat("y", MaxAdapterName+1)
	for i := range MaxLoRAs + 10 {
		many += ",n" + strings.Repeat("z", i%3) + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	s, err = ParseMetrics(strings.NewReader(info("4", many, "", "1")), VLLM)
	if err != nil || s.LoRA == nil || len(s.LoRA.Running) != MaxLoRAs || s.LoRA.Running[0] != "x" {
		t.Fatalf("a list of %d names: %v %v", strings.Count(many, ",")+1, s.LoRA, err)
	}
	sgl := "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n# TYPE sglang:lora_pool_slots_used gauge\nsglang:lora_pool_slots_used 5\n# TYPE sglang:lora_pool_slots_total gauge\nsglang:lora_pool_slots_total 4\n"
	if s, err := ParseMetrics(strings.NewReader(sgl), SGLang); err != nil || s.LoRA != nil {
		t.Errorf("5 of 4 slots used: %+v %v", s.LoRA, err)
	}
}

func TestParseModels(t *testing.T) {
	body := `{"object":"list","data":[
		{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":131072},
		{"id":"sql-lora","object":"model","owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null},
		{"id":"","parent":"x"},
		{"id":"self","parent":"self"},
		{"id":"llama","meta":{"n_ctx":8192}},
		{"id":"huge","max_model_len":99999999999}]}`
	ms, err := ParseModels(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var got []Model
	for _, m := range ms {
		if len(m.Raw) == 0 {
			t.Errorf("%s: raw entry lost", m.ID)
		}
		m.Raw = nil
		got = append(got, m)
	}
	want := []Model{
		{ID: "meta-llama/Llama-3.1-8B-Instruct", MaxModelLen: 131072},
		{ID: "sql-lora", Parent: "meta-llama/Llama-3.1-8B-Instruct"},
		{ID: "llama", MaxModelLen: 8192},
		{ID: "huge"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if a := Adapters(ms); !reflect.DeepEqual(a, map[string]string{"sql-lora": "meta-llama/Llama-3.1-8B-Instruct"}) {
		t.Errorf("adapters %v", a)
	}
	if _, err := ParseModels(strings.NewReader(`{"data":{}}`)); err == nil {
		t.Error("an object for data accepted")
	}
}

// FuzzParseModels: whatever an engine serves on /v1/models, parsing never
// panics and keeps nothing beyond its bounds.
func FuzzParseModels(f *testing.F) {
	f.Add(`{"object":"list","data":[{"id":"base","max_model_len":4096},{"id":"a","parent":"base"}]}`)
	f.Add(`{"data":[{"id":"x","meta":{"n_ctx":-5}},{"id":"y","parent":7}]}`)
	f.Fuzz(func(t *testing.T, text string) {
		ms, err := ParseModels(strings.NewReader(text))
		if err != nil {
			return
		}
		if len(ms) > MaxModels {
			t.Fatalf("%d models", len(ms))
		}
		for _, m := range ms {
			if m.ID == "" || m.ID == m.Parent || len(m.ID) > MaxAdapterName || len(m.Parent) > MaxAdapterName || m.MaxModelLen < 0 || m.MaxModelLen > MaxContextTokens {
				t.Fatalf("model beyond bounds: %+v", m)
			}
		}
	})
}

func init() {
	// The LoRA expositions seed FuzzParseMetrics too.
	fuzzSeeds = append(fuzzSeeds, "vllm_lora.prom", "sglang_lora.prom")
}

// Series of the same time are read together: llm-d's simulator sets the
// gauge to whole seconds, and the exposition sorts series by label, so
// the one listed first is not the latest.
func TestParseLoRASameSecond(t *testing.T) {
	body := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n# TYPE vllm:lora_requests_info gauge\n" +
		"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7e+09\n" +
		"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 1.8e+09\n" +
		"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"c\"} 1.8e+09\n" +
		"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"d\",waiting_lora_adapters=\"\"} 1.6e+09\n"
	s, err := ParseMetrics(strings.NewReader(body), VLLM)
	if err != nil {
		t.Fatal(err)
	}
	want := NamedLoRA([]string{"a", "b"}, []string{"c"}, 2)
	if !reflect.DeepEqual(s.LoRA, want) {
		t.Fatalf("LoRA %+v, want %+v", s.LoRA, want)
	}
}
