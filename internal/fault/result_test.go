package fault

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
)

const ms10 = 10 * time.Millisecond

// stream is a completed stream on backend starting at start (wall clock)
// with a first token after ttft and then itl.
func stream(backend string, start, ttft time.Duration, prompt int, itl ...time.Duration) report.Sample {
	var e2e time.Duration
	for _, g := range itl {
		e2e += g
	}
	return report.Sample{Backend: backend, Start: start, TTFT: ttft, E2E: ttft + e2e, ITL: itl, PromptTokens: prompt, Status: http.StatusOK}
}

// TestSum: the arithmetic over a run's samples. The fault begins at 1s;
// engine-0 was faulted. Gaps are wall clock, reported at time scale 2.
func TestSum(t *testing.T) {
	p := engine.Preset{StepOverhead: 5 * time.Millisecond, PerPrefillToken: time.Millisecond}
	refused := func(s *report.Sample) bool { return s.Status == http.StatusTooManyRequests }
	samples := []report.Sample{
		// Streaming across the fault on engine-0: its tokens at 0.9,
		// 0.91, 0.92, then 0.92 + 0.2 (the move: a gap of 200 ms whose
		// end is after the fault), 1.13. Median gap 10 ms: added
		// 190 ms wall, 380 ms emulated; the context: 100 + 3 tokens,
		// bound 5 + 103 + 100 = 208 ms: over.
		stream("engine-0", 800*time.Millisecond, 100*time.Millisecond, 100, ms10, ms10, 200*time.Millisecond, ms10),
		// Across the fault with a short gap: added 10 ms wall (20 ms
		// emulated) of a bound 5 + 1004 + 100 ms (its gap after 4 tokens):
		// within.
		stream("engine-0", 900*time.Millisecond, 50*time.Millisecond, 1000, ms10, ms10, ms10, 20*time.Millisecond, ms10, ms10, ms10, ms10),
		// On engine-0 but over before the fault.
		stream("engine-0", 0, 100*time.Millisecond, 100, ms10, ms10, ms10),
		// On engine-0, its first token after the fault: nothing to move.
		stream("engine-0", time.Second, 100*time.Millisecond, 100, ms10, ms10, ms10),
		// Across the fault on an engine not faulted.
		stream("engine-1", 800*time.Millisecond, 100*time.Millisecond, 100, ms10, ms10, 500*time.Millisecond, ms10),
		// Errors: two alike, then three more distinct; only three kept.
		{Status: http.StatusBadGateway, Err: "HTTP 502: bad"},
		{Status: http.StatusBadGateway, Err: "HTTP 502: bad"},
		{Status: http.StatusOK, Err: "stream broken"},
		{Status: 0, Err: "connection reset"},
		{Status: http.StatusInternalServerError, Err: "HTTP 500"},
		// A clean refusal.
		{Status: http.StatusTooManyRequests, Err: "HTTP 429: queue full"},
	}
	faulted := map[string]bool{"engine-0": true}
	got := sum(Result{Kind: Kill, At: time.Second}, samples, faulted, p, 2, refused)
	want := Result{Kind: Kill, At: time.Second, Requests: 11, Errors: 5, Refused: 1,
		Why: []string{"502 HTTP 502: bad", "200 stream broken", "0 connection reset"},
		Hit: 2, Added50: 380 * time.Millisecond, Added99: 380 * time.Millisecond, Bound99: 1109 * time.Millisecond, Over: 1}
	if got.Requests != want.Requests || got.Errors != want.Errors || got.Refused != want.Refused || !slices.Equal(got.Why, want.Why) {
		t.Errorf("requests %d errors %d refused %d why %q, want %d %d %d %q", got.Requests, got.Errors, got.Refused, got.Why,
			want.Requests, want.Errors, want.Refused, want.Why)
	}
	if got.Hit != want.Hit || got.Added50 != want.Added50 || got.Added99 != want.Added99 || got.Bound99 != want.Bound99 || got.Over != want.Over {
		t.Errorf("hit %d added p50 %v p99 %v bound p99 %v over %d, want %d %v %v %v %d", got.Hit, got.Added50, got.Added99, got.Bound99, got.Over,
			want.Hit, want.Added50, want.Added99, want.Bound99, want.Over)
	}

	// Without a classifier a refusal is an error, as compare counts it.
	if got := sum(Result{At: time.Second}, samples, faulted, p, 2, nil); got.Errors != 6 || got.Refused != 0 {
		t.Errorf("no classifier: errors %d refused %d, want 6 and 0", got.Errors, got.Refused)
	}
	// Nothing hit, nothing to report.
	if got := sum(Result{At: time.Second}, samples[4:5], faulted, p, 2, nil); got.Hit != 0 || got.Added99 != 0 || got.Bound99 != 0 {
		t.Errorf("unfaulted engine: %+v", got)
	}
}

