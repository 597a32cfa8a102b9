package emulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/engine"
)

func newLoRAServer(t *testing.T, maxLoras int, mods ...string) (*Server, string) {
	t.Helper()
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithLoRA(maxLoras, 0); err != nil {
		t.Fatal(err)
	}
	var l LoRAModules
	for _, m := range mods {
		if err := l.Set(m); err != nil {
			t.Fatal(err)
		}
	}
	s, hs := serve(t, Config{Preset: p, TimeScale: 50, LoRAModules: l})
	return s, hs.URL
}

// The emulator serves adapters as vLLM does: /v1/models lists them with
// their parent, a request for one is answered under its name with its own
// KV cache, and /metrics carries vllm:lora_requests_info, which the
// router's parser reads.
func TestLoRAServing(t *testing.T) {
	s, url := newLoRAServer(t, 2, "sql=/adapters/sql", `{"name":"chat","path":"/adapters/chat","base_model_name":"meta-llama/Llama-3.1-8B-Instruct"}`)
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := adapter.ParseModels(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := adapter.Adapters(ms); len(ms) != 3 || got["sql"] != s.Model() || got["chat"] != s.Model() {
		t.Fatalf("models %+v: adapters %v", ms, got)
	}

	prompt := strings.Repeat("an adapter's long shared prompt. ", 100)
	ask := func(model string) (cached int, name string) {
		r := completeOnce(t, url+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2, "ignore_eos": true})
		return r.Usage.PromptTokensDetails.CachedTokens, r.Model
	}
	for i, c := range []struct {
		model  string
		cached bool
	}{{"sql", false}, {"sql", true}, {"chat", false}, {s.Model(), false}, {"chat", true}} {
		cached, name := ask(c.model)
		if (cached > 0) != c.cached || name != c.model {
			t.Errorf("request %d (%s): %d cached tokens, answered as %q; want cached=%v", i, c.model, cached, name, c.cached)
		}
	}
	if got := s.Stats().LoRALoads; got != 2 {
		t.Errorf("%d adapter loads, want 2 (sql, chat)", got)
	}

	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	st, err := adapter.ParseMetrics(resp.Body, adapter.VLLM)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st.LoRA == nil || st.LoRA.Max != 2 || len(st.LoRA.Running) != 0 {
		t.Errorf("lora_requests_info of an idle engine: %+v", st.LoRA)
	}
	bad := post(t, t.Context(), url+"/v1/completions", map[string]any{"model": "other-lora", "prompt": "x"})
	defer bad.Body.Close()
	if bad.StatusCode != http.StatusNotFound {
		t.Errorf("unknown adapter: status %d", bad.StatusCode)
	}
}

// The gauge keeps a series per state; the latest (largest value) is the
// state now.
func TestLoRAHistory(t *testing.T) {
	h := newLoRAHistory()
	for i := range maxLoRASeries + 5 {
		h.series[[3]string{"4", "", strings.Repeat("a", i+1)}] = float64(i)
	}
	ch := make(chan prometheus.Metric, 2*maxLoRASeries)
	h.observe([3]string{"4", "", "now"}, time.Now(), ch)
	if len(h.series) != maxLoRASeries || len(ch) != maxLoRASeries {
		t.Errorf("%d series kept, want %d", len(h.series), maxLoRASeries)
	}
	best, at := "", -1.0
	for k, v := range h.series {
		if v > at {
			best, at = k[2], v
		}
	}
	if best != "now" {
		t.Errorf("latest series %q, want now", best)
	}
}

func TestParseLoRAModule(t *testing.T) {
	for _, c := range []struct {
		in   string
		want LoRAModule
		ok   bool
	}{
		{"sql=/p/sql", LoRAModule{Name: "sql", Path: "/p/sql"}, true},
		{`{"name":"a","path":"/p","base_model_name":"m"}`, LoRAModule{Name: "a", Path: "/p", Base: "m"}, true},
		{"sql", LoRAModule{}, false},
		{"=/p", LoRAModule{}, false},
		{"a,b=/p", LoRAModule{}, false},
		{`{"name":"a","path":"/p","rank":8}`, LoRAModule{}, false},
		{`{"name":"a","path":"/p"} x`, LoRAModule{}, false},
	} {
		got, err := ParseLoRAModule(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%q: %+v %v", c.in, got, err)
		}
	}
	p, _ := engine.LookupPreset(testPreset)
	if _, err := New(Config{Preset: p, LoRAModules: []LoRAModule{{Name: "a", Path: "/p"}}}); err == nil {
		t.Error("adapters accepted without --max-loras")
	}
}

// FuzzParseLoRAModule: whatever --lora-modules is given, parsing never
// panics and what it accepts can be served.
func FuzzParseLoRAModule(f *testing.F) {
	f.Add("sql=/p")
	f.Add(`{"name":"a","path":"/p","base_model_name":"m"}`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseLoRAModule(s)
		if err != nil {
			return
		}
		if m.Name == "" || m.Path == "" || strings.ContainsAny(m.Name, ", \t\n") {
			t.Fatalf("accepted %+v", m)
		}
		if _, err := json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	})
}
