package compare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// burstShape describes a cross-check workload (see burstTrace).
type burstShape struct {
	convs, bursts int
	minBurst      int // requests per burst, at least
	maxBurst      int // and at most
	spacing       time.Duration
	margin        time.Duration // quiet time after a burst's worst-case end
	firstBlocks   int           // 512-token blocks of a conversation's first turn
	maxTurns      int           // turns before a conversation starts over
	minOut        int
	maxOut        int
}

// burstTrace writes a Mooncake-format trace of conversations arriving in
// bursts, and returns its path. Each burst advances a few distinct
// conversations by one turn (one more 512-token block of history), its
// requests spacing apart; the next burst starts only after the worst case
// of this one has finished (every request on one engine, nothing cached),
// plus margin.
//
// The shape is what makes a live run decide exactly as the simulator does.
// Round-robin and random decide from the arrival order alone, which the
// spacing keeps stable against host jitter. Least-request and power-of-two
// decide from requests in flight, which inside a burst are exactly the
// burst's earlier requests (none can finish before the burst's last
// arrival) and between bursts are zero: no completion ever races an
// arrival. Identical decisions give identical prefix hits, so the hit
// rates must agree to the token, and the TTFTs differ only by what the host
// adds; a workload of steady arrivals instead lets one completion that
// lands a millisecond earlier live than simulated change a pick, and every
// later pick with it.
func burstTrace(t *testing.T, p engine.Preset, sh burstShape, seed uint64) string {
	t.Helper()
	// Every output token takes a step, so no request finishes sooner than
	// minOut steps after it arrives: a burst's last arrival must come at
	// least one spacing before that.
	if span, first := time.Duration(sh.maxBurst)*sh.spacing, time.Duration(sh.minOut)*p.StepOverhead; span > first {
		t.Fatalf("burst shape: a burst spans %v but its first request may finish %v after it starts", span-sh.spacing, first)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	history := make([][]string, sh.convs)
	turns := make([]int, sh.convs)
	next := 0
	var b strings.Builder
	at := time.Duration(0)
	for range sh.bursts {
		k := sh.minBurst + rng.IntN(sh.maxBurst-sh.minBurst+1)
		tokens, maxOut := 0, 0
		for j, c := range rng.Perm(sh.convs)[:k] {
			if turns[c] == sh.maxTurns {
				history[c], turns[c] = nil, 0
			}
			add := 1
			if turns[c] == 0 {
				add = sh.firstBlocks
			}
			turns[c]++
			for range add {
				next++
				history[c] = append(history[c], fmt.Sprint(next))
			}
			in := 512*len(history[c]) - rng.IntN(256)
			out := sh.minOut + rng.IntN(sh.maxOut-sh.minOut+1)
			tokens += in
			maxOut = max(maxOut, out)
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
				(at + time.Duration(j)*sh.spacing).Milliseconds(), in, out, strings.Join(history[c], ", "))
		}
		// Worst case: the whole burst on one engine, nothing cached.
		steps := (tokens+p.MaxBatchedTokens-1)/p.MaxBatchedTokens + maxOut
		worst := time.Duration(steps)*p.StepOverhead +
			time.Duration(tokens+k*maxOut)*p.PerPrefillToken +
			time.Duration(maxOut*(tokens+k*maxOut))*p.PerContextToken
		at += time.Duration(k-1)*sh.spacing + worst + sh.margin
		at = at.Round(time.Millisecond)
	}
	path := filepath.Join(t.TempDir(), "bursts.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCrossCheck runs the same small workload through the simulator and
// through live emulated engines and the router, and checks that they agree:
// mean TTFT within 15% and prefix hit rate within 5 points, for every
// baseline policy.
//
// The live side must agree on a busy 2-core machine under the race
// detector, so everything host-dependent is made small next to what is
// measured. The live path adds a wall-clock cost to every request (loopback
// HTTP through the router, a few goroutine wake-ups: about 2.5 ms idle,
// 7 ms under -race, tens of ms when other processes hold the CPUs) that the
// time scale converts into emulated time; at a scale of 0.75 (emulated time
// runs slower than the wall clock, so that cost shrinks in it) with the
// slowest preset, the TTFTs are hundreds of milliseconds and that cost stays
// a few percent on an idle machine. The workload's bursts (see burstTrace)
// keep every routing decision independent of host timing. And the policies'
// live runs go side by side, each on its own engines and router and
// staggered so that their bursts do not coincide: that gives each run four
// times the wall-clock budget of a sequence at the same total CPU. When
// the machine still falls behind by more than a tolerance (package
// clocktest measures it during the run), a disagreement skips the test
// with the figures instead of failing it.
func TestCrossCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("live run")
	}
	// The slowest preset: the longest TTFT per prompt token.
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	shape := burstShape{
		convs: 8, bursts: 6, minBurst: 3, maxBurst: 5,
		spacing: 45 * time.Millisecond, margin: 250 * time.Millisecond,
		firstBlocks: 4, maxTurns: 4, minOut: 24, maxOut: 32,
	}
	crossCheck(t, []engine.Preset{p, p, p}, shape, 0.75, 1)
}

