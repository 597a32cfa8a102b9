package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/request"
)

// holdFront is a front that keeps the response it is handed unread, as a
// relay in the middle of a stream does.
type holdFront struct{ bareFront }

func (f *holdFront) Respond(_ *Leg, resp *http.Response, _ []byte, _ error) { f.resp = resp }

// TestContinueAccounting moves a stream whose engine broke (or was
// drained) to the other engine: the new leg is the request's last and its
// response the front's; the broken leg is judged once (a drain: not at
// all) and its load released at the move; Settle judges and releases the
// new leg; every load ends at zero.
func TestContinueAccounting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause error
		fails int
	}{
		{"broken", errors.New("connection reset"), 1},
		{"drained", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newBackend(t, "a", 200), newBackend(t, "b", 200)
			p, f := newPlane(t, a, b)
			front := &holdFront{bareFront{room: -1}}
			r := newRequest(t, p, front, chatBody)
			if !p.Route(r) {
				t.Fatal("not routed")
			}
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/chat/completions", bytes.NewReader(r.Body))
			req.RequestURI = ""
			if _, err := p.RoundTrip(r, req); err != nil {
				t.Fatal(err)
			}
			_ = front.resp.Body.Close() // the stream breaks
			first := r.Leg()
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"}],"continue_final_message":true,"add_generation_prompt":false}`)
			v, e := request.Parse(request.Chat, body, request.Options{})
			if e != nil {
				t.Fatal(e)
			}
			c, err := p.Continue(r, body, v, tc.cause)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Legs) != 2 || r.Leg().Role != RoleContinued || c.From == c.To || c.To != r.Leg().Target.B.Name {
				t.Fatalf("legs %d, last %q, moved %s -> %s", len(r.Legs), r.Leg().Role, c.From, c.To)
			}
			old := r.Legs[0]
			if got := old.Target.Breaker().Fails; got != tc.fails {
				t.Errorf("the broken leg's engine: %d failures, want %d", got, tc.fails)
			}
			if l := old.Target.B.Load(); l.InFlight != 0 {
				t.Errorf("the broken leg's engine still holds %d in flight after the move", l.InFlight)
			}
			if l := r.Leg().Target.B.Load(); l.InFlight != 1 {
				t.Errorf("the new engine holds %d in flight, want 1", l.InFlight)
			}
			got, _ := io.ReadAll(c.Resp.Body)
			_ = c.Resp.Body.Close()
			front.end.Complete = true
			p.Settle(r, false)
			moved := a
			if first.Target.B.Name == "a" {
				moved = b
			}
			if got := string(c.Head) + string(got); got != "a" && got != "b" || len(moved.bodies) != 1 || moved.bodies[0] != string(body) {
				t.Errorf("the new engine got %q, answered %q", moved.bodies, got)
			}
			if st := r.Leg().Target.Breaker(); st.Fails != 0 {
				t.Errorf("the new engine: %d failures", st.Fails)
			}
			if got := old.Target.Breaker().Fails; got != tc.fails {
				t.Errorf("after settle the broken leg's engine has %d failures, want %d (judged once)", got, tc.fails)
			}
			if r.Status != http.StatusOK || front.settled != 1 {
				t.Errorf("status %d, settled %d", r.Status, front.settled)
			}
			checkIdle(t, f)
		})
	}
}
