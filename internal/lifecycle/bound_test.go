package lifecycle

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// lateTimer is a deadline that passed just as the wait it bounds ended:
// Stop reports false (the deadline won), but its function has not run yet;
// it runs when the test calls fire, as the runtime's timer goroutine
// would a moment later.
type lateTimer struct {
	mu      sync.Mutex
	pending []func()
}

func (lt *lateTimer) start(_ time.Duration, f func()) Timer {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.pending = append(lt.pending, f)
	return lateStop{}
}

// fire runs the functions of the deadlines that passed.
func (lt *lateTimer) fire() {
	lt.mu.Lock()
	fs := lt.pending
	lt.pending = nil
	lt.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

type lateStop struct{}

func (lateStop) Stop() bool               { return false }
func (lateStop) Reset(time.Duration) bool { return false }

// useLateTimer makes every deadline of the test a lateTimer's.
func useLateTimer(t *testing.T) *lateTimer {
	lt := &lateTimer{}
	prev := SetAfterFunc(lt.start)
	t.Cleanup(func() { SetAfterFunc(prev) })
	return lt
}

// TestBoundRace: a deadline whose Stop reports false has fired, even when
// its function has not yet run (the first-token and the header timeout's
// race): the attempt is a timeout (504, the backend charged), never a
// response handed on that the deadline's function then cuts.
func TestBoundRace(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(p *Plane)
		body string
	}{
		{"header timeout", func(p *Plane) { p.HeaderTimeout = time.Hour }, chatBody},
		{"first token", func(p *Plane) { p.FirstTokenTimeout = time.Hour },
			`{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				_, _ = io.WriteString(w, "data: {}\n\n")
			}))
			t.Cleanup(srv.Close)
			lt := useLateTimer(t)
			p, f := newPlaneWith(t, nil, &backend{srv: srv})
			tt.edit(p)
			r, front := run(t, p, tt.body)
			lt.fire()
			if r.Status != http.StatusGatewayTimeout || front.resp != nil {
				t.Fatalf("status %d, response handed on %v: want a 504, the deadline having passed", r.Status, front.resp != nil)
			}
			if st := r.Leg().Target.Breaker(); st.Fails != 1 {
				t.Errorf("breaker: %d failures, want the timeout charged once", st.Fails)
			}
			checkIdle(t, f)
		})
	}
}
