package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/workload"
)

// fake is an OpenAI-compatible server that streams the requested number of
// tokens: the first after ttft, then one every itl. It reports half of the
// prompt as cached.
type fake struct {
	ttft, itl time.Duration
	// mode changes behaviour: "" streams normally, "broken" stops before
	// [DONE], "reject" answers 400 with an OpenAI error, "chat-role" sends a
	// role-only chunk first.
	mode     string
	inflight atomic.Int64
	peak     atomic.Int64
	sessions atomic.Int64
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
		return
	}
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	kind := request.Completion
	if r.URL.Path == "/v1/chat/completions" {
		kind = request.Chat
	}
	buf, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	v, perr := request.Parse(kind, buf, request.Options{})
	if perr != nil {
		perr.Write(w)
		return
	}
	if v.Model != "fake-model" {
		openai.WriteError(w, 404, openai.TypeNotFound, "model_not_found", "the model "+v.Model+" does not exist", 0)
		return
	}
	if f.mode == "reject" {
		openai.WriteError(w, 400, openai.TypeInvalidRequest, "", "prompt is too long for this model", 0)
		return
	}
	if r.Header.Get(SessionHeader) != "" {
		f.sessions.Add(1)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set(BackendHeader, "engine-7")
	fl := w.(http.Flusher)
	if f.mode == "chat-role" {
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		fl.Flush()
	}
	time.Sleep(f.ttft)
	for i := 0; i < v.MaxTokens; i++ {
		if i > 0 {
			time.Sleep(f.itl)
		}
		if kind == request.Chat {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
		} else {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d \",\"finish_reason\":null}]}\n\n", i)
		}
		fl.Flush()
	}
	if f.mode == "broken" {
		return
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
		v.PromptTokens, v.MaxTokens, v.PromptTokens+v.MaxTokens, v.PromptTokens/2)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// traceRequests loads n trace requests of 400 prompt tokens and out output
