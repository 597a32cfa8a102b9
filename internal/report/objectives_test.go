package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/slo"
)

// TestSummarizeSLO: attainment per criticality counts refused requests as
// missed, goodput is per second of arrivals, and the prediction's error is
// observed over predicted.
func TestSummarizeSLO(t *testing.T) {
	crit := slo.Objective{TTFT: time.Second, ITL: 50 * time.Millisecond, Class: slo.Critical}
	shed := slo.Objective{TTFT: 4 * time.Second, Class: slo.Sheddable}
	ms := time.Millisecond
	samples := []Sample{
		// Met both: TTFT 500 ms, 10 gaps over 400 ms: 40 ms a token.
		{Start: 0, TTFT: 500 * ms, E2E: 900 * ms, OutputTokens: 11, Objective: crit, PredTTFT: 0.25, PredITL: 0.02},
		// Met both: 40 ms a token.
		{Start: time.Second, TTFT: 800 * ms, E2E: 1200 * ms, OutputTokens: 11, Objective: crit, PredTTFT: 0.8, PredITL: 0.04},
		// TTFT missed.
		{Start: 2 * time.Second, TTFT: 2 * time.Second, E2E: 2100 * ms, OutputTokens: 11, Objective: crit},
		// Refused, and failed.
		{Start: 3 * time.Second, Err: "shed", Shed: true, Objective: shed},
		{Start: 4 * time.Second, Err: "502", Objective: shed},
		// No objective: not counted, but its arrival spans the run.
		{Start: 5 * time.Second, TTFT: ms, E2E: ms, OutputTokens: 1},
	}
	r := Summarize("p", samples, 10*time.Second)
	s := r.SLO
	if s == nil || s.Requests != 5 {
		t.Fatalf("SLO %+v", s)
	}
	c := s.Class(slo.Critical)
	if c.Requests != 3 || c.Served != 3 || c.MetTTFT != 2 || c.MetITL != 3 || c.MetBoth != 2 {
		t.Errorf("critical %+v", c)
	}
	if sh := s.Class(slo.Sheddable); sh.Requests != 2 || sh.Shed != 1 || sh.Served != 0 || sh.Attainment() != 0 {
		t.Errorf("sheddable %+v", sh)
	}
	if s.Attainment != 2.0/5 || s.Goodput != 2.0/5 || s.GoodputTokS != 22.0/5 {
		t.Errorf("attainment %v goodput %v tok/s %v", s.Attainment, s.Goodput, s.GoodputTokS)
	}
	if s.TTFTError.N != 2 || s.TTFTError.P10 != 1 || s.TTFTError.P90 != 2 {
		t.Errorf("TTFT error %+v", s.TTFTError)
	}
	var b bytes.Buffer
	WriteTable(&b, &Report{Runs: []Run{r}})
	if !strings.Contains(b.String(), "goodput req/s") || !strings.Contains(b.String(), "66.7%") {
		t.Errorf("table:\n%s", b.String())
	}
	if Summarize("p", samples[5:], time.Second).SLO != nil {
		t.Error("an SLO summary without objectives")
	}
}
