package emulator

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

func tokenizeOK(t *testing.T, url string, body map[string]any) tokenizeResponse {
	t.Helper()
	resp := post(t, t.Context(), url+"/tokenize", body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tokenize %v: status %d: %+v", body, resp.StatusCode, decodeError(t, resp))
	}
	var tr tokenizeResponse
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestTokenize(t *testing.T) {
	s, hs := newTestServer(t, 50)
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}
	chatBody, _ := json.Marshal(map[string]any{"model": s.Model(), "messages": msgs})
	chat, perr := request.Parse(request.Chat, chatBody, request.Options{})
	if perr != nil {
		t.Fatal(perr)
	}
	for _, tt := range []struct {
		name   string
		body   map[string]any
		prompt string
	}{
		{"prompt", map[string]any{"model": s.Model(), "prompt": "hello, world"}, "hello, world"},
		{"prompt without model", map[string]any{"prompt": "abc"}, "abc"},
		{"messages", map[string]any{"model": s.Model(), "messages": msgs, "add_generation_prompt": true}, chat.Prompt},
		// Keys are vLLM's, exactly: MESSAGES is an unknown field.
		{"MESSAGES are not messages", map[string]any{"prompt": "abc", "MESSAGES": msgs, "RETURN_TOKEN_STRS": true}, "abc"},
		{"null messages are none", map[string]any{"prompt": "abc", "messages": nil}, "abc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr := tokenizeOK(t, hs.URL, tt.body)
			want := engine.TokenIDs(nil, tt.prompt)
			if !slices.Equal(tr.Tokens, want) || tr.Count != len(want) || tr.MaxModelLen != s.Preset().MaxModelLen || tr.TokenStrs != nil {
				t.Errorf("got %+v, want tokens %v of %q", tr, want, tt.prompt)
			}
		})
	}
	tr := tokenizeOK(t, hs.URL, map[string]any{"prompt": "abcdefghij", "return_token_strs": true})
	if !slices.Equal(tr.TokenStrs, []string{"abcd", "efgh", "ij"}) {
		t.Errorf("token_strs %q", tr.TokenStrs)
	}
	for _, tt := range []struct {
		name   string
		body   any
		status int
		typ    string
	}{
		{"unknown model", map[string]any{"model": "nope", "prompt": "x"}, 404, "NotFoundError"},
		{"no prompt", map[string]any{"model": s.Model()}, 400, "BadRequestError"},
		{"empty messages", map[string]any{"messages": []any{}}, 400, "BadRequestError"},
		{"not an object", []int{1}, 400, "BadRequestError"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), hs.URL+"/tokenize", tt.body)
			defer resp.Body.Close()
			e := decodeError(t, resp)
			if resp.StatusCode != tt.status || e.Type != tt.typ || e.Code != float64(tt.status) {
				t.Errorf("status %d error %+v, want %d %s", resp.StatusCode, e, tt.status, tt.typ)
			}
		})
	}
}

// eventLog is a kvevents.Handler gathering events.
type eventLog struct {
	mu     sync.Mutex
	events []kvevents.Event
	resets []kvevents.ResetReason
}

func (c *eventLog) Batch(_ uint64, b kvevents.Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, b.Events...)
}

func (c *eventLog) Reset(r kvevents.ResetReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resets = append(c.resets, r)
}

func (c *eventLog) Count(kvevents.Counter) {}

func (c *eventLog) snapshot() []kvevents.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// newPublishingServer is newTestServer with KV events published on a
// loopback port, and a subscriber that has seen the stream's first batch.
func newPublishingServer(t *testing.T, enc kvevents.Encoding) (*Server, string, *eventLog) {
	t.Helper()
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	s, srv := serve(t, Config{Preset: p, TimeScale: 50, KVEvents: &kvevents.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv@test@" + p.Model, Encoding: enc}})
	hs := srv.URL
	c := &eventLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = kvevents.Subscribe(ctx, kvevents.SubscriberConfig{Endpoint: "tcp://" + s.KVEventsAddr().String(),
			ReplayEndpoint: "tcp://" + s.KVEventsReplayAddr().String(), Topic: "kv@test@"}, c)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// A reset publishes an AllBlocksCleared at once: probe with it until
	// the subscription has reached the publisher.
	deadline := time.Now().Add(5 * time.Second)
	for len(c.snapshot()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no event reached the subscriber")
		}
		resp := post(t, t.Context(), hs+"/reset_prefix_cache", map[string]any{})
		resp.Body.Close()
		time.Sleep(10 * time.Millisecond)
	}
	return s, hs, c
}

func TestKVEventsPublished(t *testing.T) {
	for _, enc := range []kvevents.Encoding{kvevents.Current, kvevents.Legacy} {
		t.Run(enc.String(), func(t *testing.T) {
			s, url, c := newPublishingServer(t, enc)
			// 12 full blocks of a chat prompt.
			content := strings.Repeat("0123456789abcdef", 50)
			req := map[string]any{"model": s.Model(), "max_tokens": 2, "messages": []map[string]any{{"role": "user", "content": content}}}
			resp := post(t, t.Context(), url+"/v1/chat/completions", req)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			delete(req, "max_tokens")
			tr := tokenizeOK(t, url, req)
			full := len(tr.Tokens) / engine.BlockSize
			var hashes []uint64
			var ids []uint32
			deadline := time.Now().Add(5 * time.Second)
			for len(hashes) < full && time.Now().Before(deadline) {
				hashes, ids = hashes[:0], ids[:0]
				for _, ev := range c.snapshot() {
					if ev.Kind == kvevents.BlockStored {
						hashes = append(hashes, ev.BlockHashes...)
						ids = append(ids, ev.TokenIDs...)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			body, _ := json.Marshal(req)
			v, _ := request.Parse(request.Chat, body, request.Options{})
			if want := prefix.Hash(nil, v.Prompt, engine.BlockSize*engine.BytesPerToken); !slices.Equal(hashes, want) {
				t.Errorf("stored %d hashes, want the prompt's %d", len(hashes), len(want))
			}
			if !slices.Equal(ids, tr.Tokens[:full*engine.BlockSize]) {
				t.Errorf("stored token ids are not a prefix of /tokenize's")
			}
			// A reset reaches the subscriber as AllBlocksCleared.
			n := len(c.snapshot())
			resp = post(t, t.Context(), url+"/reset_prefix_cache", map[string]any{})
			resp.Body.Close()
			deadline = time.Now().Add(5 * time.Second)
			for {
				evs := c.snapshot()
				if len(evs) > n && evs[len(evs)-1].Kind == kvevents.AllBlocksCleared {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no AllBlocksCleared after the reset: %d events", len(evs))
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
