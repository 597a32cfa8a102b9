package lifecycle

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
)

// roles is a scheduler filter by backend name, as a split fleet's: a leg
// of a role goes to the backends of that role, and a whole request (no
// role) to any backend, or to none of the roles in notWhole.
type roles struct {
	of       map[string]string
	notWhole string
}

func (f roles) Tier(v *request.View, b *fleet.Backend) int {
	switch role := f.of[b.Name]; {
	case v.Role == "" && role != f.notWhole:
		return 0
	case v.Role == role:
		return 0
	}
	return -1
}

var _ policy.Filter = roles{}

// handler is a test backend of its own.
func handler(t *testing.T, h http.HandlerFunc) *backend {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &backend{srv: srv}
}

// splitLegs are the legs of a split request, prefill then decode, each
// routed on its role, with rewrites that note what the decode leg got.
func splitLegs(v *request.View, got *[]string) []Leg {
	pre, dec := *v, *v
	pre.Role, dec.Role = "prefill", "decode"
	return []Leg{
		{Role: "prefill", View: &pre, Optional: true},
		{Role: "decode", View: &dec, Rewrite: func(b, prev []byte) []byte {
			*got = append(*got, string(prev))
			return b
		}},
	}
}

// runSplit drives one split request (chatBody, or body when given) over a
// plane whose backends a, b, ... have the roles given in order.
func runSplit(t *testing.T, p *Plane, body string, got *[]string) (*Request, *bareFront) {
	t.Helper()
	v, e := request.Parse(request.Chat, []byte(body), request.Options{})
	if e != nil {
		t.Fatal(e)
	}
	return run(t, p, body, splitLegs(v, got)...)
}

// names maps backends a, b, c... to the roles given.
func names(rs ...string) map[string]string {
	m := map[string]string{}
	for i, r := range rs {
		m[string(rune('a'+i))] = r
	}
	return m
}

// TestRetriedAttemptReleased: an attempt that fails and is retried on
// another backend releases its assignment (Done) before the retry, so
// that the failed backend carries no load for the request while the retry
// runs, and every load is back to zero once the request settles.
func TestRetriedAttemptReleased(t *testing.T) {
	var p *Plane
	var f *fleet.Fleet
	var loadAtRetry atomic.Int64
	loadAtRetry.Store(-1)
	first := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	})
	second := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		loadAtRetry.Store(int64(f.Snapshot().All[0].Load().InFlight))
		_, _ = io.WriteString(w, "ok")
	})
	p, f = newPlaneWith(t, nil, first, second)
	p.Attempts = 1
	r, front := run(t, p, chatBody)
	if r.Status != http.StatusOK || string(front.body) != "ok" || r.Retries() != 1 {
		t.Fatalf("status %d, body %q, retries %d: want the second backend's 200 after one retry", r.Status, front.body, r.Retries())
	}
	if got := loadAtRetry.Load(); got != 0 {
		t.Errorf("the failed backend had %d requests in flight during the retry, want 0", got)
	}
	if st := p.Set.Of(f.Snapshot().All[0]).Breaker(); st.Fails != 1 {
		t.Errorf("failed backend's breaker: %d failures, want 1", st.Fails)
	}
	checkIdle(t, f)
}

