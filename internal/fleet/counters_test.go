package fleet

import "testing"

// TestCountersTake: the growth of an engine's counts makes a lesson once
// it reaches the least tokens; less accumulates; a first count, a count
// that went back (a restart) and a missing one teach nothing.
func TestCountersTake(t *testing.T) {
	type take struct {
		tokens, seconds float64
		dt, ds          float64
		ok              bool
	}
	for _, c := range []struct {
		name  string
		takes []take
	}{
		{"first count starts", []take{{1000, 1, 0, 0, false}, {1300, 1.5, 300, 0.5, true}}},
		{"small growth accumulates", []take{{0, 0, 0, 0, false}, {100, 0.1, 0, 0, false}, {300, 0.4, 300, 0.4, true}}},
		{"restart starts afresh", []take{{1000, 1, 0, 0, false}, {10, 0.01, 0, 0, false}, {400, 0.5, 390, 0.49, true}}},
		{"missing count is not kept", []take{{1000, 1, 0, 0, false}, {-1, -1, 0, 0, false}, {1300, 1.5, 300, 0.5, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var k Counters
			for i, x := range c.takes {
				dt, ds, ok := k.Take(x.tokens, x.seconds, 256)
				if ok != x.ok || (ok && (dt != x.dt || !near(ds, x.ds))) {
					t.Errorf("take %d (%g, %g): %g, %g, %v; want %g, %g, %v", i, x.tokens, x.seconds, dt, ds, ok, x.dt, x.ds, x.ok)
				}
			}
		})
	}
}
