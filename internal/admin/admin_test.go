package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSource is a Source over a few named backends.
type fakeSource struct {
	mu       sync.Mutex
	draining map[string]bool
	removing map[string]bool
	names    []string
}

func newFakeSource(names ...string) *fakeSource {
	return &fakeSource{draining: map[string]bool{}, removing: map[string]bool{}, names: names}
}

func (f *fakeSource) Backends() []Backend {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Backend
	for _, n := range f.names {
		out = append(out, Backend{Name: n, Healthy: true, Draining: f.draining[n], Breaker: Breaker{State: "closed"}})
	}
	return out
}

func (f *fakeSource) set(name string, drain bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.names {
		if n == name {
			if !drain && f.removing[n] {
				return ErrRemoving
			}
			f.draining[n] = drain
			return nil
		}
	}
	return ErrUnknownBackend
}

func (f *fakeSource) Drain(name string) error   { return f.set(name, true) }
func (f *fakeSource) Undrain(name string) error { return f.set(name, false) }

// call sends one request to h and returns the status and body.
func call(t *testing.T, h http.Handler, method, path, auth string) (int, string, http.Header) {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b), w.Result().Header
}

// errorType decodes the OpenAI error shape and returns its type, failing
// the test if the body is not that shape.
func errorType(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error: %q (%v)", body, err)
	}
	return e.Error.Type
}

func TestAuth(t *testing.T) {
	src := newFakeSource("b0")
	tests := []struct {
		name       string
		token      string
		auth       string
		wantStatus int
		wantType   string
	}{
		{"off without a token", "", "Bearer anything", 404, "not_found_error"},
		{"off without a token, no header", "", "", 404, "not_found_error"},
		{"no header", "s3cret-token", "", 401, "authentication_error"},
		{"wrong token", "s3cret-token", "Bearer s3cret-tokeN", 401, "authentication_error"},
		{"token prefix", "s3cret-token", "Bearer s3cret", 401, "authentication_error"},
		{"wrong scheme", "s3cret-token", "Basic s3cret-token", 401, "authentication_error"},
		{"right token", "s3cret-token", "Bearer s3cret-token", 200, ""},
		{"scheme case-insensitive", "s3cret-token", "bearer s3cret-token", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := New(tt.token, src, NewLog(4))
			for _, p := range []string{"/admin/backends", "/admin/decisions"} {
				status, body, hdr := call(t, h, http.MethodGet, p, tt.auth)
				if status != tt.wantStatus {
					t.Fatalf("GET %s: status %d, want %d: %s", p, status, tt.wantStatus, body)
				}
				if tt.wantType != "" {
					if typ := errorType(t, body); typ != tt.wantType {
						t.Errorf("GET %s: error type %q, want %q", p, typ, tt.wantType)
					}
				}
				if status == 401 && hdr.Get("WWW-Authenticate") == "" {
					t.Errorf("401 without WWW-Authenticate")
				}
			}
			// A state change needs the token as well.
			status, _, _ := call(t, h, http.MethodPost, "/admin/backends/b0/drain", tt.auth)
			if status != tt.wantStatus {
				t.Errorf("POST drain: status %d, want %d", status, tt.wantStatus)
			}
			if status != 200 && src.Backends()[0].Draining {
				t.Errorf("unauthorised drain took effect")
			}
			_ = src.Undrain("b0")
		})
	}
}