// TestPrefillRefusalNotCharged: a prefill engine that refuses the request
// (a 4xx: the client's mistake, such as temperature -1) is not charged:
// its refusal is the client's answer, the decode engine is never asked,
// and the prefill engine's breaker is untouched.
func TestPrefillRefusalNotCharged(t *testing.T) {
	pre := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"temperature must be non-negative","type":"BadRequestError","code":400}}`)
	})
	dec := newBackend(t, "decode", 200)
	p, f := newPlaneFiltered(t, func(c *config.Config) { c.Health.EjectAfter = 1 }, []policy.Filter{roles{of: names("prefill", "decode")}}, pre, dec)
	var got []string
	r, front := runSplit(t, p, chatBody, &got)
	if r.Status != http.StatusBadRequest || !strings.Contains(string(front.body), "temperature") || len(dec.bodies) != 0 {
		t.Fatalf("status %d, body %q, decode asked %d times: want the prefill engine's 400, the decode engine never asked", r.Status, front.body, len(dec.bodies))
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 0 || st.Open {
		t.Errorf("prefill engine's breaker %s with %d failures after the client's 400: want untouched", st.State, st.Fails)
	}
	checkIdle(t, f)
}

// TestPrefillAnswerBounded: a prefill answer that stalls after its first
// byte, or trickles, fails once the stream idle timeout has passed since
// its first byte (not at the client's own timeout): charged to the
// prefill engine, and the decode engine serves the request whole.
func TestPrefillAnswerBounded(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(w http.ResponseWriter, r *http.Request)
	}{
		{"stall", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"kv_transfer_params":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
		{"trickle", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"kv_transfer_params":`)
			for r.Context().Err() == nil {
				_, _ = io.WriteString(w, " ")
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond) // a byte at a time, never silent long
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pre := handler(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				tt.write(w, r)
			})
			dec := newBackend(t, "decode", 200)
			p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill", "decode")}}, pre, dec)
			p.StreamIdleTimeout = 20 * time.Millisecond
			var got []string
			r, front := runSplit(t, p, chatBody, &got)
			if r.Status != http.StatusOK || string(front.body) != "decode" || !r.Legs[0].Skipped() {
				t.Fatalf("status %d, body %q, prefill skipped %v: want the decode engine's 200, served whole", r.Status, front.body, r.Legs[0].Skipped())
			}
			if len(got) != 1 || got[0] != "" {
				t.Errorf("the decode leg got the answer %q, want none", got)
			}
			if st := r.Legs[0].Target.Breaker(); st.Fails != 1 {
				t.Errorf("prefill engine's breaker: %d failures, want the stall charged once", st.Fails)
			}
			checkIdle(t, f)
		})
	}
}

