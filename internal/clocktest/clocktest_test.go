package clocktest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A scaled deadline still comes: a hang in the code under test does not
// slow the process, so it cannot stretch the deadline for ever.
func TestContextEnds(t *testing.T) {
	m := Start(t)
	start := time.Now()
	ctx, cancel := m.Context(context.Background(), 20*time.Millisecond)
	defer cancel()
	<-ctx.Done()
	took := time.Since(start)
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Errorf("cause %v, want a deadline", context.Cause(ctx))
	}
	if took < 20*time.Millisecond {
		t.Errorf("cancelled after %v, before its deadline of 20ms", took)
	}
	t.Logf("cancelled after %v: %v", took, context.Cause(ctx))
}

func TestUntil(t *testing.T) {
	m := Start(t)
	if m.Until(10*time.Millisecond, func() bool { return false }) {
		t.Error("a condition that never holds held")
	}
	n := 0
	if !m.Until(time.Minute, func() bool { n++; return n == 3 }) {
		t.Error("a condition that holds on the third look did not")
	}
}

func TestScale(t *testing.T) {
	m := Start(t)
	time.Sleep(50 * time.Millisecond)
	if s := m.Stretch(); s < 1 {
		t.Errorf("stretch %v, below 1", s)
	}
	if d := m.Scale(time.Second); d < time.Second {
		t.Errorf("a second scaled to %v", d)
	}
	if !m.Within(t, time.Second, time.Second, "a second") {
		t.Error("a second is not within a second")
	}
}

// Meters of parallel tests run side by side (the race detector checks
// that they share nothing unguarded).
func TestParallelMeters(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := Start(t)
			defer m.Stop()
			if !m.Until(time.Minute, func() bool { return m.Late() >= 0 }) {
				t.Error("a condition that holds did not")
			}
		})
	}
}
