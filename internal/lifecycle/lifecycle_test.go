package lifecycle

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// bareFront drives a request's lifecycle without a response writer, as a
// second front would: it keeps what the lifecycle hands it.
type bareFront struct {
	resp    *http.Response
	body    []byte
	errs    []*openai.Error
	end     BodyEnd
	settled int
	// held is the room taken (Hold), within room (-1: no bound).
	held, room int64
}

func (f *bareFront) Admit(*Request) (func(), *openai.Error) { return func() {}, nil }
func (f *bareFront) Tokenize(*Request) []uint64             { return nil }
func (f *bareFront) WriteError(e *openai.Error)             { f.errs = append(f.errs, e) }
func (f *bareFront) Ended() BodyEnd                         { return f.end }
func (f *bareFront) Hold(n int64) bool                      { f.held += n; return f.room < 0 || f.held <= f.room }
func (f *bareFront) Settled(*Request)                       { f.settled++ }

// Respond reads the whole response at once: the front's relay.
func (f *bareFront) Respond(_ *Leg, resp *http.Response, head []byte, headErr error) {
	f.resp = resp
	rest, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	f.body = append(append([]byte(nil), head...), rest...)
	if headErr == nil && err != nil {
		f.end.Broken = err
		return
	}
	f.end.Complete = true
}

// noTrace traces nothing.
type noTrace struct{}

func (noTrace) RouteStart()                           {}
func (noTrace) RouteEnd(*scheduler.Assignment, error) {}
func (noTrace) Attempt(*Request, *Leg, *http.Request) {}
func (noTrace) AttemptFailed(error)                   {}
func (noTrace) FirstByte()                            {}
func (noTrace) LegStart(*Leg)                         {}
func (noTrace) LegEnd(*Leg)                           {}

// backend is a test backend that records the bodies it gets and answers
// with status and its name.
type backend struct {
	srv    *httptest.Server
	status int
	mu     sync.Mutex
	bodies []string
}

