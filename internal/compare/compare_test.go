package compare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// conversationTrace writes a small Mooncake-format trace: conversations
// whose turns extend the previous turn's blocks, interleaved, with long
// prompts and short outputs. Long prompts make TTFT large next to loopback
// HTTP costs (which the time scale multiplies), and short outputs keep the
// stream count low enough for a 2-core machine.
func conversationTrace(t *testing.T, convs, turns int, seed uint64) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	type conv struct{ ids []string }
	cs := make([]conv, convs)
	next := 0
	newID := func() string { next++; return fmt.Sprint(next) }
	var b strings.Builder
	at := 0
	for turn := range turns {
		for c := range cs {
			for range 4 + rng.IntN(5) {
				cs[c].ids = append(cs[c].ids, newID())
			}
			in := 512*len(cs[c].ids) - rng.IntN(400)
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
				at, in, 8+rng.IntN(24), strings.Join(cs[c].ids, ", "))
			at += 50 + rng.IntN(100)
			_ = turn
		}
	}
	path := filepath.Join(t.TempDir(), "conversations.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCrossCheck runs the same small workload through the simulator and
// through live emulated engines and the router, and checks that they agree:
// mean TTFT within 15% and prefix hit rate within 5 points, for every
// baseline policy.
func TestCrossCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("live run")
	}
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	engines := []engine.Preset{p, p}
	const load, seed = 0.7, 1
	// The live path adds a fixed wall-clock cost per request (loopback
	// HTTP, JSON parsing, goroutine wake-ups: about 2.5 ms here, 7 ms
	// under the race detector) that the time scale multiplies in emulated
	// time; the engine's own TTFTs match the simulator's to a tenth of a
	// millisecond. The scale keeps that cost under a tenth of the TTFT
	// while the run stays short.
	timeScale := 12.0
	if raceEnabled {
		timeScale = 4
	}
	trace := conversationTrace(t, 5, 3, seed)
	reqs, offered, err := sim.LoadAt(trace, workload.Options{}, load, sim.Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(offered-load) > 1e-6 {
		t.Fatalf("offered load %g, want %g", offered, load)
	}
	policies := []string{"round-robin", "random", "least-request", "power-of-two"}
	if raceEnabled {
		// Under the race detector the live path's per-request cost
		// triples, enough to flip an occasional power-of-two choice
		// between two equally loaded engines against the simulator's
		// (it compares in-flight counts at the instant of arrival); with
		// 15 requests one flipped choice moves the hit rate by 10 points.
		// Without -race it agrees.
		policies = policies[:3]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var slip time.Duration
	live, err := Run(ctx, reqs, Config{
		Engines: engines, TimeScale: timeScale, Policies: policies, Seed: seed, OfferedLoad: offered,
		Driver: func(_ string, _ int, st emulator.DriverStats) { slip = max(slip, st.Slip) },
	})
	if err != nil {
		t.Fatal(err)
	}
	// A machine too busy to run the emulated clock in real time (other
	// test binaries on a 2-core runner) makes the live side measure the
	// machine; the comparison is only meaningful when the engines kept up.
	t.Logf("emulated engines' worst slip behind the real clock: %v", slip)
	if span := reqs[len(reqs)-1].At; slip > span/50 {
		t.Skipf("emulated engines fell behind the real clock by %v of emulated time over a %v run: machine too busy for a live measurement", slip, span)
	}
	for i, pol := range policies {
		simRun, err := sim.Run(reqs, sim.Config{Engines: engines, Policy: pol, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		lv := live.Runs[i]
		t.Logf("%-14s TTFT mean sim %6.1f ms live %6.1f ms; hit rate sim %5.1f%% live %5.1f%%; completed %d/%d",
			pol, simRun.TTFT.Mean, lv.TTFT.Mean, 100*simRun.PrefixHitRate, 100*lv.PrefixHitRate, lv.Completed, len(reqs))
		if lv.Policy != pol || lv.Completed != len(reqs) || lv.Errors != 0 {
			t.Errorf("%s: live run %q completed %d of %d with %d errors", pol, lv.Policy, lv.Completed, len(reqs), lv.Errors)
			continue
		}
		if d := math.Abs(lv.TTFT.Mean-simRun.TTFT.Mean) / simRun.TTFT.Mean; d > 0.15 {
			t.Errorf("%s: mean TTFT live %.1f ms, sim %.1f ms: %.0f%% apart, want within 15%%", pol, lv.TTFT.Mean, simRun.TTFT.Mean, 100*d)
		}
		if d := math.Abs(lv.PrefixHitRate - simRun.PrefixHitRate); d > 0.05 {
			t.Errorf("%s: hit rate live %.1f%%, sim %.1f%%: %.1f points apart, want within 5", pol, 100*lv.PrefixHitRate, 100*simRun.PrefixHitRate, 100*d)
		}
	}
}
