package emulator

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/adapter"
)

// scrape returns the server's /metrics exposition.
func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parse(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// The request-level metrics, named, typed, labelled and bucketed as vLLM
// v1 exports them, one observation per finished request.
func TestRequestMetrics(t *testing.T) {
	s, hs := newTestServer(t, 50)
	var computed int
	for i, extra := range []map[string]any{
		{"max_tokens": 3, "ignore_eos": true},
		{"max_tokens": 5, "ignore_eos": true},
		{"max_tokens": 4000},
	} {
		b := map[string]any{"model": s.Model(), "prompt": strings.Repeat("request metrics ", 60+i)}
		for k, v := range extra {
			b[k] = v
		}
		u := completeOnce(t, hs.URL+"/v1/completions", b).Usage
		cached := 0
		if u.PromptTokensDetails != nil {
			cached = u.PromptTokensDetails.CachedTokens
		}
		computed += u.PromptTokens - cached
	}
	fams, err := parse(scrape(t, hs.URL))
	if err != nil {
		t.Fatal(err)
	}
	one := func(name string, typ dto.MetricType) *dto.Metric {
		t.Helper()
		f := fams[name]
		if f == nil || f.GetType() != typ || len(f.Metric) == 0 {
			t.Fatalf("%s: %v, want a %s", name, f, typ)
		}
		return f.Metric[0]
	}
	sums := map[string]float64{}
	for _, name := range []string{"vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
		"vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
		"vllm:request_prefill_kv_computed_tokens"} {
		m := one(name, dto.MetricType_HISTOGRAM)
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model_name"] != s.Model() || labels["engine"] != engineIndex {
			t.Errorf("%s labels %v, want model_name=%q engine=%s", name, labels, s.Model(), engineIndex)
		}
		var bounds []float64
		for _, b := range m.Histogram.Bucket {
			if !math.IsInf(b.GetUpperBound(), 1) {
				bounds = append(bounds, b.GetUpperBound())
			}
		}
		want := RequestLatencyBuckets
		if name == "vllm:request_prefill_kv_computed_tokens" {
			// vLLM's 1-2-5 buckets up to the context length.
			want = tokenBuckets(s.Preset().MaxModelLen)
			if want[0] != 1 || want[len(want)-1] > float64(s.Preset().MaxModelLen) || len(want) < 3*int(math.Log10(float64(s.Preset().MaxModelLen))) {
				t.Errorf("1-2-5 buckets up to %d: %v", s.Preset().MaxModelLen, want)
			}
		}
		if !slices.Equal(bounds, want) {
			t.Errorf("%s buckets %v, want %v", name, bounds, want)
		}
		if n := m.Histogram.GetSampleCount(); n != 3 {
			t.Errorf("%s: %d observations, want one per request (3)", name, n)
		}
		sums[name] = m.Histogram.GetSampleSum()
	}
	if got := sums["vllm:request_prefill_kv_computed_tokens"]; got != float64(computed) {
		t.Errorf("prefill computed tokens %g, want the responses' uncached prompt tokens %d", got, computed)
	}
	// e2e = queue + inference, inference = prefill + decode (on the real
	// clock, all from the same four instants of each request).
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, a, b) }
	if e2e, q, inf := sums["vllm:e2e_request_latency_seconds"], sums["vllm:request_queue_time_seconds"], sums["vllm:request_inference_time_seconds"]; !near(e2e, q+inf) || inf <= 0 {
		t.Errorf("e2e %g, want queue %g + inference %g", e2e, q, inf)
	}
	if inf, pf, dec := sums["vllm:request_inference_time_seconds"], sums["vllm:request_prefill_time_seconds"], sums["vllm:request_decode_time_seconds"]; !near(inf, pf+dec) || pf <= 0 || dec <= 0 {
		t.Errorf("inference %g, want prefill %g + decode %g, both positive", inf, pf, dec)
	}
	f := fams["vllm:request_success_total"]
	if f == nil || f.GetType() != dto.MetricType_COUNTER {
		t.Fatalf("vllm:request_success_total: %v", f)
	}
	reasons := map[string]float64{}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == "finished_reason" {
				reasons[l.GetValue()] = m.Counter.GetValue()
			}
		}
	}
	if want := map[string]float64{"stop": 1, "length": 2, "abort": 0}; !maps(reasons, want) {
		t.Errorf("request_success_total by finished_reason %v, want %v", reasons, want)
	}
}

func maps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The round trip the router depends on: the adapter reads the emulated
// engine's own prefill throughput from its exposition (computed tokens
// over prefill seconds), on the real clock, and it is no faster than the
// engine's preset can prefill.
func TestPrefillRateRoundTrip(t *testing.T) {
	const scale = 50
	s, hs := newTestServer(t, scale)
	for i := range 3 {
		b := map[string]any{"model": s.Model(), "prompt": strings.Repeat("round trip ", 300+50*i), "max_tokens": 2, "ignore_eos": true}
		completeOnce(t, hs.URL+"/v1/completions", b)
	}
	body := scrape(t, hs.URL)
	st, err := adapter.ParseMetrics(bytes.NewReader(body), adapter.Unknown)
	if err != nil {
		t.Fatal(err)
	}
	fams, err := parse(body)
	if err != nil {
		t.Fatal(err)
	}
	computed := fams["vllm:request_prefill_kv_computed_tokens"].Metric[0].Histogram.GetSampleSum()
	seconds := fams["vllm:request_prefill_time_seconds"].Metric[0].Histogram.GetSampleSum()
	if st.Kind != adapter.VLLM || st.PrefillTokens != computed || st.PrefillSeconds != seconds || computed <= 0 || seconds <= 0 {
		t.Fatalf("adapter read %s, %g tokens in %gs; the exposition has %g in %gs", st.Kind, st.PrefillTokens, st.PrefillSeconds, computed, seconds)
	}
	if rate, most := st.PrefillTokens/st.PrefillSeconds, s.Preset().PrefillTokensPerSec()*scale; rate > most {
		t.Errorf("engine-reported prefill rate %.0f tokens/s on the real clock, faster than the preset at this time scale (%.0f)", rate, most)
	}
}
