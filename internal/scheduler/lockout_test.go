package scheduler_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestNoLockOutAfterOverload replays, in the simulator's virtual time
// (the scheduler, policy and fleet accounting of kvroute serve, over the
// engine model of kvroute engine), an operator's overload of three
// engines, `kvroute bench --workload mixed --rate 60 --duration 20s`,
// followed by everyday chat traffic. During the overload every TTFT is
// queueing, and the prefill rates learned from them are far too low;
// once the fleet has drained, an engine whose rate no request refreshes
// could stay avoided for good (without probes, one or two engines of
// three got no request at all for two minutes in half of these seeds).
// Each engine must have its share back within 30 s of the drain: over the
// rest of the run, at least half the smallest share any engine gets when
// the same chat traffic meets a fleet that never saw the overload.
func TestNoLockOutAfterOverload(t *testing.T) {
	racetest.Heavy(t, "seven runs of two minutes in virtual time")
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	engines := []engine.Preset{p, p, p}
	// The chat traffic starts once the overload's arrivals have ended, at
	// 4 requests a second (well within the fleet's means).
	const start = 25 * time.Second
	chat, err := workload.Load("chat", workload.Options{Rate: 4, Duration: 120 * time.Second, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := sim.Run(chat, sim.Config{Engines: engines, Policy: "kvroute"})
	if err != nil {
		t.Fatal(err)
	}
	floor := minShare(fresh.Samples, 0, len(engines)) / 2
	for i := range chat {
		chat[i].At += start
	}
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("overload seed %d", seed), func(t *testing.T) {
			t.Parallel()
			over, err := workload.Load("mixed", workload.Options{Rate: 60, Duration: 20 * time.Second, Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			run, err := sim.Run(append(over, chat...), sim.Config{Engines: engines, Policy: "kvroute"})
			if err != nil {
				t.Fatal(err)
			}
			// The fleet has drained when the overload's last request ends.
			var drained time.Duration
			for _, s := range run.Samples {
				if s.Start < start {
					drained = max(drained, s.Start+s.E2E)
				}
			}
			if got := minShare(run.Samples, drained+30*time.Second, len(engines)); got < floor {
				t.Errorf("from 30 s after the fleet drained (at %v), an engine has %.1f%% of the chat requests, under %.1f%%, half the least share on a fleet without the overload%s",
					drained.Round(time.Second), 100*got, 100*floor, shares(run.Samples, drained+30*time.Second))
			}
		})
	}
}

// minShare is the smallest share of the requests arriving from from on
// that any of n engines got, probes not counted.
func minShare(samples []report.Sample, from time.Duration, n int) float64 {
	per, total := count(samples, from)
	low := 1.0
	for i := range n {
		low = min(low, float64(per[engineName(i)])/float64(max(total, 1)))
	}
	return low
}

// count counts the requests arriving from from on per engine, probes
// left out: a probe is the rule's request, not the policy's share.
func count(samples []report.Sample, from time.Duration) (map[string]int, int) {
	per, total := map[string]int{}, 0
	for _, s := range samples {
		if s.Start >= from && !strings.HasSuffix(s.Route, " "+scheduler.ProbeNote) {
			per[s.Backend]++
			total++
		}
	}
	return per, total
}

func engineName(i int) string { return fmt.Sprintf("engine-%d", i) }

// shares renders the per-engine counts for a failure message.
func shares(samples []report.Sample, from time.Duration) string {
	per, total := count(samples, from)
	return fmt.Sprintf(" (requests per engine: %v of %d)", per, total)
}
