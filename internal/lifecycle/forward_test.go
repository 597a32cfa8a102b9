package lifecycle

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// forwardFront is a front whose data plane forwards the request itself (as
// an Envoy external processor's gateway does): it never calls RoundTrip,
// it reports what its data plane saw through the plane's hooks, and its
// body's end is its Tally's.
type forwardFront struct {
	bareFront
	tally    Tally
	complete bool
	broken   error
	prompt   int
}

func (f *forwardFront) Ended() BodyEnd {
	if f.tally.SSE || f.complete || f.broken != nil {
		return f.tally.End(f.complete, f.broken, f.prompt)
	}
	return BodyEnd{}
}

// recorded keeps the decisions the plane reports (Recorder).
type recorded struct{ statuses []int }

func (d *recorded) Decided(r *Request) { d.statuses = append(d.statuses, r.Status) }

// forward is a minimal forwarding data plane: it sends the routed request
// to its pick and reports each step through the hooks, reading the
// answer's body in small pieces into the front's tally; then the request
// settles. With fallback, its attempt on the pick fails (a refused
// connection) and it falls back to another backend of the fleet. between,
// when set, runs after the first byte, before the rest.
func forward(t *testing.T, p *Plane, body string, stream, fallback bool, between func(*Request)) (*Request, *forwardFront) {
	t.Helper()
	f := &forwardFront{bareFront: bareFront{room: -1}}
	r := newRequest(t, p, f, body)
	f.prompt, f.tally.SSE = r.View.PromptTokens, stream
	defer p.Settle(r, false)
	if !p.Route(r) {
		return r, f
	}
	p.Forwarded(r)
	order := []*fleet.Backend{r.Leg().Target.B}
	if fallback {
		for _, m := range p.Set.All() {
			if m.B != order[0] {
				order = append(order, m.B)
				break
			}
		}
	}
	for i, b := range order {
		if fallback && i == 0 {
			p.AttemptFailed(r, errRefused)
			continue
		}
		resp, err := http.Post(b.URL.String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			p.AttemptFailed(r, err)
			continue
		}
		p.Served(r, b)
		p.Status(r, resp.StatusCode)
		buf := make([]byte, 7)
		first := true
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 && first {
				first = false
				p.FirstByte(r)
				if between != nil {
					between(r)
				}
			}
			if n > 0 && resp.StatusCode/100 == 2 {
				f.tally.Note(buf[:n], time.Now())
			}
			if err == io.EOF {
				f.complete = true
				f.tally.Finish()
				break
			}
			if err != nil {
				f.broken = err
				break
			}
		}
		_ = resp.Body.Close()
		return r, f
	}
	return r, f
}

// TestForwardedAsRoutedHere: a request whose data plane forwards it ends
// exactly as the same request forwarded by the router's own attempt loop
// (RoundTrip): the same status, the same breaker judgement, its load
// released, its decision recorded once.
func TestForwardedAsRoutedHere(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		fails  int
	}{
		{"ok", 200, 0},
		{"backend error", 503, 1},
		{"client's mistake", 400, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			here, _ := newPlane(t, newBackend(t, "a", tt.status))
			routed, _ := run(t, here, chatBody)
			p, f := newPlane(t, newBackend(t, "a", tt.status))
			rec := &recorded{}
			p.Decisions = rec
			r, front := forward(t, p, chatBody, false, false, nil)
			if r.Status != routed.Status || r.Status != tt.status {
				t.Errorf("status %d forwarded, %d routed here, want %d", r.Status, routed.Status, tt.status)
			}
			if got, want := r.Leg().Target.Breaker().Fails, routed.Leg().Target.Breaker().Fails; got != want || got != tt.fails {
				t.Errorf("breaker: %d failures forwarded, %d routed here, want %d", got, want, tt.fails)
			}
			if len(rec.statuses) != 1 || rec.statuses[0] != tt.status || front.settled != 1 {
				t.Errorf("decisions %v, front settled %d times: want one of status %d", rec.statuses, front.settled, tt.status)
			}
			if r.Leg().Attempts() != 1 {
				t.Errorf("%d attempts, want 1", r.Leg().Attempts())
			}
			checkIdle(t, f)
		})
	}
}

