package tokenize

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// server answers /tokenize with answer (after delay), counting calls and
// keeping the last body.
func server(t *testing.T, status int, answer string, delay time.Duration) (*url.URL, *atomic.Int64, *atomic.Pointer[Request]) {
	t.Helper()
	var calls atomic.Int64
	var last atomic.Pointer[Request]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var req Request
		if err := json.NewDecoder(r.Body).Decode(&req); err == nil {
			last.Store(&req)
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(answer))
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u, &calls, &last
}

func TestTokens(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		answer  string
		delay   time.Duration
		want    []uint32
		wantErr string
	}{
		{"vllm answer", 200, `{"count":3,"max_model_len":8192,"tokens":[1,2,300000]}`, 0, []uint32{1, 2, 300000}, ""},
		{"unknown fields ignored", 200, `{"tokens":[7],"token_strs":null,"extra":{}}`, 0, []uint32{7}, ""},
		{"server error", 500, `{"error":"x"}`, 0, nil, "status 500"},
		{"count mismatch", 200, `{"count":2,"tokens":[1]}`, 0, nil, "count 2 for 1"},
		{"negative id", 200, `{"tokens":[-1]}`, 0, nil, "bad /tokenize answer"},
		{"no tokens", 200, `{"count":0}`, 0, nil, "no tokens"},
		{"not json", 200, `<html>`, 0, nil, "bad /tokenize answer"},
		{"too slow", 200, `{"tokens":[1]}`, time.Second, nil, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, _, last := server(t, tt.status, tt.answer, tt.delay)
			// Only "too slow" needs the timeout to pass; the others have
			// one that a busy machine under -race does not miss.
			timeout := 10 * time.Second
			if tt.delay > 0 {
				timeout = 100 * time.Millisecond
			}
			c, err := New(Config{Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			req, err := RequestOf("m", []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}],"tools":[]}`))
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Tokens(context.Background(), u, Key{"m", 1}, req)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("tokens %v, %v; want %v", got, err, tt.want)
			}
			if r := last.Load(); r == nil || r.Model != "m" || !strings.Contains(string(r.Messages), "hi") {
				t.Errorf("the server saw %+v", r)
			}
		})
	}
}

func TestTokensCached(t *testing.T) {
	u, calls, _ := server(t, 200, `{"count":1,"tokens":[5]}`, 0)
	c, err := New(Config{Timeout: time.Second, CacheEntries: 2, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: "m", Prompt: json.RawMessage(`"abc"`)}
	for _, k := range []Key{{"m", 1}, {"m", 1}, {"n", 1}, {"m", 1}} {
		toks, err := c.Tokens(context.Background(), u, k, req)
		if err != nil {
			t.Fatal(err)
		}
		c.Remember(k, toks)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d calls for two distinct keys", n)
	}
	// An answer not remembered (its request refused) is asked again.
	for range 2 {
		if _, err := c.Tokens(context.Background(), u, Key{"refused", 1}, req); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Errorf("%d calls, want 4: an answer never remembered was cached", n)
	}
}

// The cache is bounded in bytes whatever the count: answers of 64K token
// ids (256 KB each) under a 1 MB budget and an entry bound of 4,096 keep
// at most 1 MB, the most recent ones; an answer larger than the whole
// budget is not kept at all.
func TestCacheBoundedInBytes(t *testing.T) {
	const budget = 1 << 20
	c, err := New(Config{Timeout: time.Second, CacheEntries: 4096, CacheBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	answer := make([]uint32, 64<<10)
	for i := range 60 {
		c.Remember(Key{"m", uint64(i)}, answer)
		if b := c.CachedBytes(); b > budget {
			t.Fatalf("after %d answers the cache holds %d bytes, over its %d", i+1, b, budget)
		}
	}
	if _, ok := c.cache.get(Key{"m", 59}); !ok {
		t.Error("the most recent answer was dropped")
	}
	if _, ok := c.cache.get(Key{"m", 0}); ok {
		t.Error("the oldest answer is still kept past the budget")
	}
	kept := c.cache.lru.Len()
	if want := budget / int(cost(Key{"m", 0}, answer)); kept != want {
		t.Errorf("%d answers kept, want %d", kept, want)
	}
	c.Remember(Key{"huge", 1}, make([]uint32, budget/4+1))
	if _, ok := c.cache.get(Key{"huge", 1}); ok || c.CachedBytes() > budget {
		t.Errorf("an answer over the whole budget was kept (%d bytes cached)", c.CachedBytes())
	}
	// Replacing an answer counts its bytes once.
	before := c.CachedBytes()
	c.Remember(Key{"m", 59}, answer)
	if c.CachedBytes() != before {
		t.Errorf("replacing an answer changed the cached bytes from %d to %d", before, c.CachedBytes())
	}
}

func TestRequestOf(t *testing.T) {
	for _, tt := range []struct {
		body, wantErr string
	}{
		{`{"prompt":"abc"}`, ""},
		{`{"messages":[]}`, ""},
		{`{"max_tokens":3}`, "neither"},
		{`[`, "tokenize"},
		{`{"MESSAGES":[]}`, "neither"},
	} {
		_, err := RequestOf("m", []byte(tt.body))
		if (tt.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("RequestOf(%s): %v, want %q", tt.body, err, tt.wantErr)
		}
	}
}

// TestRequestOfReadsAsTheEngine: the messages, tools and prompt sent to
// /tokenize are the members the engine will read, as request.Parse read
// them, not those of another case or the first of a repeated key.
func TestRequestOfReadsAsTheEngine(t *testing.T) {
	for _, tt := range []struct{ body, messages, tools, prompt string }{
		{`{"messages":[{"role":"user","content":"long"}],"MESSAGES":[{"content":"hi"}]}`, `[{"role":"user","content":"long"}]`, "", ""},
		{`{"MESSAGES":[{"content":"hi"}],"messages":[{"role":"user","content":"long"}],"Tools":[1]}`, `[{"role":"user","content":"long"}]`, "", ""},
		{`{"messages":[1],"messages":[2],"tools":[3],"tools":[4]}`, `[2]`, `[4]`, ""},
		{`{"prompt":"a","PROMPT":"b","prompt":"c"}`, "", "", `"c"`},
	} {
		r, err := RequestOf("m", []byte(tt.body))
		if err != nil {
			t.Fatalf("RequestOf(%s): %v", tt.body, err)
		}
		if string(r.Messages) != tt.messages || string(r.Tools) != tt.tools || string(r.Prompt) != tt.prompt {
			t.Errorf("RequestOf(%s) = messages %s, tools %s, prompt %s; want %s, %s, %s", tt.body, r.Messages, r.Tools, r.Prompt, tt.messages, tt.tools, tt.prompt)
		}
	}
}

func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{`{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`, `{"tokens":[]}`, `{"count":1,"tokens":[4294967296]}`, `null`, `{"tokens":[1.5]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		toks, err := ParseResponse(b)
		if err == nil && toks == nil {
			t.Fatal("no error and no tokens")
		}
	})
}
