package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

const testPreset = "h100-llama3-8b"

// newTestServer serves an emulated engine on loopback; scale speeds the
// emulated clock up so that tests stay fast.
func newTestServer(t *testing.T, scale float64) (*Server, *httptest.Server) {
	t.Helper()
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, Config{Preset: p, TimeScale: scale})
}

// serve runs a Server for cfg behind a loopback HTTP server, both closed
// when the test ends.
func serve(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		s.Close()
		hs.Close()
	})
	return s, hs
}

func post(t *testing.T, ctx context.Context, url string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseEvents reads a whole event stream into its data payloads.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not an SSE data line", line)
		}
		out = append(out, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// body builds a request body for endpoint path.
func body(path, model, prompt string, extra map[string]any) map[string]any {
	b := map[string]any{"model": model}
	if strings.Contains(path, "chat") {
		b["messages"] = []map[string]any{{"role": "user", "content": prompt}}
	} else {
		b["prompt"] = prompt
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestCompletionsExactLength(t *testing.T) {
	s, hs := newTestServer(t, 50)
	cases := []struct {
		name   string
		path   string
		stream bool
		extra  map[string]any
		want   int
		finish string
	}{
		{"chat ignore_eos", "/v1/chat/completions", false, map[string]any{"max_tokens": 17, "ignore_eos": true}, 17, "length"},
		{"chat stream ignore_eos", "/v1/chat/completions", true, map[string]any{"max_tokens": 23, "ignore_eos": true}, 23, "length"},
		{"chat stream min_tokens", "/v1/chat/completions", true, map[string]any{"max_completion_tokens": 9, "min_tokens": 9}, 9, "length"},
		{"completion ignore_eos", "/v1/completions", false, map[string]any{"max_tokens": 12, "ignore_eos": true}, 12, "length"},
		{"completion stream ignore_eos", "/v1/completions", true, map[string]any{"max_tokens": 31, "ignore_eos": true}, 31, "length"},
		{"completion min_tokens", "/v1/completions", false, map[string]any{"max_tokens": 5, "min_tokens": 5}, 5, "length"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prompt := fmt.Sprintf("case %d: %s", i, strings.Repeat("lorem ipsum ", 40))
			b := body(tc.path, s.Model(), prompt, tc.extra)
			b["stream"] = tc.stream
			if tc.stream {
				b["stream_options"] = map[string]any{"include_usage": true}
			}
			resp := post(t, t.Context(), hs.URL+tc.path, b)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				msg, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, msg)
			}
			chat := strings.Contains(tc.path, "chat")
			var text strings.Builder
			var usage *openai.Usage
			var finish string
			if tc.stream {
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
					t.Fatalf("Content-Type %q", ct)
				}
				ev := sseEvents(t, resp.Body)
				if ev[len(ev)-1] != "[DONE]" {
					t.Fatalf("last event %q, want [DONE]", ev[len(ev)-1])
				}
				var chunks []openai.Response
				for _, e := range ev[:len(ev)-1] {
					var c openai.Response
					if err := json.Unmarshal([]byte(e), &c); err != nil {
						t.Fatalf("chunk %q: %v", e, err)
					}
					chunks = append(chunks, c)
				}
				// The usage chunk comes last, with no choices.
				last := chunks[len(chunks)-1]
				if last.Usage == nil || len(last.Choices) != 0 || !strings.Contains(ev[len(ev)-2], `"choices":[]`) {
					t.Fatalf("last chunk %s, want choices [] and usage", ev[len(ev)-2])
				}
				usage = last.Usage
				chunks = chunks[:len(chunks)-1]
				wantObj := "text_completion"
				if chat {
					wantObj = "chat.completion.chunk"
					if d := chunks[0].Choices[0].Delta; d == nil || d.Role != "assistant" || d.Content != "" {
						t.Fatalf("first chat chunk %+v, want the assistant role and no content", chunks[0])
					}
					chunks = chunks[1:]
				}
				if len(chunks) != tc.want {
					t.Fatalf("%d token chunks, want %d", len(chunks), tc.want)
				}
				for j, c := range chunks {
					if c.Object != wantObj || c.Model != s.Model() || len(c.Choices) != 1 {
						t.Fatalf("chunk %d: %+v", j, c)
					}
					ch := c.Choices[0]
					if chat {
						text.WriteString(ch.Delta.Content)
					} else {
						text.WriteString(*ch.Text)
					}
					if fr := ch.FinishReason; (fr != nil) != (j == len(chunks)-1) {
						t.Fatalf("chunk %d of %d has finish_reason %v", j, len(chunks), fr)
					} else if fr != nil {
						finish = *fr
					}
				}
			} else {
				var r openai.Response
				if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
					t.Fatal(err)
				}
				want := "text_completion"
				if chat {
					want = "chat.completion"
				}
				if r.Object != want || len(r.Choices) != 1 || r.Choices[0].FinishReason == nil {
					t.Fatalf("response %+v", r)
				}
				if chat {
					text.WriteString(r.Choices[0].Message.Content)
				} else {
					text.WriteString(*r.Choices[0].Text)
				}
				finish = *r.Choices[0].FinishReason
				usage = r.Usage
			}
			if finish != tc.finish {
				t.Errorf("finish_reason %q, want %q", finish, tc.finish)
			}
			if got := engine.Tokens(text.String()); got != tc.want || text.Len() != tc.want*engine.BytesPerToken {
				t.Errorf("text is %d bytes, %d tokens; want %d tokens", text.Len(), got, tc.want)
			}
			if usage == nil || usage.CompletionTokens != tc.want || usage.PromptTokens < engine.Tokens(prompt) ||
				usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens || usage.PromptTokensDetails == nil {
				t.Errorf("usage %+v, want %d completion tokens and at least the prompt's", usage, tc.want)
			}
		})
	}
}

