package workload

import (
	"math"
	"testing"
)

// TestObjectivesMix: the objectives workload's three kinds in their
// shares, each with its objectives, the batch ones long.
func TestObjectivesMix(t *testing.T) {
	reqs, err := Load("objectives", Options{Limit: 2000, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for i := range reqs {
		r := &reqs[i]
		switch r.Objective {
		case InteractiveObjective:
			n["interactive"]++
		case AgentObjective:
			n["agent"]++
		case BatchObjective:
			n["batch"]++
			if r.InputTokens < 6000 {
				t.Errorf("batch request %d of %d tokens", i, r.InputTokens)
			}
		default:
			t.Fatalf("request %d has objectives %+v", i, r.Objective)
		}
	}
	for kind, share := range map[string]float64{"interactive": 0.5, "agent": 0.3, "batch": 0.2} {
		if got := float64(n[kind]) / float64(len(reqs)); math.Abs(got-share) > 0.04 {
			t.Errorf("%s: %.3f of the requests, want %.2f", kind, got, share)
		}
	}
}