// crossCheck runs the check of TestCrossCheck on a burstTrace of shape.
func crossCheck(t *testing.T, engines []engine.Preset, shape burstShape, timeScale float64, seed int64) {
	t.Helper()
	trace := burstTrace(t, engines[0], shape, uint64(seed))
	reqs, offered, err := sim.LoadAt(trace, workload.Options{}, 0, sim.Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	span := reqs[len(reqs)-1].At
	t.Logf("%d requests over %v emulated (offered load %.2f), time scale %g", len(reqs), span, offered, timeScale)

	policies := []string{"round-robin", "random", "least-request", "power-of-two"}
	clock := clocktest.Start(t)
	ctx, cancel := clock.Context(context.Background(), time.Minute)
	defer cancel()
	live := make([]report.Run, len(policies))
	slip := make([]time.Duration, len(policies))
	errs := make([]error, len(policies))
	stagger := time.Duration(float64(shape.spacing) / timeScale / float64(len(policies)))
	var wg sync.WaitGroup
	for i, pol := range policies {
		wg.Go(func() {
			select {
			case <-time.After(time.Duration(i) * stagger):
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			rep, err := Run(ctx, reqs, Config{
				Engines: engines, TimeScale: timeScale, Policies: []string{pol}, Seed: seed, OfferedLoad: offered,
				Driver: func(_ string, _ int, st emulator.DriverStats) { slip[i] = max(slip[i], st.Slip) },
			})
			if err != nil {
				errs[i] = err
				return
			}
			live[i] = rep.Runs[0]
		})
	}
	wg.Wait()
	for i, pol := range policies {
		if errs[i] != nil {
			t.Fatalf("%s: live run: %v (%v)", pol, errs[i], context.Cause(ctx))
		}
	}
	// Disagreements are judged last, once the checks that no load
	// excuses have run: a machine that fell behind by more than what is
	// compared can tolerate explains them, and skips.
	var apart []string
	tolerance := time.Duration(math.MaxInt64)
	for i, pol := range policies {
		simRun, err := sim.Run(reqs, sim.Config{Engines: engines, Policy: pol, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		lv := live[i]
		t.Logf("%-14s TTFT mean sim %6.1f ms live %6.1f ms; hit rate sim %5.1f%% live %5.1f%%; completed %d/%d; engines' worst slip %v",
			pol, simRun.TTFT.Mean, lv.TTFT.Mean, 100*simRun.PrefixHitRate, 100*lv.PrefixHitRate, lv.Completed, len(reqs), slip[i])
		if lv.Policy != pol || lv.Completed != len(reqs) || lv.Errors != 0 {
			t.Errorf("%s: live run %q completed %d of %d with %d errors", pol, lv.Policy, lv.Completed, len(reqs), lv.Errors)
			continue
		}
		if d := math.Abs(lv.TTFT.Mean-simRun.TTFT.Mean) / simRun.TTFT.Mean; d > 0.15 {
			apart = append(apart, fmt.Sprintf("%s: mean TTFT live %.1f ms, sim %.1f ms: %.0f%% apart, want within 15%% (engines' worst slip behind the real clock %v)",
				pol, lv.TTFT.Mean, simRun.TTFT.Mean, 100*d, slip[i]))
			// The live TTFT takes what the host adds to it; the tolerance,
			// in wall-clock time, is what the host may add.
			tolerance = min(tolerance, time.Duration(0.15*simRun.TTFT.Mean/timeScale*float64(time.Millisecond)))
		}
		if d := math.Abs(lv.PrefixHitRate - simRun.PrefixHitRate); d > 0.05 {
			apart = append(apart, fmt.Sprintf("%s: hit rate live %.1f%%, sim %.1f%%: %.1f points apart, want within 5", pol, 100*lv.PrefixHitRate, 100*simRun.PrefixHitRate, 100*d))
			// Decisions agree while no completion races an arrival: while
			// the engines keep up within the quiet margin between bursts.
			tolerance = min(tolerance, time.Duration(float64(shape.margin)/timeScale))
		}
	}
	if len(apart) > 0 {
		clock.SkipIfBehind(t, tolerance, "%s", strings.Join(apart, "; "))
		for _, a := range apart {
			t.Error(a + " (" + clock.String() + ")")
		}
	}
}
