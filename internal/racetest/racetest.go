// Package racetest tells a test whether it runs under the race detector,
// and skips the tests that gain nothing from it: long runs in virtual time
// (the simulator drives the scheduler on one goroutine, so the detector
// has no concurrency to watch there) and work the test binary does itself
// that it slows some tenfold. .ci/run runs the packages holding such tests
// a second time without the race detector, so every test runs in CI.
//
// It is used by tests only, and must not be imported by other code.
package racetest

import "testing"

// Heavy skips t under the race detector, saying why and where it runs.
func Heavy(t testing.TB, why string) {
	t.Helper()
	if Enabled {
		t.Skipf("%s: runs without the race detector (.ci/run's second pass)", why)
	}
}

// Only skips t without the race detector, saying why: a shorter run of a
// Heavy test, kept so that the detector still watches its code.
func Only(t testing.TB, why string) {
	t.Helper()
	if !Enabled {
		t.Skipf("%s: runs under the race detector only", why)
	}
}