func completeOnce(t *testing.T, url string, b map[string]any) openai.Response {
	t.Helper()
	resp := post(t, t.Context(), url, b)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	var r openai.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCachedTokensOnRepeatedPrompt(t *testing.T) {
	s, hs := newTestServer(t, 50)
	prompt := strings.Repeat("a long shared document. ", 200) // 4800 bytes, 1200 tokens
	b := map[string]any{"model": s.Model(), "prompt": prompt, "max_tokens": 4, "ignore_eos": true}
	first := completeOnce(t, hs.URL+"/v1/completions", b)
	second := completeOnce(t, hs.URL+"/v1/completions", b)
	if c := first.Usage.PromptTokensDetails.CachedTokens; c != 0 {
		t.Errorf("first request: %d cached tokens on a cold engine", c)
	}
	u := second.Usage
	if u.PromptTokens != engine.Tokens(prompt) {
		t.Errorf("prompt_tokens %d, want %d", u.PromptTokens, engine.Tokens(prompt))
	}
	c := u.PromptTokensDetails.CachedTokens
	// At least all full blocks but the last; never the whole prompt, since
	// the last token is always computed.
	if c < u.PromptTokens-2*engine.BlockSize || c >= u.PromptTokens || c%engine.BlockSize != 0 {
		t.Errorf("second request: %d cached of %d prompt tokens", c, u.PromptTokens)
	}
}

func decodeError(t *testing.T, resp *http.Response) openai.ErrorDetail {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var eb openai.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatal(err)
	}
	return eb.Error
}

