package bench

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/report"
)

// TestJudgeBlame: the failures and losses a fault is blamed for are
// counted apart from the router's own, shown in their interval, and fail
// the soak with a problem of their own; a clean refusal is neither.
func TestJudgeBlame(t *testing.T) {
	at := func(s time.Duration) time.Duration { return s * time.Second }
	samples := []report.Sample{
		{Start: at(0), TTFT: time.Second, Status: http.StatusOK},
		{Start: at(1), Status: http.StatusTooManyRequests, Err: "HTTP 429: queue full"},
		{Start: at(1), Status: http.StatusBadGateway, Err: "HTTP 502: router's own"},
		{Start: at(2), Status: http.StatusOK, Err: "stream broken", Backend: "engine-0"},
		{Start: at(3), Err: "Post: context deadline exceeded", Backend: "engine-0"},
		{Start: at(3), Err: "Post: context deadline exceeded"},
	}
	blame := func(s *report.Sample) bool { return s.Backend == "engine-0" }
	cfg := SoakConfig{Duration: 4 * time.Second, Interval: 2 * time.Second, Grace: time.Second, Blame: blame}
	var res SoakResult
	res.judge(samples, nil, cfg)
	if res.Completed != 1 || res.Rejected != 1 || res.Failed != 1 || res.Lost != 1 || res.FaultFailed != 2 {
		t.Errorf("completed %d rejected %d failed %d lost %d fault's %d, want 1 1 1 1 2", res.Completed, res.Rejected, res.Failed, res.Lost, res.FaultFailed)
	}
	if w := res.Windows[1]; w.Failed != 1 || w.Lost != 2 {
		t.Errorf("second interval: failed %d lost %d, want 1 and 2", w.Failed, w.Lost)
	}
	if res.FirstFailure != "HTTP 502: router's own" || res.FirstFaultFailure != "stream broken" {
		t.Errorf("first failure %q, first of the fault %q", res.FirstFailure, res.FirstFaultFailure)
	}
	var fault bool
	for _, p := range res.Problems {
		fault = fault || strings.Contains(p, "2 requests failed or were lost because of the injected fault")
	}
	if !fault {
		t.Errorf("problems %q name no failure of the fault", res.Problems)
	}

	// Without a fault every one is the router's.
	res = SoakResult{}
	cfg.Blame = nil
	res.judge(samples, nil, cfg)
	if res.Failed != 2 || res.Lost != 2 || res.FaultFailed != 0 {
		t.Errorf("no fault: failed %d lost %d fault's %d, want 2 2 0", res.Failed, res.Lost, res.FaultFailed)
	}
}