// TestForwardedFirstByte: the data plane's first byte does what the
// router's own first byte does: the prompt leaves the backend's pending
// prefill (with the request still in flight), the admission queue wakes,
// the TTFT is set; the stream's usage reaches the settle.
func TestForwardedFirstByte(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n"
	b := newBackend(t, stream, 200)
	p, f := newPlane(t, b)
	wakes := 0
	p.Wake = func() { wakes++ }
	var mid fleet.Load
	var midWakes int
	r, front := forward(t, p, `{"model":"m","stream":true,"messages":[{"role":"user","content":"`+strings.Repeat("hello ", 200)+`"}]}`, true, false,
		func(r *Request) { mid, midWakes = r.Leg().Target.B.Load(), wakes })
	if mid.InFlight != 1 || mid.PendingPrefill != 0 || midWakes != 1 {
		t.Errorf("after the first byte: load %+v, %d wakes; want one in flight, no pending prefill, one wake", mid, midWakes)
	}
	if r.TTFT <= 0 || r.Status != 200 {
		t.Errorf("TTFT %v, status %d", r.TTFT, r.Status)
	}
	end := front.Ended()
	if !end.Complete || !end.Counted || end.In != 11 || end.Out != 2 || !end.HasCached {
		t.Errorf("body end %+v, want complete, 11 in, 2 out, cached reported", end)
	}
	if wakes != 2 {
		t.Errorf("%d wakes, want the first byte's and the settle's", wakes)
	}
	checkIdle(t, f)
}

// TestForwardedFallback: the data plane's pick fails and another endpoint
// serves (a fallback it tried): the pick is charged with the failure, the
// serving backend credited, the leg counts one retry, and both loads are
// released.
func TestForwardedFallback(t *testing.T) {
	p, f := newPlane(t, newBackend(t, "a", 200), newBackend(t, "b", 200))
	r, _ := forward(t, p, chatBody, false, true, nil)
	pick := r.Legs[0].Tried
	if len(pick) != 1 {
		t.Fatalf("tried %v, want the pick", pick)
	}
	if r.Status != 200 || r.Leg().Target.B.ID == pick[0] {
		t.Fatalf("status %d from %s, want 200 from the fallback", r.Status, r.Leg().Target.B.Name)
	}
	if r.Retries() != 1 || r.Leg().Attempts() != 2 {
		t.Errorf("%d retries, %d attempts; want 1 and 2", r.Retries(), r.Leg().Attempts())
	}
	for _, m := range p.Set.All() {
		want := 0
		if m.B.ID == pick[0] {
			want = 1
		}
		if fails := m.Breaker().Fails; fails != want {
			t.Errorf("%s's breaker has %d failures, want %d", m.B.Name, fails, want)
		}
	}
	checkIdle(t, f)
}

// errRefused is the fake data plane's failed attempt.
var errRefused = errors.New("connection refused")

// TestForwardedNoAnswer: a data plane whose only attempt fails without an
// answer: the request's status is the gateway's 502, its backend charged.
func TestForwardedNoAnswer(t *testing.T) {
	a := newBackend(t, "a", 200)
	p, f := newPlane(t, a)
	a.srv.Close()
	r, _ := forward(t, p, chatBody, false, false, nil)
	if r.Status != http.StatusBadGateway || r.Leg().Target.Breaker().Fails != 1 {
		t.Errorf("status %d, %d failures; want 502 and 1", r.Status, r.Leg().Target.Breaker().Fails)
	}
	checkIdle(t, f)
}

// TestForwardedTwoLegs: a split request forwarded by a data plane that
// runs the prefill itself (a P/D sidecar on the decode engine): both legs
// routed, the prefill leg released by the decode leg's first byte, both
// released and the decode engine judged at the end.
func TestForwardedTwoLegs(t *testing.T) {
	pre, dec := newBackend(t, "prefill", 200), newBackend(t, "decode", 200)
	p, f := newPlane(t, pre, dec)
	fr := &forwardFront{bareFront: bareFront{room: -1}}
	r := newRequest(t, p, fr, chatBody)
	r.SetLegs(Leg{Role: "prefill"}, Leg{Role: "decode"})
	if !p.Route(r) {
		t.Fatal("not routed")
	}
	p.Forwarded(r)
	p.Served(r, r.Legs[1].Target.B)
	p.Status(r, 200)
	p.FirstByte(r)
	if l := r.Legs[0].Target.B.Load(); l.InFlight != 0 {
		t.Errorf("prefill engine's load %+v after the decode leg's first byte, want released", l)
	}
	fr.complete = true
	p.Settle(r, false)
	if r.Status != 200 || r.Legs[0].Attempts() != 1 || r.Legs[1].Attempts() != 1 {
		t.Errorf("status %d, attempts %d and %d", r.Status, r.Legs[0].Attempts(), r.Legs[1].Attempts())
	}
	checkIdle(t, f)
}