// TestQuantile: q of a list, the last for 0.99 of a short one, 0 of none.
func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.5, 3}, {0.99, 5}, {1, 5}} {
		if got := quantile(slices.Clone(ds), tc.q); got != tc.want {
			t.Errorf("quantile %v = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of none = %v", got)
	}
}

// TestBlame: a failure is the fault's when it did not end before the
// fault began, on an engine the fault hit (or none known), and is not a
// clean refusal; nothing is before the fault began.
func TestBlame(t *testing.T) {
	in := New(Fault{Kind: Kill, At: time.Second}, engine.Preset{})
	in.SetRefused(func(s *report.Sample) bool { return s.Status == http.StatusServiceUnavailable })
	broken := report.Sample{Backend: "engine-0", Start: 900 * time.Millisecond, E2E: 200 * time.Millisecond, Status: http.StatusOK, Err: "stream broken"}
	in.faulted = map[string]bool{}
	if in.Blame(&broken) {
		t.Error("blamed before the fault began")
	}
	in.faulted["engine-0"] = true
	for _, tc := range []struct {
		name string
		s    report.Sample
		want bool
	}{
		{"broken across the fault", broken, true},
		{"no engine known", report.Sample{Start: 1200 * time.Millisecond, Status: 0, Err: "connection reset"}, true},
		{"no answer, sent before the fault", report.Sample{Start: 500 * time.Millisecond, Status: 0, Err: "context deadline exceeded"}, true},
		{"an error status before the fault", report.Sample{Start: 500 * time.Millisecond, Status: http.StatusBadGateway, Err: "HTTP 502"}, false},
		{"an error event, no end measured", report.Sample{Backend: "engine-0", Start: 500 * time.Millisecond, TTFT: 100 * time.Millisecond, Status: http.StatusOK, Err: "error in stream"}, true},
		{"completed", report.Sample{Backend: "engine-0", Start: 900 * time.Millisecond, E2E: time.Second, Status: http.StatusOK}, false},
		{"over before the fault", report.Sample{Backend: "engine-0", Start: 0, E2E: 500 * time.Millisecond, Status: http.StatusOK, Err: "broken"}, false},
		{"another engine", report.Sample{Backend: "engine-1", Start: 1200 * time.Millisecond, Status: http.StatusBadGateway, Err: "HTTP 502"}, false},
		{"a clean refusal", report.Sample{Start: 1200 * time.Millisecond, Status: http.StatusServiceUnavailable, Err: "HTTP 503"}, false},
	} {
		if got := in.Blame(&tc.s); got != tc.want {
			t.Errorf("%s: blamed %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCheck: the kinds and the durations a fault takes; StreamIdle only
// for a hang.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		f  Fault
		ok bool
	}{
		{Fault{Kind: Kill, At: time.Second}, true},
		{Fault{Kind: Restart, At: time.Second, DrainGrace: time.Second}, true},
		{Fault{Kind: "crash", At: time.Second}, false},
		{Fault{Kind: Hang}, false},
		{Fault{Kind: Restart, At: time.Second, DrainGrace: -1}, false},
	} {
		if err := tc.f.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.f, err)
		}
	}
	if d := (Fault{Kind: Hang, At: time.Second}).StreamIdle(); d != DefaultHangIdle {
		t.Errorf("hang: stream idle %v", d)
	}
	if d := (Fault{Kind: Kill, At: time.Second, HangIdle: time.Minute}).StreamIdle(); d != 0 {
		t.Errorf("kill: stream idle %v", d)
	}
}
