package members

import (
	"testing"
	"time"
)

// TestBreakerTransitions drives one breaker through a script of events at
// given offsets from a fixed epoch and checks each outcome and the state
// after it. No test sleeps: time is passed in.
func TestBreakerTransitions(t *testing.T) {
	cfg := breakerConfig{threshold: 3, cooldown: time.Second, maxCooldown: 3 * time.Second, probes: 2}
	type step struct {
		at    time.Duration // since the epoch
		event string        // fail, ok, expire, allow
		want  transition    // for fail, ok, expire
		allow bool          // for allow
		state breakerState
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"failures below the threshold stay closed", []step{
			{0, "fail", noChange, false, breakerClosed},
			{1, "fail", noChange, false, breakerClosed},
			{2, "allow", noChange, true, breakerClosed},
		}},
		{"a success resets the count", []step{
			{0, "fail", noChange, false, breakerClosed},
			{1, "fail", noChange, false, breakerClosed},
			{2, "ok", noChange, false, breakerClosed},
			{3, "fail", noChange, false, breakerClosed},
			{4, "fail", noChange, false, breakerClosed},
			{5, "fail", toOpen, false, breakerOpen},
		}},
		{"a passing check does not hide failing requests", []step{
			{0, "fail", noChange, false, breakerClosed},
			{1, "check", noChange, false, breakerClosed},
			{2, "fail", noChange, false, breakerClosed},
			{3, "check", noChange, false, breakerClosed},
			{4, "fail", toOpen, false, breakerOpen},
		}},
		{"a passing check closes a half-open breaker", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{time.Second, "check", toClosed, false, breakerClosed},
		}},
		{"open lets nothing through and ignores late outcomes", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{100 * time.Millisecond, "allow", noChange, false, breakerOpen},
			{200 * time.Millisecond, "ok", noChange, false, breakerOpen},
			{300 * time.Millisecond, "fail", noChange, false, breakerOpen},
			{999 * time.Millisecond, "expire", noChange, false, breakerOpen},
		}},
		{"half-open probes close it", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{time.Second, "allow", noChange, true, breakerHalfOpen},
			{time.Second, "allow", noChange, true, breakerHalfOpen},
			{time.Second, "allow", noChange, false, breakerHalfOpen}, // probes exhausted
			{1500 * time.Millisecond, "ok", toClosed, false, breakerClosed},
			{1500 * time.Millisecond, "allow", noChange, true, breakerClosed},
		}},
		{"a failed probe re-opens with doubled, capped cool-down", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{time.Second, "fail", toOpen, false, breakerOpen}, // cool-down now 2s
			{2999 * time.Millisecond, "expire", noChange, false, breakerOpen},
			{3 * time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{3 * time.Second, "fail", toOpen, false, breakerOpen}, // 4s capped to 3s
			{5999 * time.Millisecond, "expire", noChange, false, breakerOpen},
			{6 * time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{6 * time.Second, "ok", toClosed, false, breakerClosed},
			// Closed again: the cool-down starts over at 1s.
			{7 * time.Second, "fail", noChange, false, breakerClosed},
			{7 * time.Second, "fail", noChange, false, breakerClosed},
			{7 * time.Second, "fail", toOpen, false, breakerOpen},
			{8 * time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
		}},
		{"an active check past the cool-down counts as a probe", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{1200 * time.Millisecond, "ok", toClosed, false, breakerClosed},
		}},
		{"a failed check past the cool-down backs off", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{1200 * time.Millisecond, "fail", toOpen, false, breakerOpen},
			{3100 * time.Millisecond, "expire", noChange, false, breakerOpen},
			{3200 * time.Millisecond, "expire", toHalfOpen, false, breakerHalfOpen},
		}},
		{"a check does not close a breaker a silence opened; a request does", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "silence", toOpen, false, breakerOpen},
			{1200 * time.Millisecond, "check", noChange, false, breakerOpen},
			{1200 * time.Millisecond, "expire", toHalfOpen, false, breakerHalfOpen},
			{1300 * time.Millisecond, "check", noChange, false, breakerHalfOpen},
			{1300 * time.Millisecond, "allow", noChange, true, breakerHalfOpen},
			{1400 * time.Millisecond, "ok", toClosed, false, breakerClosed},
			// Closed, the next opening by other failures is closed by a
			// check again.
			{2 * time.Second, "fail", noChange, false, breakerClosed},
			{2 * time.Second, "fail", noChange, false, breakerClosed},
			{2 * time.Second, "fail", toOpen, false, breakerOpen},
			{3 * time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{3 * time.Second, "check", toClosed, false, breakerClosed},
		}},
		{"a silent probe keeps the breaker silent", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "silence", toOpen, false, breakerOpen},
			{time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{time.Second, "fail", toOpen, false, breakerOpen},
			{3 * time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{3 * time.Second, "check", noChange, false, breakerHalfOpen},
		}},
		{"a lost probe frees its slot when the window turns", []step{
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", noChange, false, breakerClosed},
			{0, "fail", toOpen, false, breakerOpen},
			{time.Second, "expire", toHalfOpen, false, breakerHalfOpen},
			{time.Second, "allow", noChange, true, breakerHalfOpen},
			{time.Second, "allow", noChange, true, breakerHalfOpen},
			{1999 * time.Millisecond, "allow", noChange, false, breakerHalfOpen},
			{2 * time.Second, "allow", noChange, true, breakerHalfOpen},
		}},
	}
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b breaker
			for i, st := range tt.steps {
				now := epoch.Add(st.at)
				var got transition
				switch st.event {
				case "fail":
					got = b.failure(now, cfg, false)
				case "silence":
					got = b.failure(now, cfg, true)
				case "ok":
					got = b.success(now, cfg, false)
				case "check":
					got = b.success(now, cfg, true)
				case "expire":
					got = b.expire(now)
				case "allow":
					if a := b.allow(now, cfg); a != st.allow {
						t.Fatalf("step %d (%s at %v): allow = %v, want %v", i, st.event, st.at, a, st.allow)
					}
				default:
					t.Fatalf("step %d: unknown event %q", i, st.event)
				}
				if got != st.want {
					t.Fatalf("step %d (%s at %v): transition %d, want %d", i, st.event, st.at, got, st.want)
				}
				if b.state != st.state {
					t.Fatalf("step %d (%s at %v): state %v, want %v", i, st.event, st.at, b.state, st.state)
				}
			}
		})
	}
}