func newBackend(t *testing.T, name string, status int) *backend {
	b := &backend{status: status}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.bodies = append(b.bodies, string(body))
		b.mu.Unlock()
		w.WriteHeader(b.status)
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// newPlane is a plane over the backends, routed round robin, with no
// retries and no active checks; EjectAfter is 2.
func newPlane(t *testing.T, bs ...*backend) (*Plane, *fleet.Fleet) {
	t.Helper()
	return newPlaneWith(t, nil, bs...)
}

// newPlaneWith is newPlane with the config changed by edit before it is
// validated.
func newPlaneWith(t *testing.T, edit func(*config.Config), bs ...*backend) (*Plane, *fleet.Fleet) {
	t.Helper()
	return newPlaneFiltered(t, edit, nil, bs...)
}

// newPlaneFiltered is newPlaneWith with the scheduler's filters.
func newPlaneFiltered(t *testing.T, edit func(*config.Config), filters []policy.Filter, bs ...*backend) (*Plane, *fleet.Fleet) {
	t.Helper()
	cfg := config.Default()
	for i, b := range bs {
		cfg.Backends = append(cfg.Backends, config.Backend{URL: b.srv.URL, Name: string(rune('a' + i)), Models: []string{"m"}})
	}
	cfg.Health.Path = ""
	cfg.Health.EjectAfter = 2
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	entries, err := cfg.Entries()
	if err != nil {
		t.Fatal(err)
	}
	f := fleet.New()
	pol, err := policy.New("round-robin", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.New(f, pol, scheduler.Config{BlockChars: cfg.Prefix.BlockChars, Capacity: cfg.Prefix.CapacityBlocks, Filters: filters})
	log := slog.New(slog.DiscardHandler)
	set := members.New(members.Config{Fleet: f, Forget: sched.Index().RemoveBackend, Transport: http.DefaultTransport, Log: log,
		Health: cfg.Health, FleetSection: cfg.Fleet}, entries)
	return &Plane{Sched: sched, Set: set, Upstream: http.DefaultTransport, Log: log}, f
}

// run drives one request with the given legs (none: the one plain leg)
// through the lifecycle, as a front would, and settles it.
func run(t *testing.T, p *Plane, body string, legs ...Leg) (*Request, *bareFront) {
	t.Helper()
	return runCtx(t, context.Background(), p, &bareFront{room: -1}, body, legs...)
}

// runCtx is run under the client's context ctx, with front f.
func runCtx(t *testing.T, ctx context.Context, p *Plane, f *bareFront, body string, legs ...Leg) (*Request, *bareFront) {
	t.Helper()
	r := newRequest(t, p, f, body)
	if len(legs) > 0 {
		r.SetLegs(legs...)
	}
	if p.Route(r) {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", bytes.NewReader(r.Body))
		req.RequestURI = ""
		if _, err := p.RoundTrip(r, req); err != nil {
			p.Fail(r, ctx.Err() != nil, err)
		}
	}
	p.Settle(r, false)
	return r, f
}

// newRequest is a parsed chat request of body, carried by front f.
func newRequest(t *testing.T, p *Plane, f Front, body string) *Request {
	t.Helper()
	v, e := request.Parse(request.Chat, []byte(body), request.Options{})
	if e != nil {
		t.Fatal(e)
	}
	r := &Request{}
	r.Init(time.Now(), f, noTrace{})
	r.View, r.Body, r.Model, r.Hashes = v, []byte(body), v.Model, p.Sched.Hashes(v)
	return r
}

// checkIdle fails unless every backend's load is back to zero.
func checkIdle(t *testing.T, f *fleet.Fleet) {
	t.Helper()
	for _, b := range f.Snapshot().All {
		if l := b.Load(); l.InFlight != 0 || l.PendingPrefill != 0 {
			t.Errorf("%s: load %+v after settle, want zero", b.Name, l)
		}
	}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":50}`

// TestTwoLegs: a decision naming two backends runs a prefill leg with its
// body rewritten, then a decode leg with the request's own body, whose
// response is the client's; settle releases both, judges both backends
// once, and the front's records run once, with no response writer.
func TestTwoLegs(t *testing.T) {
	pre, dec := newBackend(t, "prefill", 200), newBackend(t, "decode", 200)
	p, f := newPlane(t, pre, dec)
	prefillOnly := func(b, _ []byte) []byte {
		return bytes.Replace(b, []byte(`"max_tokens":50`), []byte(`"max_tokens":1`), 1)
	}
	r, front := run(t, p, chatBody, Leg{Role: "prefill", Rewrite: prefillOnly}, Leg{Role: "decode"})
	if r.Status != http.StatusOK || string(front.body) != "decode" {
		t.Fatalf("status %d, body %q: want 200 from the decode leg", r.Status, front.body)
	}
	if len(pre.bodies) != 1 || len(dec.bodies) != 1 {
		t.Fatalf("prefill got %d requests, decode %d, want one each", len(pre.bodies), len(dec.bodies))
	}
	if want := string(prefillOnly([]byte(chatBody), nil)); pre.bodies[0] != want || dec.bodies[0] != chatBody {
		t.Errorf("prefill leg sent %s, decode leg %s: want the rewrite, then the request's own body", pre.bodies[0], dec.bodies[0])
	}
	if r.Legs[0].Target == r.Legs[1].Target {
		t.Errorf("both legs on %s", r.Legs[0].Target.B.Name)
	}
	if front.settled != 1 || len(front.errs) != 0 {
		t.Errorf("front settled %d times with errors %v, want once and none", front.settled, front.errs)
	}
	checkIdle(t, f)
}

// TestFailedLegJudgedOnce: a prefill leg that fails ends the request (a
// 502 through the front), its backend charged with one failure, the
// decode leg's backend never asked and its assignment released.
func TestFailedLegJudgedOnce(t *testing.T) {
	pre, dec := newBackend(t, "prefill", 500), newBackend(t, "decode", 200)
	p, f := newPlane(t, pre, dec)
	r, front := run(t, p, chatBody, Leg{Role: "prefill"}, Leg{Role: "decode"})
	if r.Status != http.StatusBadGateway || len(front.errs) != 1 || front.errs[0].Status != http.StatusBadGateway {
		t.Fatalf("status %d, errors %v: want one 502", r.Status, front.errs)
	}
	if len(dec.bodies) != 0 {
		t.Errorf("the decode backend got %d requests after the prefill failed", len(dec.bodies))
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 1 {
		t.Errorf("prefill backend's breaker: %d failures, want 1", st.Fails)
	}
	if st := r.Legs[1].Target.Breaker(); st.Fails != 0 {
		t.Errorf("decode backend's breaker: %d failures, want 0", st.Fails)
	}
	checkIdle(t, f)
}

// TestJudge is the breaker's one feed: what each outcome of an attempt
// tells it.
func TestJudge(t *testing.T) {
	b := newBackend(t, "b", 200)
	tests := []struct {
		name   string
		status int
		failed error
		end    BodyEnd
		// After one failure, then this outcome: the breaker's count of
		// failures, or open (a second failure, EjectAfter being 2).
		fails int
		open  bool
	}{
		{"complete 2xx", 200, nil, BodyEnd{Complete: true}, 0, false},
		{"4xx", 400, nil, BodyEnd{Complete: true}, 1, false},
		{"5xx passed through, body broken", 500, members.StatusError(500), BodyEnd{Broken: io.ErrUnexpectedEOF}, 0, true},
		{"2xx broken", 200, nil, BodyEnd{Broken: io.ErrUnexpectedEOF}, 0, true},
		{"client left", 200, nil, BodyEnd{}, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, f := newPlane(t, b)
			m := p.Set.Of(f.Snapshot().All[0])
			p.Set.Failed(m, members.StatusError(502))
			l := &Leg{Target: m, status: tt.status}
			p.judge(&Request{}, l, tt.failed, tt.end)
			if st := m.Breaker(); st.Open != tt.open || (!tt.open && st.Fails != tt.fails) {
				t.Errorf("breaker %s with %d failures, want open %v with %d", st.State, st.Fails, tt.open, tt.fails)
			}
		})
	}
}

// TestAnswerFeedsNextLeg: an earlier leg's answer is what the next leg's
// Rewrite gets (prev), and the first leg gets none.
func TestAnswerFeedsNextLeg(t *testing.T) {
	pre, dec := newBackend(t, "prefill-answer", 200), newBackend(t, "decode", 200)
	p, f := newPlane(t, pre, dec)
	var prevs []string
	note := func(b, prev []byte) []byte {
		prevs = append(prevs, string(prev))
		return b
	}
	r, _ := run(t, p, chatBody, Leg{Role: "prefill", Rewrite: note}, Leg{Role: "decode", Rewrite: note})
	if r.Status != http.StatusOK || len(prevs) != 2 || prevs[0] != "" || prevs[1] != "prefill-answer" {
		t.Fatalf("status %d, rewrites saw %q: want nothing, then the prefill leg's answer", r.Status, prevs)
	}
	checkIdle(t, f)
}

// TestOptionalLegSkipped: an optional leg that fails is skipped: the next
// leg runs without its answer and its response is the client's; the
// skipped leg's backend is charged with its failure once.
func TestOptionalLegSkipped(t *testing.T) {
	pre, dec := newBackend(t, "prefill", 500), newBackend(t, "decode", 200)
	p, f := newPlane(t, pre, dec)
	var prev []byte
	r, front := run(t, p, chatBody, Leg{Role: "prefill", Optional: true},
		Leg{Role: "decode", Rewrite: func(b, pv []byte) []byte { prev = pv; return b }})
	if r.Status != http.StatusOK || string(front.body) != "decode" || len(front.errs) != 0 {
		t.Fatalf("status %d, body %q, errors %v: want the decode leg's 200", r.Status, front.body, front.errs)
	}
	if !r.Legs[0].Skipped() || prev != nil || len(dec.bodies) != 1 || dec.bodies[0] != chatBody {
		t.Errorf("skipped %v, decode leg saw answer %q and got %q", r.Legs[0].Skipped(), prev, dec.bodies)
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 1 {
		t.Errorf("prefill backend's breaker: %d failures, want 1", st.Fails)
	}
	checkIdle(t, f)
}

// TestBesideLeg: a Beside leg is sent at once with the next leg (the
// backend of the next leg answers only once the Beside leg's request
// arrived), and one still running when the request settles is ended, not
// judged, and waited for: Settle returns and every assignment is released.
func TestBesideLeg(t *testing.T) {
	arrived := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then the server sees the client leave
		close(arrived)
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	dec := newBackend(t, "decode", 200)
	pre := &backend{srv: hang}
	p, f := newPlane(t, pre, dec)
	wait := func(b, _ []byte) []byte {
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			t.Error("the decode leg was sent before the beside leg")
		}
		return b
	}
	r, front := run(t, p, chatBody, Leg{Role: "prefill", Beside: true}, Leg{Role: "decode", Rewrite: wait})
	if r.Status != http.StatusOK || string(front.body) != "decode" {
		t.Fatalf("status %d, body %q: want the decode leg's 200", r.Status, front.body)
	}
	if st := r.Legs[0].Target.Breaker(); st.Fails != 0 {
		t.Errorf("the beside leg ended by settle was judged: %d failures", st.Fails)
	}
	checkIdle(t, f)
}