// TestPrefillAnswerBudget: a prefill answer is held in the front's budget
// of buffered bytes as it arrives; one the budget has no room for is
// dropped, the request served whole, and no engine charged.
func TestPrefillAnswerBudget(t *testing.T) {
	pre := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{"kv_transfer_params":{"remote_block_ids":[`+strings.Repeat("1,", 8<<10)+`1]}}`)
	})
	dec := newBackend(t, "decode", 200)
	p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill", "decode")}}, pre, dec)
	v, _ := request.Parse(request.Chat, []byte(chatBody), request.Options{})
	var got []string
	front := &bareFront{room: 8 << 10}
	r, _ := runCtx(t, context.Background(), p, front, chatBody, splitLegs(v, &got)...)
	if r.Status != http.StatusOK || !r.Legs[0].Skipped() || len(got) != 1 || got[0] != "" {
		t.Fatalf("status %d, prefill skipped %v, decode got %d answers (the first %.40q): want served whole", r.Status, r.Legs[0].Skipped(), len(got), got)
	}
	if front.held <= front.room {
		t.Errorf("held %d bytes of a %d-byte budget: want the answer to have asked for more", front.held, front.room)
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 0 {
		t.Errorf("prefill engine charged %d failures for the router's own limit", st.Fails)
	}
	checkIdle(t, f)

	// With room, the answer is held and handed on whole.
	front = &bareFront{room: 1 << 20}
	got = nil
	r, _ = runCtx(t, context.Background(), p, front, chatBody, splitLegs(v, &got)...)
	if r.Status != http.StatusOK || r.Legs[0].Skipped() || len(got) != 1 || !strings.HasSuffix(got[0], "1]}}") {
		t.Fatalf("status %d, skipped %v: want the answer handed on", r.Status, r.Legs[0].Skipped())
	}
	if front.held < int64(len(got[0])) {
		t.Errorf("held %d bytes for an answer of %d", front.held, len(got[0]))
	}
}

// TestDecodeRetryFreshPrefill: a decode leg retried after its engine
// failed before its first byte gets the answer of a fresh prefill, never
// the parameters the failed engine may have used; every assignment is
// released.
func TestDecodeRetryFreshPrefill(t *testing.T) {
	var prefills, decodes atomic.Int32
	pre := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		fmt.Fprintf(w, "answer-%d", prefills.Add(1))
	})
	dec := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if decodes.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "decode")
	}
	p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill", "decode", "decode")}},
		pre, handler(t, dec), handler(t, dec))
	p.Attempts = 1
	var got []string
	r, front := runSplit(t, p, chatBody, &got)
	if r.Status != http.StatusOK || string(front.body) != "decode" {
		t.Fatalf("status %d, body %q: want the second decode engine's 200", r.Status, front.body)
	}
	if want := []string{"answer-1", "answer-2"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decode attempts got answers %q, want %q: a fresh prefill for the retry", got, want)
	}
	if r.Legs[1].Retries != 1 || r.Legs[0].Skipped() {
		t.Errorf("decode retries %d, prefill skipped %v", r.Legs[1].Retries, r.Legs[0].Skipped())
	}
	checkIdle(t, f)
}

// TestClientLeftDuringOptionalLeg: a client that leaves while an optional
// leg runs ends the request: the leg is not skipped, the next leg never
// sent, and nothing is answered (499).
func TestClientLeftDuringOptionalLeg(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pre := handler(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		cancel() // the client leaves
		<-r.Context().Done()
	})
	dec := newBackend(t, "decode", 200)
	p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill", "decode")}}, pre, dec)
	v, _ := request.Parse(request.Chat, []byte(chatBody), request.Options{})
	var got []string
	r, front := runCtx(t, ctx, p, &bareFront{room: -1}, chatBody, splitLegs(v, &got)...)
	if r.Status != StatusClientGone || len(front.errs) != 0 {
		t.Fatalf("status %d, errors %v: want 499 and nothing answered", r.Status, front.errs)
	}
	if r.Legs[0].Skipped() || r.Legs[1].Attempts() != 0 || len(dec.bodies) != 0 {
		t.Errorf("prefill skipped %v, decode sent %d times: want neither after the client left", r.Legs[0].Skipped(), r.Legs[1].Attempts())
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 0 {
		t.Errorf("prefill engine charged %d failures for a client that left", st.Fails)
	}
	checkIdle(t, f)
}

// TestNoDecodeEngineServedWhole: a split request whose decode leg finds
// no engine is served whole by an engine that can take it whole, with the
// reason saying so; when none can, the 503 is the router's, charged to no
// engine (the prefill engine's series stays empty).
func TestNoDecodeEngineServedWhole(t *testing.T) {
	pre := newBackend(t, "prefill", 200)
	var unrouted []int
	for _, tt := range []struct {
		name     string
		notWhole string
		status   int
	}{
		{"served whole", "", http.StatusOK},
		{"no engine", "prefill", http.StatusServiceUnavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill"), notWhole: tt.notWhole}}, pre)
			p.Unrouted = func(_, _ string, status int) { unrouted = append(unrouted, status) }
			var got []string
			r, front := runSplit(t, p, chatBody, &got)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d", r.Status, tt.status)
			}
			if len(r.Legs) != 1 || !strings.HasPrefix(r.Whole, wholeNoLeg) {
				t.Errorf("legs %d, whole %q: want one leg, served whole for want of a decode engine", len(r.Legs), r.Whole)
			}
			if tt.status == http.StatusOK && (string(front.body) != "prefill" || r.Leg().Target == nil) {
				t.Errorf("body %q: want the prefill engine's, serving whole", front.body)
			}
			if tt.status != http.StatusOK && (r.Leg().Target != nil || len(unrouted) != 1 || unrouted[0] != tt.status) {
				t.Errorf("the 503 names a backend (%v) or was not counted as the router's (%v)", r.Leg().Target != nil, unrouted)
			}
			checkIdle(t, f)
		})
	}
}

// TestLegTimes: a split streaming request's timings, leg by leg, reach
// the plane's Split once it settles.
func TestLegTimes(t *testing.T) {
	pre, dec := newBackend(t, "answer", 200), newBackend(t, "data: x\n\n", 200)
	p, f := newPlaneFiltered(t, nil, []policy.Filter{roles{of: names("prefill", "decode")}}, pre, dec)
	var times []LegTimes
	p.Split = func(_ *Request, lt LegTimes) { times = append(times, lt) }
	var got []string
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true}`
	r, _ := runSplit(t, p, body, &got)
	if r.Status != http.StatusOK || len(times) != 1 {
		t.Fatalf("status %d, %d timings: want one", r.Status, len(times))
	}
	lt := times[0]
	if !lt.HasPrefill || !lt.HasDecodeTTFT || !lt.HasTransferWait || lt.Prefill <= 0 || lt.DecodeTTFT <= 0 || lt.TransferWait < 0 {
		t.Errorf("timings %+v: want each measured", lt)
	}
	checkIdle(t, f)

	// A request served whole after its prefill leg was skipped has no
	// prefill timing; a plain request none at all.
	pre.status = http.StatusInternalServerError
	times = nil
	r, _ = runSplit(t, p, body, &got)
	if len(times) != 1 || times[0].HasPrefill || times[0].HasTransferWait || !r.Legs[0].Skipped() {
		t.Errorf("skipped prefill: timings %+v", times)
	}
	if _, ok := (&Request{Legs: make([]Leg, 1)}).legTimes(); ok {
		t.Error("a plain request has leg timings")
	}
}

