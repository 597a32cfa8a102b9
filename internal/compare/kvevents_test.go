package compare

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/internal/workload"
)

// TestKVEventsRuns: with KVEvents, each policy runs twice, approximately
// and on the engines' events, and both runs complete every request.
func TestKVEventsRuns(t *testing.T) {
	engines, reqs := twoEngineChat(t, workload.Options{Limit: 40, Seed: 3}, 0.5)
	rep, err := Run(context.Background(), reqs, Config{Engines: engines, TimeScale: 4, Policies: []string{"kvroute"}, KVEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rep.Runs {
		names = append(names, r.Policy)
	}
	if len(names) != 2 || names[0] != "kvroute" || names[1] != "kvroute+precise" {
		t.Fatalf("runs %v, want kvroute and kvroute+precise", names)
	}
	for _, r := range rep.Runs {
		if r.Completed != len(reqs) || r.Errors != 0 {
			t.Errorf("%s: %d completed, %d errors of %d", r.Policy, r.Completed, r.Errors, len(reqs))
		}
	}
}
