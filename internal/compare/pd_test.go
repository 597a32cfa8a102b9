package compare

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestPDRuns checks a comparison with roles runs each policy on the
// aggregated fleet and on the disaggregated one, whose engines take their
// roles and whose router splits requests over them, every request
// answered; and that a P/D policy runs on the disaggregated fleet only.
func TestPDRuns(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	reqs, _, err := sim.LoadAt("rag", workload.Options{Limit: 12, Seed: 5}, 0.3, sim.Capacity([]engine.Preset{p, p}))
	if err != nil {
		t.Fatal(err)
	}
	roles, err := sim.XPYD(2, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, reqs, Config{Engines: []engine.Preset{p, p}, Policies: []string{"kvroute", "least-loaded-pair"}, Roles: roles, TimeScale: 4})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rep.Runs {
		names = append(names, r.Policy)
		if r.Completed != len(reqs) || r.Errors != 0 {
			t.Errorf("%s: %d of %d completed, %d errors", r.Policy, r.Completed, len(reqs), r.Errors)
		}
	}
	want := []string{"kvroute", "kvroute+1p1d", "least-loaded-pair+1p1d"}
	if len(names) != len(want) {
		t.Fatalf("runs %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("runs %v, want %v", names, want)
		}
	}
}