func TestBackendsDrainUndrain(t *testing.T) {
	src := newFakeSource("b0", "b1", "pool/10.0.0.5:8000")
	src.removing["b1"] = true
	h := New("tok", src, NewLog(4))
	const auth = "Bearer tok"
	draining := func() map[string]bool {
		t.Helper()
		status, body, _ := call(t, h, http.MethodGet, "/admin/backends", auth)
		if status != 200 {
			t.Fatalf("GET backends: %d %s", status, body)
		}
		var got struct{ Backends []Backend }
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, b := range got.Backends {
			m[b.Name] = b.Draining
		}
		return m
	}
	if d := draining(); len(d) != 3 || d["b0"] || d["b1"] {
		t.Fatalf("initial state %v", d)
	}
	tests := []struct {
		method, path string
		wantStatus   int
		wantDrain    map[string]bool
	}{
		{http.MethodPost, "/admin/backends/b0/drain", 200, map[string]bool{"b0": true, "b1": false, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/b0/drain", 200, map[string]bool{"b0": true, "b1": false, "pool/10.0.0.5:8000": false}}, // idempotent
		{http.MethodPost, "/admin/backends/b1/drain", 200, map[string]bool{"b0": true, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/b0/undrain", 200, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/b1/undrain", 409, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/nope/drain", 404, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/b0/explode", 404, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodGet, "/admin/backends/b0/drain", 405, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends", 405, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodGet, "/admin/nothing", 404, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		// A DNS pool's backend is named pool/host:port.
		{http.MethodPost, "/admin/backends/pool/10.0.0.5:8000/drain", 200, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": true}},
		{http.MethodPost, "/admin/backends/pool/10.0.0.5:8000/undrain", 200, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends//drain", 404, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
		{http.MethodPost, "/admin/backends/drain", 404, map[string]bool{"b0": false, "b1": true, "pool/10.0.0.5:8000": false}},
	}
	for _, tt := range tests {
		status, body, _ := call(t, h, tt.method, tt.path, auth)
		if status != tt.wantStatus {
			t.Errorf("%s %s: status %d, want %d: %s", tt.method, tt.path, status, tt.wantStatus, body)
		}
		if status != 200 {
			errorType(t, body)
		} else if !strings.Contains(body, `"draining"`) {
			t.Errorf("%s %s: answer does not show the backend: %s", tt.method, tt.path, body)
		}
		if d := draining(); fmt.Sprint(d) != fmt.Sprint(tt.wantDrain) {
			t.Errorf("after %s %s: draining %v, want %v", tt.method, tt.path, d, tt.wantDrain)
		}
	}
}

func TestDecisionLog(t *testing.T) {
	l := NewLog(3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		l.Record(Decision{Time: t0.Add(time.Duration(i) * time.Second), Model: "m", Backend: fmt.Sprintf("b%d", i), Session: "client-0123456789", Retries: i})
	}
	got := l.Last(10)
	if len(got) != 3 {
		t.Fatalf("Last(10) = %d decisions, want the 3 kept", len(got))
	}
	for i, want := range []string{"b4", "b3", "b2"} {
		if got[i].Backend != want || got[i].Retries != 4-i {
			t.Errorf("decision %d = %+v, want backend %s newest first", i, got[i], want)
		}
		if got[i].Session != "client-0…" {
			t.Errorf("session shown as %q, want it truncated to %q", got[i].Session, "client-0…")
		}
	}
	if got := l.Last(1); len(got) != 1 || got[0].Backend != "b4" {
		t.Errorf("Last(1) = %+v", got)
	}
	for _, tt := range []struct{ in, want string }{{"", ""}, {"short", "short"}, {"12345678", "12345678"}, {"ééééééééé", "éééééééé…"}} {
		if got := Truncate(tt.in); got != tt.want {
			t.Errorf("Truncate(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}

	h := New("tok", newFakeSource(), l)
	status, body, _ := call(t, h, http.MethodGet, "/admin/decisions?limit=2", "Bearer tok")
	var out struct{ Decisions []Decision }
	if status != 200 || json.Unmarshal([]byte(body), &out) != nil || len(out.Decisions) != 2 || out.Decisions[0].Backend != "b4" {
		t.Fatalf("GET decisions?limit=2: %d %s", status, body)
	}
	if strings.Contains(body, "0123456789") {
		t.Error("the full session key leaked into the answer")
	}
	for _, q := range []string{"0", "-1", "x"} {
		if status, body, _ := call(t, h, http.MethodGet, "/admin/decisions?limit="+q, "Bearer tok"); status != 400 {
			t.Errorf("limit=%s: status %d, want 400: %s", q, status, body)
		}
	}
}

func TestLogConcurrent(t *testing.T) {
	l := NewLog(64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				l.Record(Decision{Backend: fmt.Sprint(g), Retries: i})
				_ = l.Last(8)
			}
		})
	}
	wg.Wait()
	if got := len(l.Last(1000)); got != 64 {
		t.Errorf("kept %d decisions, want 64", got)
	}
}

func BenchmarkRecord(b *testing.B) {
	l := NewLog(256)
	d := Decision{Time: time.Now(), Model: "m", Session: "abc", Backend: "b0", Reason: "policy=kvroute prefix=3/4 sticky"}
	b.ReportAllocs()
	for b.Loop() {
		l.Record(d)
	}
}
