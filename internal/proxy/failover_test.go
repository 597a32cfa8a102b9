package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// kill crashes a fake backend the way a dead engine looks from outside:
// its listener is gone (new connections are refused) and every open
// connection is cut, whatever its requests were doing.
func (f *fake) kill() {
	_ = f.srv.Listener.Close()
	f.srv.CloseClientConnections()
}

// backendByName returns the router's backend named name.
func (r *rig) backendByName(name string) *fleet.Backend {
	r.t.Helper()
	for _, b := range r.srv.Fleet().Snapshot().All {
		if b.Name == name {
			return b
		}
	}
	r.t.Fatalf("no backend %s", name)
	return nil
}

// TestCrashMovesOnlyDeadSessions records every session's backend, crashes
// the backend of one of them, and sends every session's next turn: the
// crashed backend's sessions must move, and every other session must stay
// where it was. The prefix index must have forgotten the crashed backend.
func TestCrashMovesOnlyDeadSessions(t *testing.T) {
	for _, pol := range []string{"kvroute", "session-hash"} {
		t.Run(pol, func(t *testing.T) {
			const backends, sessions = 4, 24
			r := newRig(t, pol, backends, func(c *config.Config) {
				c.Health.Cooldown = time.Minute // the crashed backend stays out for the test
				c.Health.MaxCooldown = time.Minute
			})
			// Every prompt stays below fleet.MinRateWork tokens, so that no
			// backend learns a prefill rate: kvroute's estimates then differ
			// only by cached prefix and load, and the one thing that can
			// move a conversation is the crash (kvroute would otherwise
			// rightly spill a conversation off a backend that a noisy
			// first sample made look slow).
			turn := func(s, n int) string {
				// Each turn extends the conversation, so that its prefix is
				// where the conversation lives.
				msgs := []string{words(fmt.Sprintf("sess%d", s), 400)}
				for i := 1; i <= n; i++ {
					msgs = append(msgs, fmt.Sprintf("answer %d", i), words(fmt.Sprintf("sess%d-turn%d", s, i), 60))
				}
				return chat("shared", s%2 == 0, msgs...)
			}
			send := func(s, n int) string {
				t.Helper()
				res := r.post("/v1/chat/completions", turn(s, n), "X-Session-ID", fmt.Sprintf("client-%d", s))
				if res.status != 200 || res.readErr != nil {
					t.Fatalf("session %d turn %d: status %d, read error %v: %s", s, n, res.status, res.readErr, res.body)
				}
				return res.header.Get("X-Kvroute-Backend")
			}
			before := make([]string, sessions)
			for s := range sessions {
				before[s] = send(s, 0)
			}
			per := map[string]int{}
			for s := range sessions {
				if again := send(s, 1); again != before[s] {
					t.Fatalf("session %d moved from %s to %s with every backend up", s, before[s], again)
				}
				per[before[s]]++
			}
			if len(per) < backends {
				t.Fatalf("sessions did not spread over every backend: %v", per)
			}
			dead := before[0]
			deadB := r.backendByName(dead)
			for _, f := range r.backends {
				if f.name == dead {
					f.kill()
				}
			}
			moved := 0
			for s := range sessions {
				after := send(s, 2)
				switch {
				case before[s] == dead && after == dead:
					t.Errorf("session %d answered by the crashed backend %s", s, dead)
				case before[s] == dead:
					moved++
				case after != before[s]:
					t.Errorf("session %d moved from live %s to %s when %s crashed", s, before[s], after, dead)
				}
			}
			for _, b := range r.srv.Fleet().Snapshot().All {
				// A TTFT would teach these fakes, which answer at once, a
				// prefill many times the prior's; the decode and engine
				// samples and the fleet's anchor move it by a few percent.
				if r := b.PrefillRate(time.Now()); math.Abs(r/fleet.DefaultPrefillRate-1) > 0.1 {
					t.Errorf("%s learned a prefill rate (%v tokens/s): the prompts are too long for this test", b.Name, r)
				}
			}
			if moved != per[dead] {
				t.Errorf("%d of the crashed backend's %d sessions moved", moved, per[dead])
			}
			if deadB.Healthy() || r.srv.set.Of(deadB).Breaker().State != "open" {
				t.Errorf("crashed backend: healthy %v, breaker %v; want out with the breaker open", deadB.Healthy(), r.srv.set.Of(deadB).Breaker().State)
			}
			if n := r.srv.Scheduler().Index().Len(deadB.ID); n != 0 {
				t.Errorf("prefix index still holds %d blocks of the crashed backend", n)
			}
			// The moved sessions now stick to their new home.
			for s := range sessions {
				if before[s] != dead {
					continue
				}
				a, b := send(s, 3), send(s, 4)
				if a != b || a == dead {
					t.Errorf("moved session %d went to %s then %s", s, a, b)
				}
			}
		})
	}
}

