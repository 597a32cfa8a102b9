package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
)

// relayRig is a router (handler only) in front of one backend that answers
// each request with the bytes the fuzz input chose.
type relayRig struct {
	srv     *router
	answers sync.Map // X-Fuzz-Key -> []byte
	split   sync.Map // X-Fuzz-Key -> int
	next    atomic.Int64
}

func newRelayRig(f *testing.F) *relayRig {
	f.Helper()
	r := &relayRig{}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		key := req.Header.Get("X-Fuzz-Key")
		v, _ := r.answers.Load(key)
		b, _ := v.([]byte)
		s, _ := r.split.Load(key)
		n, _ := s.(int)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(b[:n])
		w.(http.Flusher).Flush()
		_, _ = w.Write(b[n:])
	}))
	f.Cleanup(backend.Close)
	cfg := config.Default()
	cfg.Backends = []config.Backend{{URL: backend.URL, Name: "b0", Models: []string{"m"}}}
	cfg.Health.Path = "" // no checks and no ejection: every input meets a healthy backend
	cfg.Engines.Enabled = false
	cfg.Limits.MaxBodyBytes = 1 << 20
	if err := cfg.Validate(); err != nil {
		f.Fatal(err)
	}
	srv, err := newRouter(cfg, nil)
	if err != nil {
		f.Fatal(err)
	}
	r.srv = srv
	return r
}

// FuzzRelay sends a fuzzed body to the completion endpoints of a router
// whose backend answers with fuzzed bytes (split in two writes with a
// flush between them). Properties: the router never panics; it either
// rejects the request with a 4xx in the OpenAI error shape, or relays the
// backend's bytes exactly, but for the values of kv_transfer_params
// members (disagg.Answer); and its load accounting is back to zero after
// each request.
func FuzzRelay(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/relay/*")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`), b, uint16(len(b)/2), false)
	}
	f.Add([]byte(`{"model":"m","prompt":"once upon","max_tokens":3}`), []byte(`{"choices":[{"text":" a time"}]}`), uint16(3), true)
	f.Add([]byte(`{"model":"other","messages":[]}`), []byte{}, uint16(0), false)
	f.Add([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		[]byte("data: {\"choices\":[],\"kv_transfer_params\":{\"remote_host\":\"10.0.0.7\"}}\n\ndata: [DONE]\n\n"), uint16(30), false)
	r := newRelayRig(f)
	f.Fuzz(func(t *testing.T, body, answer []byte, split uint16, completion bool) {
		key := strconv.FormatInt(r.next.Add(1), 10)
		r.answers.Store(key, answer)
		r.split.Store(key, min(int(split), len(answer)))
		defer r.answers.Delete(key)
		defer r.split.Delete(key)
		path := "/v1/chat/completions"
		if completion {
			path = "/v1/completions"
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("X-Fuzz-Key", key)
		rec := httptest.NewRecorder()
		r.srv.Handler().ServeHTTP(rec, req)
		got := rec.Body.Bytes()
		switch {
		case rec.Code == http.StatusOK:
			want := bytes.Clone(answer)
			var a disagg.Answer
			a.Strip(want, true)
			if !bytes.Equal(got, want) {
				t.Fatalf("relayed %q, backend sent %q", got, answer)
			}
		case rec.Code >= 400 && rec.Code < 500:
			if err := checkOpenAIError(got); err != nil {
				t.Fatalf("status %d: %v", rec.Code, err)
			}
		default:
			t.Fatalf("status %d from a healthy backend: %s", rec.Code, got)
		}
		for _, b := range r.srv.Fleet().Snapshot().All {
			if l := b.Load(); l.InFlight != 0 || l.PendingPrefill != 0 || l.Decoding != 0 || l.DecodeBudget != 0 {
				t.Fatalf("load not back to zero: %+v", l)
			}
		}
	})
}

// checkOpenAIError says what is wrong with body as an OpenAI error.
func checkOpenAIError(body []byte) error {
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return fmt.Errorf("not JSON: %q: %w", body, err)
	}
	if e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return fmt.Errorf("not an OpenAI error: %q", body)
	}
	return nil
}
