package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/slo"
)

// seriesSum sums the values of the series of a /metrics page whose name
// and labels start with prefix.
func seriesSum(page, prefix string) float64 {
	sum := 0.0
	for line := range strings.SplitSeq(page, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// TestObjectivesLive: a request's objectives come from its headers; a
// malformed one is a 400 in the OpenAI shape; a sheddable request no
// backend can serve in time is refused at once with 429, Retry-After and
// the reason, and never reaches a backend; a client cannot make itself
// critical, a trusted front can; kvroute_slo_* count them all.
func TestObjectivesLive(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) {
		c.Objectives.InferenceObjectives = []config.InferenceObjective{{Name: "batch", Priority: -1}}
	})
	body := chat("shared", true, "hello")
	errOf := func(res result) (code string) {
		t.Helper()
		var e struct {
			Error struct {
				Code, Type, Message string
			}
		}
		if err := json.Unmarshal(res.body, &e); err != nil || e.Error.Message == "" {
			t.Fatalf("not an OpenAI error: %s", res.body)
		}
		return e.Error.Code
	}

	if res := r.post("/v1/chat/completions", body, slo.HeaderLLMDTTFT, "soon"); res.status != http.StatusBadRequest || errOf(res) != "invalid_slo" {
		t.Errorf("malformed objective: %d %s", res.status, res.body)
	}
	if res := r.post("/v1/chat/completions", body, slo.HeaderClass, "urgent"); res.status != http.StatusBadRequest || errOf(res) != "invalid_criticality" {
		t.Errorf("malformed criticality: %d %s", res.status, res.body)
	}

	// One microsecond: no backend is predicted to meet it.
	for _, hdr := range [][]string{
		{slo.HeaderTTFT, "0.001", slo.HeaderClass, "sheddable"},
		{slo.HeaderLLMDTTFT, "0.001", slo.HeaderObjective, "batch"},
	} {
		res := r.post("/v1/chat/completions", body, hdr...)
		if res.status != http.StatusTooManyRequests || errOf(res) != "slo_unattainable" || res.header.Get("Retry-After") == "" {
			t.Errorf("%v: %d %v %s", hdr, res.status, res.header, res.body)
		}
	}
	if n := r.backends[0].hits.Load(); n != 0 {
		t.Errorf("a shed request reached the backend (%d requests)", n)
	}

	// Critical from a client is standard: served best effort, not shed.
	if res := r.post("/v1/chat/completions", body, slo.HeaderTTFT, "0.001", slo.HeaderClass, "critical"); res.status != http.StatusOK {
		t.Errorf("best effort: %d %s", res.status, res.body)
	}
	// A generous objective is met.
	if res := r.post("/v1/chat/completions", body, slo.HeaderTTFT, "60000", slo.HeaderITL, "60000"); res.status != http.StatusOK {
		t.Errorf("generous: %d %s", res.status, res.body)
	}
	// Without objectives nothing is counted.
	if res := r.post("/v1/chat/completions", body); res.status != http.StatusOK {
		t.Errorf("plain: %d", res.status)
	}

	page := string(r.get("/metrics").body)
	for _, c := range []struct {
		prefix string
		want   float64
	}{
		{`kvroute_slo_shed_total{criticality="sheddable"`, 2},
		{`kvroute_slo_requests_total{criticality="sheddable"`, 2},
		{`kvroute_slo_requests_total{criticality="standard"`, 2},
		{`kvroute_slo_requests_total{criticality="critical"`, 0},
		{`kvroute_slo_met_total{criticality="standard",model="shared",objective="both"}`, 1},
		{`kvroute_slo_met_total{criticality="standard",model="shared",objective="ttft"}`, 1},
		{`kvroute_slo_goodput_tokens_total{criticality="standard"`, 4},
		{`kvroute_slo_prediction_ratio_count{backend="b0",latency="ttft"}`, 2},
	} {
		if got := seriesSum(page, c.prefix); got != c.want {
			t.Errorf("%s: %v, want %v", c.prefix, got, c.want)
		}
	}
}

// TestCriticalityFromTrustedFront: a trusted front may raise a request to
// critical, and a critical request is served best effort, never shed.
func TestCriticalityFromTrustedFront(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) {
		c.Admission.TrustedPriorityCIDRs = []string{"127.0.0.0/8", "::1"}
		c.Objectives.Keys = []config.KeyObjective{{Key: "batch-key", Criticality: "sheddable"}}
	})
	body := chat("shared", true, "hello")
	res := r.post("/v1/chat/completions", body, "Authorization", "Bearer batch-key", slo.HeaderTTFT, "0.001", slo.HeaderClass, "critical")
	if res.status != http.StatusOK {
		t.Fatalf("critical from a trusted front: %d %s", res.status, res.body)
	}
	page := string(r.get("/metrics").body)
	if got := seriesSum(page, `kvroute_slo_requests_total{criticality="critical"`); got != 1 {
		t.Errorf("critical requests %v, want 1", got)
	}
	// The key's own class, without the header: sheddable, and shed.
	if res := r.post("/v1/chat/completions", body, "Authorization", "Bearer batch-key", slo.HeaderTTFT, "0.001"); res.status != http.StatusTooManyRequests {
		t.Errorf("the key's sheddable class: %d", res.status)
	}
}