// tokens, arriving gap apart.
func traceRequests(t *testing.T, n, out int, gap time.Duration) []workload.Request {
	t.Helper()
	var sb strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, `{"timestamp": %d, "input_length": 400, "output_length": %d, "hash_ids": [%d]}`+"\n", int(gap/time.Millisecond)*i, out, i)
	}
	p := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := workload.Load(p, workload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestRunMeasuresStreams(t *testing.T) {
	f := &fake{ttft: 30 * time.Millisecond, itl: 5 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	reqs := traceRequests(t, 10, 5, 10*time.Millisecond)
	run, err := Run(context.Background(), Config{Target: srv.URL + "/v1", Requests: reqs, Policy: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	if run.Completed != 10 || run.Errors != 0 {
		t.Fatalf("completed %d, errors %d, want 10 and 0: %+v", run.Completed, run.Errors, run.Samples)
	}
	for i, s := range run.Samples {
		if s.TTFT < f.ttft || s.TTFT > f.ttft+500*time.Millisecond {
			t.Errorf("sample %d: TTFT %v, server waits %v", i, s.TTFT, f.ttft)
		}
		if len(s.ITL) != 4 {
			t.Errorf("sample %d: %d gaps for 5 tokens", i, len(s.ITL))
		}
		// Delivery jitter shifts single gaps; their sum spans the server's
		// three-plus sleeps between the first and the last token.
		var sum time.Duration
		for _, g := range s.ITL {
			sum += g
		}
		if sum < 3*f.itl || sum > 4*f.itl+400*time.Millisecond {
			t.Errorf("sample %d: gaps %v sum to %v, server slept %v", i, s.ITL, sum, 4*f.itl)
		}
		if want := f.ttft + 4*f.itl; s.E2E < want || s.E2E < s.TTFT {
			t.Errorf("sample %d: E2E %v, want at least %v", i, s.E2E, want)
		}
		if s.PromptTokens != 400 || s.CachedTokens != 200 || s.OutputTokens != 5 || s.Backend != "engine-7" {
			t.Errorf("sample %d: %+v", i, s)
		}
		if s.Start != time.Duration(i)*10*time.Millisecond {
			t.Errorf("sample %d: start %v", i, s.Start)
		}
	}
	if run.PrefixHitRate != 0.5 || run.Policy != "fake" || run.OutputTokS <= 0 {
		t.Errorf("run %+v", run)
	}
}

// TestOpenLoop: a slow server must not delay later requests. With 300 ms
// to the first token and requests 20 ms apart, a closed-loop client would
// see 10 requests take 3 s; an open-loop one about 0.5 s, and every TTFT
// stays near 300 ms.
func TestOpenLoop(t *testing.T) {
	f := &fake{ttft: 300 * time.Millisecond, itl: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	start := time.Now()
	run, err := Run(context.Background(), Config{Target: srv.URL, Requests: traceRequests(t, 10, 2, 20*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Errorf("run took %v; requests waited for each other", el)
	}
	if run.Completed != 10 || run.TTFT.P99 > 800 {
		t.Errorf("completed %d, p99 TTFT %.0f ms, want 10 near 300 ms", run.Completed, run.TTFT.P99)
	}
	if f.peak.Load() < 5 {
		t.Errorf("at most %d requests in flight at once; want them overlapping", f.peak.Load())
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		mode, want string
	}{
		{"reject", "HTTP 400: prompt is too long for this model"},
		{"broken", "without [DONE]"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			srv := httptest.NewServer(&fake{mode: tc.mode})
			defer srv.Close()
			run, err := Run(context.Background(), Config{Target: srv.URL, Requests: traceRequests(t, 3, 2, time.Millisecond)})
			if err != nil {
				t.Fatal(err)
			}
			if run.Errors != 3 || run.Completed != 0 {
				t.Fatalf("errors %d, completed %d, want 3 and 0", run.Errors, run.Completed)
			}
			if got := run.Samples[0].Err; !strings.Contains(got, tc.want) {
				t.Errorf("error %q, want %q", got, tc.want)
			}
		})
	}
	srv := httptest.NewServer(&fake{})
	defer srv.Close()
	run, err := Run(context.Background(), Config{Target: srv.URL, Model: "other", Requests: traceRequests(t, 1, 1, 0)})
	if err != nil || run.Errors != 1 || !strings.Contains(run.Samples[0].Err, "HTTP 404: the model other does not exist") {
		t.Errorf("wrong model: err %v, samples %+v", err, run.Samples)
	}
	if _, err := Run(context.Background(), Config{Target: "localhost:80"}); err == nil || !strings.Contains(err.Error(), "not an http(s) URL") {
		t.Errorf("bad target: %v", err)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	if _, err := Run(context.Background(), Config{Target: dead.URL}); err == nil || !strings.Contains(err.Error(), "list models") {
		t.Errorf("unreachable target: %v", err)
	}
}

func TestChatSessionsAndRoleChunk(t *testing.T) {
	f := &fake{mode: "chat-role", ttft: 40 * time.Millisecond, itl: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	reqs, err := workload.Load("chat", workload.Options{Seed: 1, Limit: 8, Rate: 100})
	if err != nil {
		t.Fatal(err)
	}
	run, err := Run(context.Background(), Config{Target: srv.URL, Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if run.Completed != 8 || f.sessions.Load() != 8 {
		t.Fatalf("completed %d with %d session headers, want 8 and 8: %+v", run.Completed, f.sessions.Load(), run.Samples)
	}
	// The role chunk comes at once and carries no token: TTFT waits for text.
	if run.TTFT.P50 < 40 {
		t.Errorf("p50 TTFT %.1f ms, below the server's 40 ms: the role chunk was taken for a token", run.TTFT.P50)
	}
}

func TestMaxConcurrency(t *testing.T) {
	f := &fake{ttft: 200 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	run, err := Run(context.Background(), Config{Target: srv.URL, Requests: traceRequests(t, 5, 1, 0), MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if run.Completed != 2 || run.Errors != 3 || f.peak.Load() > 2 {
		t.Errorf("completed %d, errors %d, peak %d; want 2, 3, at most 2", run.Completed, run.Errors, f.peak.Load())
	}
}

func TestDurationAndCancel(t *testing.T) {
	f := &fake{itl: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	reqs := traceRequests(t, 10, 1, 100*time.Millisecond)
	run, err := Run(context.Background(), Config{Target: srv.URL, Requests: reqs, Duration: 250 * time.Millisecond})
	if err != nil || run.Completed != 3 {
		t.Errorf("duration 250ms over arrivals 100ms apart: completed %d (err %v), want 3", run.Completed, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	run, err = Run(ctx, Config{Target: srv.URL, Requests: reqs})
	if err == nil || time.Since(start) > time.Second {
		t.Errorf("cancelled run: err %v after %v", err, time.Since(start))
	}
	if len(run.Samples) != 2 {
		t.Errorf("cancelled at 150ms: %d samples, want 2", len(run.Samples))
	}
}

func TestParseChunk(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		content bool
		usage   bool
		err     string
	}{
		{"completion text", `{"choices":[{"index":0,"text":"hi","finish_reason":null}]}`, true, false, ""},
		{"chat content", `{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, true, false, ""},
		{"role only", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false, false, ""},
		{"empty text", `{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`, false, false, ""},
		{"null usage", `{"choices":[{"index":0,"text":"x"}],"usage":null}`, true, false, ""},
		{"usage", `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`, false, true, ""},
		{"error event", `{"error":{"message":"engine died","type":"server_error"}}`, false, false, "engine died"},
		{"not an object", `hello`, false, false, "malformed"},
		{"bad usage", `{"usage":{"prompt_tokens":"x"}}`, false, false, "malformed usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := parseChunk([]byte(tc.data))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || ev.content != tc.content || (ev.usage != nil) != tc.usage {
				t.Errorf("got content %v usage %v err %v", ev.content, ev.usage, err)
			}
		})
	}
}

func TestReadStreamFallbacks(t *testing.T) {
	// No usage chunk: text chunks count as tokens. CRLF and comments are fine.
	st, err := readStream(strings.NewReader(": ping\r\n\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata:{\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n"), time.Now())
	if err != nil || st.output != 2 || len(st.itl) != 1 {
		t.Errorf("got %+v, %v", st, err)
	}
	if _, err := readStream(strings.NewReader("data: [DONE]\n\n"), time.Now()); err == nil {
		t.Error("a stream without tokens is accepted")
	}
	if _, err := readStream(strings.NewReader("data: {\"choices\":[{\"text\":\""+strings.Repeat("a", maxEventBytes)+"\"}]}\n\n"), time.Now()); err == nil {
		t.Error("an oversized event is accepted")
	}
}

// TestReadStreamCached: the cached prompt tokens are read as each engine
// reports them: vLLM's and SGLang's usage, llama.cpp's timings (its
// prompt tokens less those it computed, or cache_n).
func TestReadStreamCached(t *testing.T) {
	tests := []struct{ name, last string }{
		{"vLLM", `{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":64}}}`},
		{"llama.cpp", `{"choices":[{"text":"","index":0,"finish_reason":"length"}],"object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":100,"total_tokens":101},"timings":{"prompt_n":36,"prompt_ms":9.1}}`},
		{"llama.cpp with cache_n", `{"choices":[],"timings":{"cache_n":64,"prompt_n":36},"usage":{"completion_tokens":1,"prompt_tokens":100}}`},
	}
	for _, tt := range tests {
		st, err := readStream(strings.NewReader("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: "+tt.last+"\n\ndata: [DONE]\n\n"), time.Now())
		if err != nil || st.cached != 64 || st.prompt != 100 {
			t.Errorf("%s: cached %d of %d, err %v; want 64 of 100", tt.name, st.cached, st.prompt, err)
		}
	}
}

func BenchmarkParseChunk(b *testing.B) {
	data := []byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if ev, _ := parseChunk(data); !ev.content {
			b.Fatal("no content")
		}
	}
}

// TestSpreadFailsOver: with a target down (its connections refused), the
// requests drawn for it go to the next target and complete; those drawn for
// the live one enter it first; without another target, a refusal is an
// error.
func TestSpreadFailsOver(t *testing.T) {
	srv := httptest.NewServer(&fake{})
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	run, err := Run(context.Background(), Config{Target: srv.URL, Spread: []string{dead.URL}, SpreadSeed: 1, Model: "fake-model", Requests: traceRequests(t, 20, 2, time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, s := range run.Samples {
		if s.Entry != 0 || s.Err != "" {
			t.Errorf("sample entered target %d, err %q; want 0 and none", s.Entry, s.Err)
		}
		refused += s.Refused
	}
	if run.Completed != 20 || refused == 0 || refused == 20 {
		t.Errorf("completed %d, %d refused by the dead target; want 20 and some of them", run.Completed, refused)
	}
	run, err = Run(context.Background(), Config{Target: dead.URL, Model: "fake-model", Requests: traceRequests(t, 2, 1, time.Millisecond)})
	if err != nil || run.Errors != 2 || !strings.Contains(run.Samples[0].Err, "refused") {
		t.Errorf("one dead target: err %v, %d errors, first %q", err, run.Errors, run.Samples[0].Err)
	}
}