// streamResult is one streaming request's fate, seen by its client.
type streamResult struct {
	status  int
	backend string
	body    string
	readErr error
	err     error
}

// TestKillMidRun crashes one of three backends while about 100 streaming
// requests are in flight, some of them streaming from it and some still
// waiting for their prefill there. No request that had not started
// streaming may be lost (each is retried elsewhere and ends with
// [DONE]); the streams the crashed backend had started end without
// [DONE], so their clients can tell; the breaker opens, the router stays
// up, and every counter returns to zero (newRig checks that).
func TestKillMidRun(t *testing.T) {
	const requests = 100
	// Round robin gives the victim its third of the requests whatever its
	// held streams: a load-aware policy would steer away from it, and the
	// crash might find nothing queued there. Where requests go after the
	// crash is the same scheduler code for every policy.
	r := newRig(t, "round-robin", 3, func(c *config.Config) {
		c.Health.Cooldown = time.Minute
		c.Health.MaxCooldown = time.Minute
		c.Retry.Attempts = 2
		c.Migration.MaxAttempts = 0 // the cut streams end with the error event
	})
	victim := r.backends[0]
	victim.setMode(modeGated) // its streams hold after their first event
	for _, f := range r.backends {
		f.gap = time.Millisecond
	}
	vb := r.backendByName(victim.name)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	results := make([]streamResult, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			// 2000 characters: 10ms of prefill each at the fakes' rate,
			// and every prompt distinct, so that prefills queue up.
			body := chat("shared", true, words(fmt.Sprintf("inflight-%d", i), 2000))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := r.client.Do(req)
			if err != nil {
				results[i] = streamResult{err: err}
				return
			}
			defer resp.Body.Close()
			b, rerr := io.ReadAll(bufio.NewReader(resp.Body))
			results[i] = streamResult{status: resp.StatusCode, backend: resp.Header.Get("X-Kvroute-Backend"), body: string(b), readErr: rerr}
		})
	}

	// Crash the victim once it streams to some clients and still has
	// prefill queued for others.
	deadline := time.Now().Add(5 * time.Second)
	var at fleet.Load
	for {
		at = vb.Load()
		if at.Decoding >= 5 && at.PendingPrefill > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the victim never held both streams and queued prefills: %+v", at)
		}
		time.Sleep(time.Millisecond)
	}
	victim.kill()
	close(victim.gate) // let handlers the crash did not reach run out
	killed := time.Now()
	t.Logf("killed %s with %d streaming and %d requests (%d prefill tokens) waiting for their first byte",
		victim.name, at.Decoding, at.InFlight-at.Decoding, at.PendingPrefill)
	wg.Wait()
	t.Logf("every client done %v after the crash", time.Since(killed))

	var complete, truncated int
	for i, res := range results {
		switch {
		case res.err != nil:
			t.Errorf("request %d lost: %v", i, res.err)
		case res.status != 200:
			t.Errorf("request %d: status %d: %s", i, res.status, res.body)
		case res.backend == victim.name:
			// It had started streaming from the victim: it must not look
			// complete.
			if strings.Contains(res.body, "data: [DONE]") {
				t.Errorf("request %d: a stream cut by the crash ends with [DONE]", i)
			}
			if judgeStream(res.body, res.readErr) != sseCut {
				t.Errorf("request %d: a stream cut by the crash does not end with the error event and a clean end of the body (%v)", i, res.readErr)
			}
			truncated++
		default:
			want := strings.Join(streamEvents(res.backend, victim.events), "")
			if res.readErr != nil || res.body != want {
				t.Errorf("request %d from %s: read error %v, body %q; want the whole stream", i, res.backend, res.readErr, res.body)
			}
			complete++
		}
	}
	retries := counterValue(r.srv.metrics.retries)
	t.Logf("%d complete, %d cut by the crash, %v retries", complete, truncated, retries)
	if int64(truncated) < at.Decoding {
		t.Errorf("%d streams cut, but %d were streaming from the victim when it crashed", truncated, at.Decoding)
	}
	if retries < 1 {
		t.Error("no request was retried, yet the victim had requests waiting for their first byte")
	}
	if st := r.srv.set.Of(vb).Breaker().State; st != "open" || vb.Healthy() {
		t.Errorf("victim breaker %v, healthy %v; want open and out", st, vb.Healthy())
	}
	// The router stays up and routes around the crashed backend.
	if res := r.get("/readyz"); res.status != 200 {
		t.Errorf("/readyz = %d after the crash", res.status)
	}
	for i := range 10 {
		res := r.post("/v1/chat/completions", chat("shared", true, words(fmt.Sprintf("after-%d", i), 400)))
		if res.status != 200 || res.readErr != nil || res.header.Get("X-Kvroute-Backend") == victim.name {
			t.Errorf("request after the crash: status %d from %s, read error %v", res.status, res.header.Get("X-Kvroute-Backend"), res.readErr)
		}
	}
}