func TestErrors(t *testing.T) {
	s, hs := newTestServer(t, 50)
	maxLen := s.Preset().MaxModelLen
	long := strings.Repeat("x", (maxLen+8)*engine.BytesPerToken)
	cases := []struct {
		name    string
		path    string
		body    map[string]any
		status  int
		typ     string
		message string // substring
	}{
		{"context length chat", "/v1/chat/completions", body("chat", s.Model(), long, nil),
			400, "BadRequestError", fmt.Sprintf("maximum context length is %d tokens", maxLen)},
		{"context length completion", "/v1/completions", body("", s.Model(), long, map[string]any{"stream": true}),
			400, "BadRequestError", fmt.Sprintf("maximum context length is %d tokens", maxLen)},
		// max_tokens near 2^63 wrapped the context check: the request
		// was served and generated until the client left.
		{"max_tokens 2^63-1", "/v1/completions", body("", s.Model(), "hi", map[string]any{"max_tokens": int64(math.MaxInt64), "stream": true}),
			400, "BadRequestError", fmt.Sprintf("maximum context length is %d tokens", maxLen)},
		{"max_tokens 2^63-1 chat", "/v1/chat/completions", body("chat", s.Model(), "hi", map[string]any{"max_completion_tokens": int64(math.MaxInt64 - 1)}),
			400, "BadRequestError", fmt.Sprintf("maximum context length is %d tokens", maxLen)},
		{"unknown model", "/v1/chat/completions", body("chat", "gpt-nope", "hi", nil),
			404, "NotFoundError", "The model `gpt-nope` does not exist."},
		{"unknown model completion", "/v1/completions", body("", "gpt-nope", "hi", nil),
			404, "NotFoundError", "The model `gpt-nope` does not exist."},
		{"bad body", "/v1/chat/completions", map[string]any{"model": s.Model()},
			400, "BadRequestError", "messages"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, t.Context(), hs.URL+tc.path, tc.body)
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			e := decodeError(t, resp)
			if e.Type != tc.typ || !strings.Contains(e.Message, tc.message) || e.Code != float64(tc.status) {
				t.Errorf("error %+v, want type %s, code %d, message containing %q", e, tc.typ, tc.status, tc.message)
			}
		})
	}
	if st := s.Stats(); st.Running+st.Waiting != 0 {
		t.Errorf("rejected requests left %d running, %d waiting", st.Running, st.Waiting)
	}
}

func TestModelsAndHealth(t *testing.T) {
	s, hs := newTestServer(t, 50)
	resp, err := http.Get(hs.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("/health: %d %q, want 200 and no body", resp.StatusCode, b)
	}
	resp, err = http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ml openai.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		t.Fatal(err)
	}
	if ml.Object != "list" || len(ml.Data) != 1 || ml.Data[0].ID != s.Model() || ml.Data[0].MaxModelLen != s.Preset().MaxModelLen {
		t.Errorf("/v1/models: %+v", ml)
	}
}

