package proxy

import (
	"testing"
)

// TestRelayTeachesDecode: a complete stream's inter-token timings as
// relayed teach the backend that served it its decode step time (one
// sample of its cost model, fed at the settle); a JSON answer, whose
// tokens come at once, teaches nothing. The prompt is too short for its
// TTFT to teach anything (fleet.MinRateWork), and the fakes export no
// metrics, so the relay is the only feed here.
func TestRelayTeachesDecode(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	b := r.srv.Fleet().Snapshot().All[0]
	if res := r.post("/v1/chat/completions", chat("shared", false, "x")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	waitFor(t, "the JSON answer settled", func() bool { return b.Load().InFlight == 0 })
	if n := b.Cost().Fit().Samples; n != 0 {
		t.Fatalf("a JSON answer taught %d samples, want none", n)
	}
	if res := r.post("/v1/chat/completions", chat("shared", true, "x")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	waitFor(t, "the stream's decode sample", func() bool { return b.Cost().Fit().Samples == 1 })
	waitFor(t, "the stream settled", func() bool { return b.Load().InFlight == 0 })
	if n := b.Cost().Fit().Samples; n != 1 {
		t.Fatalf("a stream taught %d samples, want 1", n)
	}
}