// TestBreakerRecovers opens a backend's breaker by failures, then lets the
// backend recover: after the cool-down a half-open probe closes the
// breaker and the backend takes traffic again. Active checks are off, so
// only requests probe.
func TestBreakerRecovers(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Health.Path = ""
		c.Health.EjectAfter = 2
		c.Health.Cooldown = 100 * time.Millisecond
		c.Health.MaxCooldown = 200 * time.Millisecond
	})
	bad := r.backends[0]
	bb := r.backendByName(bad.name)
	bad.setMode(mode500)
	for range 6 {
		if res := r.post("/v1/chat/completions", chat("shared", false, "x")); res.status != 200 {
			t.Fatalf("status %d: a failing backend's request was not retried: %s", res.status, res.body)
		}
	}
	if st := r.srv.set.Of(bb).Breaker().State; st != "open" {
		t.Fatalf("breaker %v after repeated 5xx, want open", st)
	}
	hits := bad.hits.Load()
	for range 4 {
		r.post("/v1/chat/completions", chat("shared", false, "x"))
	}
	if bad.hits.Load() != hits {
		t.Errorf("an open breaker let %d requests through", bad.hits.Load()-hits)
	}
	bad.setMode(modeOK)
	deadline := time.Now().Add(3 * time.Second)
	for r.srv.set.Of(bb).Breaker().State != "closed" {
		if time.Now().After(deadline) {
			t.Fatalf("breaker never closed: %v", r.srv.set.Of(bb).Breaker().State)
		}
		r.post("/v1/chat/completions", chat("shared", false, "x"))
		time.Sleep(10 * time.Millisecond)
	}
	served := 0
	for range 6 {
		if r.post("/v1/chat/completions", chat("shared", false, "x")).header.Get("X-Kvroute-Backend") == bad.name {
			served++
		}
	}
	if served == 0 {
		t.Error("the recovered backend gets no traffic")
	}
}
