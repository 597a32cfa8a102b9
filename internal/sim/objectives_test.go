package sim

import (
	"testing"

	"github.com/kvroute/kvroute/internal/slo"
)

// TestObjectivesShedRatherThanLate: on the mixed-objective workload past
// the fleet's capacity, kvroute refuses sheddable requests rather than
// serving them late, and keeps more critical requests within their
// objectives than kvroute blind to them, which sheds nothing; the same
// scheduler code the live router runs (docs/benchmarks.md, "Objectives",
// has the full-size figures).
func TestObjectivesShedRatherThanLate(t *testing.T) {
	engines, reqs := fixture(t, "objectives", 4, raceScaled(900), 1.3)
	attain := map[string]float64{}
	for _, pol := range []string{"kvroute", "kvroute-slo-blind"} {
		run, err := Run(reqs, Config{Engines: engines, Policy: pol, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		s := run.SLO
		if s == nil {
			t.Fatalf("%s: no objectives summary", pol)
		}
		sh := s.Class(slo.Sheddable)
		attain[pol] = s.Class(slo.Critical).Attainment()
		switch pol {
		case "kvroute":
			if sh.Shed == 0 || sh.Served != sh.MetBoth {
				t.Errorf("kvroute: %d sheddable refused, %d served of which %d in time; want some refused and none late", sh.Shed, sh.Served, sh.MetBoth)
			}
			if s.TTFTError.N == 0 || s.ITLError.N == 0 {
				t.Errorf("kvroute: no prediction error measured: %+v %+v", s.TTFTError, s.ITLError)
			}
		default:
			if sh.Shed != 0 {
				t.Errorf("%s shed %d", pol, sh.Shed)
			}
		}
	}
	t.Logf("critical attainment: %v", attain)
	if attain["kvroute"] < attain["kvroute-slo-blind"]+0.2 {
		t.Errorf("critical attainment %.3f with objectives, %.3f blind: want at least 20 points more", attain["kvroute"], attain["kvroute-slo-blind"])
	}
}