// TestPairRetried: a pair (a Beside leg and the leg sent with it) is sent
// again when either fails before the other's first byte: on another
// engine of the failed leg's role, the decode leg's wait cancelled when
// its prefill failed; every assignment is released.
func TestPairRetried(t *testing.T) {
	for _, tt := range []struct {
		name        string
		failPrefill bool
	}{{"prefill fails", true}, {"decode fails", false}} {
		t.Run(tt.name, func(t *testing.T) {
			var prefills, decodes atomic.Int32
			ready := make(chan struct{})
			var once sync.Once
			preH := func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				if prefills.Add(1) == 1 && tt.failPrefill {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				once.Do(func() { close(ready) })
				_, _ = io.WriteString(w, "prefilled")
			}
			decH := func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				if decodes.Add(1) == 1 && !tt.failPrefill {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				select { // the KV cache comes from a prefill that answered
				case <-ready:
					_, _ = io.WriteString(w, "decode")
				case <-r.Context().Done():
				}
			}
			p, f := newPlaneFiltered(t, nil,
				[]policy.Filter{roles{of: names("prefill", "prefill", "decode", "decode")}},
				handler(t, preH), handler(t, preH), handler(t, decH), handler(t, decH))
			p.Attempts = 2
			binds := 0
			p.Bind = func(*Request) { binds++ }
			v, _ := request.Parse(request.Chat, []byte(chatBody), request.Options{})
			pv, dv := *v, *v
			pv.Role, dv.Role = "prefill", "decode"
			r, front := run(t, p, chatBody, Leg{Role: "prefill", View: &pv, Optional: true, Beside: true}, Leg{Role: "decode", View: &dv})
			if r.Status != http.StatusOK || string(front.body) != "decode" {
				t.Fatalf("status %d, body %q: want the decode engine's 200", r.Status, front.body)
			}
			failed := r.Legs[1]
			if tt.failPrefill {
				failed = r.Legs[0]
			}
			if failed.Retries != 1 || binds != 2 || len(failed.Tried) != 1 {
				t.Errorf("failed leg retried %d times (tried %v), pair bound %d times: want one retry, two bindings", failed.Retries, failed.Tried, binds)
			}
			if failed.Target.B.ID == failed.Tried[0] {
				t.Errorf("the failed leg was sent again to the engine that failed it")
			}
			checkIdle(t, f)
		})
	}
}
