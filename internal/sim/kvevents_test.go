package sim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/report"
)

// TestKVEventsFaults runs chat on 4 engines approximately and precisely
// under each fault: the events must see what the router's history cannot
// (bypassing traffic, a wiped cache), and every run must be reproducible.
func TestKVEventsFaults(t *testing.T) {
	racetest.Heavy(t, "a 600-request run per fault in virtual time")
	engines, reqs := fixture(t, "chat", 4, 600, 0.7)
	tests := []struct {
		name   string
		faults Faults
		// precise must beat approximate's hit rate by at least this many
		// points (negative: may trail by that much).
		margin float64
	}{
		{"none", Faults{}, -0.5},
		{"bypass", Faults{Bypass: 0.3}, 1},
		{"restart", Faults{RestartAt: reqs[len(reqs)/2].At}, -0.5},
		{"capacity", Faults{CapacityFactor: 2}, -0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var jobs []Job
			for _, kv := range []*KVEvents{nil, {Delay: 20 * time.Millisecond}, {Delay: 20 * time.Millisecond}} {
				jobs = append(jobs, Job{Reqs: reqs, Config: Config{Engines: engines, Policy: policy.Default, Seed: 1, KVEvents: kv, Faults: tt.faults}})
			}
			runs, err := RunAll(jobs, 2)
			if err != nil {
				t.Fatal(err)
			}
			approx, precise := runs[0], runs[1]
			if a, b := encode(t, runs[1]), encode(t, runs[2]); a != b {
				t.Fatal("two precise runs of the same workload differ")
			}
			want := len(reqs)
			if tt.faults.Bypass > 0 {
				// About 30% went around the router and are not samples.
				if precise.Completed > want*8/10 || precise.Completed < want*6/10 {
					t.Errorf("%d of %d requests routed with 30%% bypassing", precise.Completed, want)
				}
				want = precise.Completed
			}
			if precise.Completed != want || precise.Errors != 0 || approx.Completed != want {
				t.Fatalf("completed %d (approximate %d), errors %d, want %d", precise.Completed, approx.Completed, precise.Errors, want)
			}
			t.Logf("hit rate precise %.2f%%, approximate %.2f%%", 100*precise.PrefixHitRate, 100*approx.PrefixHitRate)
			if d := 100 * (precise.PrefixHitRate - approx.PrefixHitRate); d < tt.margin {
				t.Errorf("hit rate precise %.1f%%, approximate %.1f%%: want precise ahead by %.1f points", 100*precise.PrefixHitRate, 100*approx.PrefixHitRate, tt.margin)
			}
		})
	}
}

func encode(t *testing.T, r report.Run) string {
	t.Helper()
	r.Samples = nil
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestKVEventsReachTheRouter checks the plumbing: the engines' events reach
// the precise index after the delay, and a restart's AllBlocksCleared
// empties engine 0's picture.
func TestKVEventsReachTheRouter(t *testing.T) {
	engines, reqs := fixture(t, "chat", 2, 100, 0.7)
	s, err := newSim(reqs, Config{Engines: engines, Policy: policy.Default, KVEvents: &KVEvents{Delay: time.Second}, Faults: Faults{RestartAt: reqs[50].At}})
	if err != nil {
		t.Fatal(err)
	}
	precise := 0
	for _, k := range s.order[:50] {
		r := &s.reqs[k]
		s.until(r.At)
		v, h, perr := s.view(r)
		if perr != nil {
			t.Fatal(perr)
		}
		a, err := s.route(s.sched, v, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(a.Reason, "match=precise") {
			precise++
		}
		s.queue(k, v, h, a, a.Backend.ID)
	}
	if precise == 0 {
		t.Error("no request was matched precisely")
	}
	// Right before the restart: blocks held, events still in flight.
	st := s.sched.Precise().Stats(0, Epoch.Add(s.now))
	if st.Blocks == 0 || st.Stored == 0 || len(s.nodes[0].kv) == 0 {
		t.Fatalf("before the restart: %+v, %d batches in flight", st, len(s.nodes[0].kv))
	}
	s.until(reqs[50].At + time.Second + time.Millisecond)
	if st := s.sched.Precise().Stats(0, Epoch.Add(s.now)); st.Cleared != 1 {
		t.Errorf("a second after the restart: cleared %d times, want 1", st.Cleared)
	}
	last := s.nodes[0].kv
	for _, b := range last {
		for _, e := range b.events {
			if e.Kind == kvevents.AllBlocksCleared {
				t.Error("AllBlocksCleared still in flight after its delay")
			}
		}
	}
}
