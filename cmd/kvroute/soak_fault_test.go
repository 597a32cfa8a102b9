package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/soak"
)

// soakOwn are the flags of a short soak on its own fleet.
func soakOwn(d time.Duration, timeScale float64) (*benchFlags, *soakFlags) {
	return &benchFlags{seed: 1, maxConc: bench.DefaultMaxConcurrency},
		&soakFlags{duration: d, engines: soak.DefaultEngines, preset: soak.DefaultPreset, load: soak.DefaultLoad, timeScale: timeScale,
			grace: 10 * time.Second, interval: time.Second}
}

// TestSoakFaultKill soaks kvroute serve (this test binary as a child, see
// TestMain) on its own two engines and kills one of them mid-run: no
// client sees an error, the streams it was serving move, and the soak
// passes. (With migration.max_attempts 0 in the child's config it fails:
// the killed engine's streams end with an error event.)
func TestSoakFaultKill(t *testing.T) {
	racetest.Heavy(t, "a kvroute serve child and two emulated engines at twice their capacity")
	t.Setenv("KVROUTE_TEST_MAIN", "1")
	// Engines twice as fast as the clock: the streams open at the end,
	// which the soak waits for, take half as long.
	f, s := soakOwn(3*time.Second, 2)
	s.fault, s.faultAt = "kill", 1200*time.Millisecond
	var out, errs strings.Builder
	code := runSoak(t.Context(), &out, &errs, f, s, map[string]bool{"soak": true})
	t.Log(out.String())
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs.String())
	}
	m := regexp.MustCompile(`soak: kill 1.2s \(wall clock\) into the run: (\d+) of (\d+) requests saw an error; (-?\d+) streams moved`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("no fault report")
	}
	errors, _ := strconv.Atoi(m[1])
	moved, _ := strconv.Atoi(m[3])
	if errors != 0 || moved <= 0 {
		t.Errorf("%d errors, %d streams moved; want 0 and some", errors, moved)
	}
}

// TestSoakFaultRefused: a fault goes with a soak on its own fleet only;
// refused before anything starts.
func TestSoakFaultRefused(t *testing.T) {
	f, s := soakOwn(time.Second, 1)
	f.target = "http://127.0.0.1:1"
	s.fault, s.faultAt = "kill", time.Second
	var out, errs strings.Builder
	if code := runSoak(t.Context(), &out, &errs, f, s, map[string]bool{"soak": true, "target": true}); code != 2 || !strings.Contains(errs.String(), "--soak without --target") {
		t.Errorf("with --target: exit %d, %q", code, errs.String())
	}
	f.target = ""
	s.fault = "crash"
	errs.Reset()
	if code := runSoak(t.Context(), &out, &errs, f, s, map[string]bool{"soak": true}); code != 2 || !strings.Contains(errs.String(), "--fault") {
		t.Errorf("--fault crash: exit %d, %q", code, errs.String())
	}
	if out.Len() > 0 {
		t.Errorf("a refused soak started: %s", out.String())
	}
	if code := run([]string{"bench", "--fault", "kill", "--fault-at", "1s"}); code != 2 {
		t.Errorf("bench --fault without --soak: exit %d, want 2", code)
	}
}
