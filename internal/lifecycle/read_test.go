package lifecycle

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/request"
)

// TestRead: every front reads a completion's body through Plane.Read, so
// that what is refused, whose session it is, its salt and its hashes are
// one rule whatever carries the request.
func TestRead(t *testing.T) {
	b := newBackend(t, "a", 200)
	p, _ := newPlaneWith(t, func(c *config.Config) { c.Backends[0].MaxModelLen = 1000 }, b)
	p.Reading = Reading{Options: request.Options{SessionField: "user"}, RejectOverContext: true, MaxBytesPerToken: 4}
	long := strings.Repeat("word ", 2000) // 10,000 bytes: at least 2,500 tokens
	mid := strings.Repeat("word ", 40)    // 200 bytes: three blocks
	salt := func(s string) string { return "tenant/" + s }
	for _, tc := range []struct {
		name, body string
		hints      Hints
		code       string // the refusal's code; "" routes
		view       bool   // r.View set
		session    string
		salt       string
	}{
		{name: "no model", body: `{"messages":[{"role":"user","content":"hi"}]}`, code: "missing_model"},
		{name: "not JSON", body: `{"model":`, code: "invalid_json"},
		{name: "plain", body: `{"model":"m","user":"u1","messages":[{"role":"user","content":"` + mid + `"}]}`, view: true, session: "u1"},
		{name: "the transport's session wins", body: `{"model":"m","user":"u1","messages":[{"role":"user","content":"` + mid + `"}]}`,
			hints: Hints{Session: "h1"}, view: true, session: "h1"},
		{name: "the tenant's salt", body: `{"model":"m","cache_salt":"s","messages":[{"role":"user","content":"` + mid + `"}]}`,
			hints: Hints{Salt: salt}, view: true, salt: "tenant/s"},
		{name: "over the context", body: `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`,
			code: "context_length_exceeded", view: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Request{}
			e := p.Read(r, request.Chat, []byte(tc.body), tc.hints)
			switch {
			case tc.code == "" && e != nil:
				t.Fatalf("refused: %+v", e)
			case tc.code != "" && (e == nil || e.Code != tc.code):
				t.Fatalf("error %+v, want code %s", e, tc.code)
			}
			if (r.View != nil) != tc.view {
				t.Fatalf("view set %v, want %v", r.View != nil, tc.view)
			}
			if tc.code == "" && len(r.Hashes) == 0 {
				t.Error("a routed request's prompt was not hashed")
			}
			if tc.code != "" && len(r.Hashes) != 0 {
				t.Error("a refused request's prompt was hashed")
			}
			if r.View == nil {
				return
			}
			if tc.session != "" && r.View.SessionKey != tc.session {
				t.Errorf("session %q, want %q", r.View.SessionKey, tc.session)
			}
			if tc.salt != "" && r.View.PrefixSalt != tc.salt {
				t.Errorf("salt %q, want %q", r.View.PrefixSalt, tc.salt)
			}
		})
	}
}
