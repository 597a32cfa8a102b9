package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// mode is what a fake backend does with a completion request.
type mode int32

const (
	modeOK mode = iota
	// modeClose closes the connection without answering.
	modeClose
	// mode500 answers 500 with an error body.
	mode500
	// modeHeadersThenClose sends 200 headers, then breaks the connection
	// before the first body byte.
	modeHeadersThenClose
	// modeBreak sends the first event of a stream, then breaks the
	// connection.
	modeBreak
	// modeHang accepts the request and answers nothing until the request
	// is cancelled.
	modeHang
	// modeGated sends the first event, then waits for gate before the rest.
	modeGated
	// modeBreakAfterDone sends the whole stream, data: [DONE] included,
	// then breaks the connection before the chunked body's end.
	modeBreakAfterDone
)

// holdPrefill in a prompt makes a fake hold the request in its prefill
// (no first byte) until the client leaves, whatever its mode.
const holdPrefill = "HOLD-PREFILL"

// holdDecode in a streamed prompt makes a fake send its first token and
// then hold the stream open (decoding) until the client leaves.
const holdDecode = "HOLD-DECODE"

// fake is an in-process OpenAI-compatible backend. Its answers are a pure
// function of its name, so tests can compute the exact expected bytes.
type fake struct {
	name   string
	srv    *httptest.Server
	mode   atomic.Int32
	health atomic.Bool
	// pings counts the router's one-token completions that probe it
	// (prompt "ping").
	pings atomic.Int64
	hits  atomic.Int64
	// modelHits counts GET /v1/models.
	modelHits atomic.Int64
	// prefillRate, in tokens per second (0: instant), delays the first byte by the
	// request's uncached prompt tokens over it. Prefills run one at a time
	// and the fake remembers every prompt it has seen, like an engine with
	// a prefix cache and a queue, so that load and cache both show in
	// TTFT.
	prefillRate float64
	prefillMu   sync.Mutex
	seen        []string
	events      int
	gap         time.Duration
	gate        chan struct{}
	// started receives a value when a request arrives; cancelled when a
	// request's context ends before its answer did.
	started, cancelled chan struct{}
	lastBody           atomic.Pointer[[]byte]
	lastHeader         atomic.Pointer[http.Header]
}

// newFake starts a fake backend named name; it is closed at the end of the
// test.
func newFake(t testing.TB, name string) *fake {
	t.Helper()
	f := &fake{
		name:        name,
		prefillRate: 50000,
		events:      4,
		gap:         2 * time.Millisecond,
		gate:        make(chan struct{}),
		started:     make(chan struct{}, 1000),
		cancelled:   make(chan struct{}, 1000),
	}
	f.health.Store(true)
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) setMode(m mode) { f.mode.Store(int32(m)) }

// streamEvents returns the exact SSE events the fake streams, [DONE]
// included. They carry multi-byte UTF-8 and an SSE comment, so that any
// re-encoding by the router would show.
func streamEvents(name string, n int) []string {
	ev := []string{": keep-alive comment\n\n"}
	for i := range n {
		ev = append(ev, fmt.Sprintf(`data: {"id":"c-%s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"%s-%d héllo ✓ "},"finish_reason":null}]}`+"\n\n", name, name, i))
	}
	return append(ev, "data: [DONE]\n\n")
}

// jsonAnswer is the exact non-streaming answer of the fake.
func jsonAnswer(name string) string {
	return `{"id":"c-` + name + `","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"from ` + name + ` ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}` + "\n"
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !f.health.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		return
	case "/v1/models":
		f.modelHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"shared","object":"model","created":1,"owned_by":"fake","max_model_len":4096},{"id":"own-%s","object":"model","created":1,"owned_by":"fake"}]}`, f.name)
		return
	case "/v1/echo", "/v1/embeddings", "/v1/audio/transcriptions", "/rerank", "/tokenize", "/v1/messages/count_tokens":
		f.hits.Add(1)
		if mode(f.mode.Load()) == modeClose {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		if mode(f.mode.Load()) == modeHang {
			_, _ = io.Copy(io.Discard, r.Body) // then the server sees the client leave
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Fake", f.name)
		_, _ = io.Copy(w, r.Body)
		return
	case "/v1/chat/completions", "/v1/completions", "/v1/responses":
	default:
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	h := r.Header.Clone()
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id) // as vLLM with --enable-request-id-headers
	}
	f.lastBody.Store(&body)
	f.lastHeader.Store(&h)
	f.hits.Add(1)
	if bytes.Contains(body, []byte(`"prompt":"ping"`)) {
		f.pings.Add(1)
	}
	signal(f.started)
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	ctx := r.Context()
	flusher := w.(http.Flusher)

	switch mode(f.mode.Load()) {
	case modeClose:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	case mode500:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"engine died","type":"server_error","param":null,"code":null}}`)
		return
	case modeHeadersThenClose:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		flusher.Flush()
		panic(http.ErrAbortHandler)
	case modeHang:
		<-ctx.Done()
		signal(f.cancelled)
		return
	}
	if bytes.Contains(body, []byte(holdPrefill)) {
		// A prompt the fake is still prefilling when the test ends.
		<-ctx.Done()
		return
	}

	if !f.prefill(ctx, body, kindOf(r.URL.Path)) {
		signal(f.cancelled)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, jsonAnswer(f.name))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	for i, ev := range streamEvents(f.name, f.events) {
		if i > 0 {
			switch mode(f.mode.Load()) {
			case modeBreak:
				panic(http.ErrAbortHandler)
			case modeGated:
				select {
				case <-f.gate:
				case <-ctx.Done():
					signal(f.cancelled)
					return
				}
			}
			select {
			case <-time.After(f.gap):
			case <-ctx.Done():
				signal(f.cancelled)
				return
			}
		}
		_, _ = io.WriteString(w, ev)
		flusher.Flush()
		if i == 1 && bytes.Contains(body, []byte(holdDecode)) {
			<-ctx.Done()
			return
		}
	}
	if mode(f.mode.Load()) == modeBreakAfterDone {
		panic(http.ErrAbortHandler)
	}
}

// prefill waits for the fake's turn, then for the time its uncached
// tokens take; it reports false if ctx ended first.
func (f *fake) prefill(ctx context.Context, body []byte, k request.Kind) bool {
	if f.prefillRate <= 0 {
		return true
	}
	v, err := request.Parse(k, body, request.Options{})
	if err != nil {
		return true
	}
	f.prefillMu.Lock()
	defer f.prefillMu.Unlock()
	cached := 0
	for _, p := range f.seen {
		n := 0
		for n < len(p) && n < len(v.Prompt) && p[n] == v.Prompt[n] {
			n++
		}
		cached = max(cached, n)
	}
	f.seen = append(f.seen, v.Prompt)
	uncached := request.EstimateTokens(v.Prompt[cached:])
	select {
	case <-time.After(time.Duration(float64(uncached) / f.prefillRate * float64(time.Second))):
		return true
	case <-ctx.Done():
		return false
	}
}

func kindOf(path string) request.Kind {
	if strings.HasSuffix(path, "/chat/completions") {
		return request.Chat
	}
	if strings.HasSuffix(path, "/responses") {
		return request.Responses
	}
	return request.Completion
}

// signal sends on ch without blocking; a full channel means nobody is
// counting.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// completionOnly serves the paths of a test backend that are not a chat
// completion: /health answers 200 and anything else (engine-metric
// scrapes, model probes) 404. It reports whether r is a completion, for
// the backend to serve.
func completionOnly(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case "/v1/chat/completions":
		return true
	case "/health":
	default:
		http.NotFound(w, r)
	}
	return false
}