func TestMetrics(t *testing.T) {
	s, hs := newTestServer(t, 50)
	prompt := strings.Repeat("metrics ", 100)
	b := map[string]any{"model": s.Model(), "prompt": prompt, "max_tokens": 3, "ignore_eos": true}
	completeOnce(t, hs.URL+"/v1/completions", b)
	completeOnce(t, hs.URL+"/v1/completions", b)

	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	want := []struct {
		name  string
		typ   string
		value float64 // checked when not negative
	}{
		{"vllm:num_requests_running", "GAUGE", 0},
		{"vllm:num_requests_waiting", "GAUGE", 0},
		{"vllm:kv_cache_usage_perc", "GAUGE", -1},
		{"vllm:prefix_cache_queries_total", "COUNTER", float64(st.PrefixQueries)},
		{"vllm:prefix_cache_hits_total", "COUNTER", float64(st.PrefixHits)},
		{"vllm:num_preemptions_total", "COUNTER", 0},
		{"vllm:prompt_tokens_total", "COUNTER", float64(st.PromptTokens)},
		{"vllm:generation_tokens_total", "COUNTER", 6},
		{"vllm:time_to_first_token_seconds", "HISTOGRAM", -1},
		{"vllm:inter_token_latency_seconds", "HISTOGRAM", -1},
		{"vllm:cache_config_info", "GAUGE", 1},
	}
	for _, w := range want {
		f, ok := fams[w.name]
		if !ok {
			t.Errorf("%s missing", w.name)
			continue
		}
		if f.GetType().String() != w.typ || len(f.Metric) != 1 {
			t.Errorf("%s: type %s with %d series, want one %s", w.name, f.GetType(), len(f.Metric), w.typ)
			continue
		}
		m := f.Metric[0]
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model_name"] != s.Model() || labels["engine"] != "0" {
			t.Errorf("%s labels %v, want model_name=%q engine=0", w.name, labels, s.Model())
		}
		var v float64
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		}
		if w.value >= 0 && v != w.value {
			t.Errorf("%s = %g, want %g", w.name, v, w.value)
		}
		switch w.name {
		case "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total":
			if v <= 0 {
				t.Errorf("%s = %g after a repeated prompt", w.name, v)
			}
		case "vllm:cache_config_info":
			if labels["block_size"] != "16" || labels["num_gpu_blocks"] != fmt.Sprint(s.Preset().KVBlocks) {
				t.Errorf("cache_config_info labels %v", labels)
			}
		case "vllm:time_to_first_token_seconds":
			h := m.Histogram
			var bounds []float64
			for _, b := range h.Bucket {
				if !math.IsInf(b.GetUpperBound(), 1) {
					bounds = append(bounds, b.GetUpperBound())
				}
			}
			if h.GetSampleCount() != 2 || !slices.Equal(bounds, TTFTBuckets) {
				t.Errorf("TTFT histogram: %d samples, buckets %v", h.GetSampleCount(), bounds)
			}
		case "vllm:inter_token_latency_seconds":
			// Two requests of 3 tokens: 2 gaps each, every one a whole
			// engine step (at least its fixed overhead), on the real clock
			// (the server runs 50 times faster than emulated time).
			h := m.Histogram
			step := s.Preset().StepOverhead.Seconds() / 50
			if h.GetSampleCount() != 4 || h.GetSampleSum() < 4*step || h.GetSampleSum() > 4*50*step {
				t.Errorf("ITL histogram: %d samples summing %gs, want 4 of a step or more on the real clock (%gs)", h.GetSampleCount(), h.GetSampleSum(), step)
			}
		}
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	s, hs := newTestServer(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b := map[string]any{"model": s.Model(), "prompt": "count forever", "max_tokens": 4000, "ignore_eos": true, "stream": true}
	resp := post(t, ctx, hs.URL+"/v1/completions", b)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Running != 1 {
		t.Fatalf("running %d while streaming, want 1", st.Running)
	}
	cancel()
	deadline := time.Now().Add(3 * time.Second)
	for {
		st := s.Stats()
		if st.Running == 0 && st.Waiting == 0 {
			if st.GenerationTokens >= 4000 {
				t.Errorf("the request ran to completion (%d tokens) instead of being aborted", st.GenerationTokens)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after disconnect: running %d, waiting %d", st.Running, st.Waiting)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIdleTTFTMatchesTimingModel checks that the wall-clock TTFT of a lone
// request is what the timing model says for an idle engine: one prefill
// step of the whole prompt, StepOverhead + P*PerPrefillToken +
// P*PerContextToken (attention reads the P tokens of its own context),
// divided by the time scale. The scale makes that about 150 ms of real
// time, so that scheduler and HTTP noise stay far below the tolerance.
func TestIdleTTFTMatchesTimingModel(t *testing.T) {
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	const promptTokens = 4000 // one chunk: below MaxBatchedTokens
	if promptTokens > p.MaxBatchedTokens {
		t.Fatalf("prompt of %d tokens needs chunking under %s", promptTokens, p.Name)
	}
	emulated := p.StepOverhead + promptTokens*p.PerPrefillToken + promptTokens*p.PerContextToken
	const wantReal = 150 * time.Millisecond
	scale := emulated.Seconds() / wantReal.Seconds()
	s, err := New(Config{Preset: p, TimeScale: scale})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer func() { s.Close(); hs.Close() }()

	// Never early; the best of five runs late by at most a few percent.
	// Noise on a busy machine only ever adds delay, so the best run is the
	// emulator's own accuracy, unless the machine is so busy that every
	// run waits: then it skips, saying what it measured.
	clock := clocktest.Start(t)
	lo, hi := time.Duration(float64(wantReal)*0.99), time.Duration(float64(wantReal)*1.04)
	var got []time.Duration
	for i := range 5 {
		// A distinct first block each time, so nothing is cached.
		prompt := fmt.Sprintf("%08d", i) + strings.Repeat("abcd", promptTokens-2)
		b := map[string]any{"model": s.Model(), "prompt": prompt, "max_tokens": 1, "ignore_eos": true, "stream": true}
		start := time.Now()
		resp := post(t, t.Context(), hs.URL+"/v1/completions", b)
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		ttft := time.Since(start)
		io.Copy(io.Discard, br)
		resp.Body.Close()
		if err != nil || !strings.Contains(line, `"text"`) {
			t.Fatalf("first line %q: %v", line, err)
		}
		t.Logf("run %d: TTFT %v, timing model %v (emulated %v at scale %.4f); driver %+v",
			i, ttft, wantReal, emulated, scale, s.Driver())
		if ttft < lo {
			t.Errorf("run %d: TTFT %v is earlier than the timing model's %v", i, ttft, wantReal)
		}
		got = append(got, ttft)
	}
	if best := slices.Min(got); best > hi {
		clock.SkipIfBehind(t, hi-wantReal, "best TTFT %v, over %v", best, hi)
		t.Errorf("best TTFT %v, want %v within +4%% (%s)", best, wantReal, clock)
	}
}

// TestTokenChunkTemplate checks the streaming fast path against the JSON
// encoder: template bytes around a word must be exactly the encoded chunk.
func TestTokenChunkTemplate(t *testing.T) {
	cases := []struct {
		kind  request.Kind
		model string
	}{
		{request.Chat, "meta-llama/Llama-3.1-8B-Instruct"},
		{request.Completion, `odd "model" \ name <&>`},
	}
	for _, tc := range cases {
		t.Run(tc.kind.String(), func(t *testing.T) {
			rs := &response{v: &request.View{Kind: tc.kind}}
			chunk := openai.Response{ID: "cmpl-1", Object: "chunk", Created: 1234, Model: tc.model}
			pre, suf := rs.tokenChunk(chunk)
			for i := range 3 {
				word := tokenText(7, i)
				c := openai.Choice{}
				if tc.kind == request.Chat {
					c.Delta = &openai.Message{Content: word}
				} else {
					c.Text = &word
				}
				chunk.Choices = []openai.Choice{c}
				var want bytes.Buffer
				enc := json.NewEncoder(&want)
				enc.SetEscapeHTML(false)
				want.WriteString("data: ")
				enc.Encode(&chunk)
				want.WriteByte('\n')
				got := string(pre) + word + string(suf)
				if got != want.String() {
					t.Errorf("template gives\n%s\nencoder gives\n%s", got, want.String())
				}
			}
		})
	}
}

func TestStartServesUntilContextDone(t *testing.T) {
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r, err := Start(ctx, Config{Preset: p, TimeScale: 50, Model: "served"}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !strings.HasPrefix(r.URL, "http://127.0.0.1:") {
		t.Errorf("URL %q", r.URL)
	}
	// A stream in flight when the context ends is cut, not left hanging.
	b := map[string]any{"model": "served", "prompt": "go on", "max_tokens": 5000, "ignore_eos": true, "stream": true}
	resp := post(t, t.Context(), r.URL+"/v1/completions", b)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	rest, _ := io.ReadAll(br)
	if bytes.Contains(rest, []byte("[DONE]")) {
		t.Errorf("stream ran to [DONE] after the server stopped")
	}
	// The listener closes right after the engine; give it a moment.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(r.URL + "/health")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("still serving 2s after the context ended")
		}
	}
}

// Completion ids are unique across engines and requests: two engines
// given the same requests in the same order gave the same ids (a counter
// and the prompt's hash), which a client or a log joining responses by
// id could not tell apart. Chat and text completions both.
func TestCompletionIDsUnique(t *testing.T) {
	_, a := newTestServer(t, 50)
	s, b := newTestServer(t, 50)
	seen := map[string]string{}
	for i := range 2 {
		for _, hs := range []*httptest.Server{a, b} {
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				r := completeOnce(t, hs.URL+path, body(path, s.Model(), "the same prompt", map[string]any{"max_tokens": 1}))
				prefix := "cmpl-"
				if strings.Contains(path, "chat") {
					prefix = "chatcmpl-"
				}
				where := fmt.Sprintf("%s%s #%d", hs.URL, path, i)
				if !strings.HasPrefix(r.ID, prefix) || len(r.ID) != len(prefix)+32 {
					t.Errorf("%s: id %q, want %s and 32 hex digits", where, r.ID, prefix)
				}
				if other, dup := seen[r.ID]; dup {
					t.Errorf("%s: id %q, given before by %s", where, r.ID, other)
				}
				seen[r.ID] = where
			}
		}
	}
}
