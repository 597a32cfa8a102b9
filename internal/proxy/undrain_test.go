package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// staleListener hands out connections that, once stale is set, answer
// the next bytes they read with a reset: the connections of a process
// that stopped, which the router has not noticed yet (a restart on the
// same address; the router's pool still holds them).
type staleListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*staleConn
}

type staleConn struct {
	net.Conn
	stale atomic.Bool
}

func (l *staleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &staleConn{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, sc)
	l.mu.Unlock()
	return sc, nil
}

// restart makes every connection accepted so far stale.
func (l *staleListener) restart() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.stale.Store(true)
	}
}

func (c *staleConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.stale.Load() {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as a stopped process's socket answers
		}
		_ = c.Conn.Close()
		return 0, net.ErrClosed
	}
	return n, err
}

// TestUndrainForgetsPooledConnections: a backend drained, restarted on
// its address and undrained gets its next requests on new connections,
// not on the pooled connections to the stopped process: none fails, none
// is retried, its breaker hears nothing. Before, each request sent on a
// stale connection failed before its first byte, was retried on the
// other backend and counted against the restarted one's breaker (in a
// rolling restart of emulated engines, enough of them to open it).
func TestUndrainForgetsPooledConnections(t *testing.T) {
	b0 := newFake(t, "b0")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &staleListener{Listener: l}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(b0.serve))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Backends[0].URL = srv.URL
		c.Health.Interval = time.Hour // only the requests judge b0
	})
	for i := range 4 { // connections to both backends, pooled
		if res := r.post("/v1/chat/completions", chat("shared", true, fmt.Sprint("warm ", i))); res.status != 200 {
			t.Fatalf("warm-up %d: status %d %s", i, res.status, res.body)
		}
	}
	if b0.hits.Load() == 0 {
		t.Fatal("b0 had no request: no pooled connection to it")
	}
	b := r.srv.Fleet().Snapshot().All[0]
	if b.Name != "b0" {
		t.Fatalf("first backend %s, want b0", b.Name)
	}
	r.srv.Fleet().Drain(b, time.Now())
	ln.restart()
	r.srv.Fleet().Undrain(b)
	before := b0.hits.Load()
	for i := range 4 {
		if res := r.post("/v1/chat/completions", chat("shared", true, fmt.Sprint("after ", i))); res.status != 200 {
			t.Fatalf("request %d after the undrain: status %d %s", i, res.status, res.body)
		}
	}
	if got := r.srv.metricValue("kvroute_retries_total"); got != 0 {
		t.Errorf("%v requests retried after the undrain, want 0 (sent on the stopped engine's connections)", got)
	}
	if b0.hits.Load() == before {
		t.Error("b0 served no request after its undrain")
	}
}

// TestDrainResendsWaiting: a request still waiting for its first byte
// when its backend has drained for fleet.drain_grace is sent to another
// backend (nothing reached its client: the retry is exact), neither
// counted as a retry nor held against the drained backend. Before, the
// drain waited for it, however long its prefill or queue.
func TestDrainResendsWaiting(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Fleet.DrainGrace = 20 * time.Millisecond
		c.Health.Interval = time.Hour
	})
	b0, b1 := r.srv.Fleet().Snapshot().All[0], r.srv.Fleet().Snapshot().All[1]
	r.backends[0].setMode(modeHang)     // b0 never answers
	r.srv.Fleet().Drain(b1, time.Now()) // the request goes to b0
	res := make(chan result, 1)
	go func() { res <- r.post("/v1/chat/completions", chat("shared", true, "waiting on a drained engine")) }()
	<-r.backends[0].started
	r.srv.Fleet().Undrain(b1)
	r.srv.Fleet().Drain(b0, time.Now())
	got := <-res
	if got.status != 200 || !strings.Contains(string(got.body), "data: [DONE]") || r.backends[1].hits.Load() != 1 {
		t.Fatalf("status %d, b1 hits %d, body %s", got.status, r.backends[1].hits.Load(), got.body)
	}
	<-r.backends[0].cancelled // the drained engine's attempt was cut
	if n := r.srv.metricValue("kvroute_retries_total"); n != 0 {
		t.Errorf("%v retries counted, want 0", n)
	}
	if m := r.srv.Members().Of(b0); m == nil {
		t.Error("no record of b0")
	} else if st := m.Breaker(); st.Fails != 0 {
		t.Errorf("the drained backend was judged: %+v", st)
	}
}
