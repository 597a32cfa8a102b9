// Package clocktest measures, during a test, how far the process falls
// behind the wall clock, so that a test with a wall-clock bound can scale
// the bound to it, or skip saying what it measured, instead of failing on
// a loaded machine or passing silently.
//
// A Meter runs one goroutine for the life of a test (or until Stop). It
// sleeps a short period and records how late it woke (the time the
// process waited for a CPU beyond what it asked: what every timer-driven
// emulator step, heartbeat and timeout of the code under test also
// waits), and every twentieth nap times a fixed unit of CPU work, long
// enough that sharing the CPU with other threads interrupts it: the
// unit's mean time over its fastest is the stretch that CPU-bound work
// suffers. Together they cost about two percent of a core.
//
// It is used by tests only, and must not be imported by other code.
package clocktest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// period is the sleeper's nap: short next to the bounds tests scale.
	period = 5 * time.Millisecond
	// workEvery is how many naps pass between two units of work.
	workEvery = 20
	// unit is about how long one unit of work takes on a quiet core: as
	// long as a kernel time slice, so that sharing the CPU shows in it.
	unit = 2 * time.Millisecond
)

// Meter measures how far the process falls behind while a test runs.
type Meter struct {
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
	iter     int // iterations of spin in one unit of work

	mu        sync.Mutex
	asked     time.Time // when the nap under way began
	naps      int
	lateSum   time.Duration
	lateWorst time.Duration
	units     int
	workSum   time.Duration
	workMin   time.Duration
}

// Start starts a Meter that runs until the test ends, and then logs what
// it measured.
func Start(tb testing.TB) *Meter {
	tb.Helper()
	m := &Meter{stop: make(chan struct{}), done: make(chan struct{})}
	m.calibrate()
	m.asked = time.Now()
	go m.run()
	tb.Cleanup(func() {
		m.Stop()
		tb.Logf("clock: %s", m)
	})
	return m
}

// Stop stops the measurement before the test ends (a helper that waits
// for one condition stops its Meter when it returns); what was measured
// stays readable.
func (m *Meter) Stop() {
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
}

// sink keeps the compiler from removing the work; Meters of parallel
// tests share it.
var sink atomic.Uint64

// spin is the unit of work: n rounds of an xorshift.
func spin(n int) time.Duration {
	start := time.Now()
	x := uint64(88172645463325252)
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	sink.Add(x)
	return time.Since(start)
}

// calibrate sizes the unit of work to about unit on this core, taking the
// fastest of a few tries (a slow one was interrupted).
func (m *Meter) calibrate() {
	n := 1 << 12
	for spin(n) < unit/8 && n < 1<<30 {
		n *= 2
	}
	best := spin(n)
	for range 4 {
		best = min(best, spin(n))
	}
	m.iter = max(1, int(float64(n)*float64(unit)/float64(max(best, time.Microsecond))))
}

func (m *Meter) run() {
	defer close(m.done)
	t := time.NewTimer(period)
	defer t.Stop()
	for i := 1; ; i++ {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.mu.Lock()
			late := max(0, time.Since(m.asked)-period)
			m.mu.Unlock()
			var work time.Duration
			if i%workEvery == 0 {
				work = spin(m.iter)
			}
			m.mu.Lock()
			m.naps++
			m.lateSum += late
			m.lateWorst = max(m.lateWorst, late)
			if work > 0 {
				m.units++
				m.workSum += work
				if m.workMin == 0 || work < m.workMin {
					m.workMin = work
				}
			}
			m.asked = time.Now()
			m.mu.Unlock()
			t.Reset(period)
		}
	}
}

// Late returns the worst lateness of a wake-up so far, the one still
// awaited included: a stall that has just ended counts before the sleeper
// has run again.
func (m *Meter) Late() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.lateWorst, time.Since(m.asked)-period)
}

// MeanLate returns the mean lateness of a wake-up so far.
func (m *Meter) MeanLate() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.naps == 0 {
		return 0
	}
	return m.lateSum / time.Duration(m.naps)
}

// Stretch returns how many times longer CPU-bound work took so far than
// on a core of its own: 1 on a quiet machine, about the number of
// runnable threads per core on a busy one. It also counts a wake-up's
// mean lateness against the nap it ended, so that a process whose timers
// fire late is behind even when its short bursts of work run at full
// speed.
func (m *Meter) Stretch() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := 1.0
	if m.units > 0 && m.workMin > 0 {
		s = float64(m.workSum) / float64(m.units) / float64(m.workMin)
	}
	if m.naps > 0 {
		s = max(s, 1+float64(m.lateSum/time.Duration(m.naps))/float64(period))
	}
	return s
}

// Scale returns d stretched by how far the process has fallen behind so
// far: d times Stretch, plus the worst lateness of a wake-up.
func (m *Meter) Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d)*m.Stretch()) + m.Late()
}

// Behind reports whether the process fell behind, while the test ran, by
// more than a bound of d can absorb: whether the time d stands for took
// more than twice d (see Scale), the margin a bound tuned on a quiet
// machine has at most.
func (m *Meter) Behind(d time.Duration) bool {
	return m.Scale(d) > 2*d
}

// SkipIfBehind skips the test, saying what was measured, when the process
// fell behind by more than a bound of d can absorb (see Behind), and
// otherwise returns. A test calls it once it has found a wall-clock bound
// of d broken, before failing for it: a loaded machine skips with a
// message, a quiet one fails.
func (m *Meter) SkipIfBehind(tb testing.TB, d time.Duration, format string, args ...any) {
	tb.Helper()
	if m.Behind(d) {
		tb.Skipf("%s; the machine could not keep time for a bound of %v (%s), so this says nothing about the code", fmt.Sprintf(format, args...), d, m)
	}
}

// Within reports whether took is within bound scaled by how far the
// process fell behind (see Scale). When it is not, it skips the test,
// saying what it measured, if the process fell behind by more than the
// bound absorbs (see SkipIfBehind), and otherwise returns false for the
// test to fail.
func (m *Meter) Within(tb testing.TB, took, bound time.Duration, what string) bool {
	tb.Helper()
	if took <= m.Scale(bound) {
		return true
	}
	m.SkipIfBehind(tb, bound, "%s took %v, more than %v", what, took, bound)
	return false
}

// Context returns a context that is cancelled once the wall clock has run
// past d scaled by how far the process has fallen behind meanwhile (see
// Scale), checked every d/100: a deadline that a loaded machine does not
// miss, and that a hang still reaches.
func (m *Meter) Context(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	start := time.Now()
	go func() {
		tick := time.NewTicker(max(d/100, period))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if took := time.Since(start); took > m.Scale(d) {
					cancel(fmt.Errorf("%w: %v, past %v scaled to %v (%s)", context.DeadlineExceeded, took.Round(time.Millisecond), d, m.Scale(d).Round(time.Millisecond), m))
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// Until polls cond every 2 ms until it holds, and reports whether
// it did before d, scaled as the wait goes (see Scale), ran out.
func (m *Meter) Until(d time.Duration, cond func() bool) bool {
	start := time.Now()
	for !cond() {
		if time.Since(start) > m.Scale(d) {
			return cond()
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// String says what the Meter measured so far.
func (m *Meter) String() string {
	m.mu.Lock()
	naps, units, workMin := m.naps, m.units, m.workMin
	m.mu.Unlock()
	return fmt.Sprintf("CPU work stretched %.2fx over %d units (fastest %v), wake-ups late by %v on average and %v at worst over %d",
		m.Stretch(), units, workMin.Round(time.Microsecond), m.MeanLate().Round(time.Microsecond), m.Late().Round(time.Microsecond), naps)
}
