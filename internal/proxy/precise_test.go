package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// tokenizer is a /tokenize service that answers the ids of a request's
// last message (one per 4 bytes, as the engine model's tokenizer), or
// fails while down.
type tokenizer struct {
	srv   *httptest.Server
	down  atomic.Bool
	calls atomic.Int64
}

func ids(text string) []uint32 {
	out := make([]uint32, len(text)/4)
	for i := range out {
		out[i] = uint32(text[4*i]) | uint32(text[4*i+1])<<8 | uint32(text[4*i+2])<<16 | uint32(text[4*i+3])<<24
	}
	return out
}

func newTokenizer(t *testing.T) *tokenizer {
	tk := &tokenizer{}
	tk.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk.calls.Add(1)
		if tk.down.Load() || r.URL.Path != "/tokenize" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var req tokenize.Request
		var msgs []struct{ Content string }
		if json.NewDecoder(r.Body).Decode(&req) != nil || json.Unmarshal(req.Messages, &msgs) != nil || len(msgs) == 0 {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		toks := ids(msgs[len(msgs)-1].Content)
		b, _ := json.Marshal(map[string]any{"count": len(toks), "max_model_len": 8192, "tokens": toks})
		_, _ = w.Write(b)
	}))
	t.Cleanup(tk.srv.Close)
	return tk
}

// TestPreciseRouting: with backend b2's events saying it holds a prompt's
// blocks, the request goes there and says match=precise, although the
// approximate index knows nothing; with the tokenizer down it is routed
// approximately, and the client sees no difference.
func TestPreciseRouting(t *testing.T) {
	tk := newTokenizer(t)
	r := newRig(t, "prefix", 3, func(c *config.Config) {
		for i := range c.Backends {
			// No stream is followed (no subscriber in this test): the
			// test plays b2's stream into the index itself.
			c.Backends[i].KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i)
		}
		c.KVEvents.Tokenizer = tk.srv.URL
		c.KVEvents.TokenizeCache = 0
	})
	// Three prompts, held by b2, b2 and b0 according to their events (an
	// order no blind rotation over three backends produces).
	prompts := []string{words("precise-a", 64*20), words("precise-b", 64*20), words("precise-c", 64*20)}
	holders := []string{"b2", "b2", "b0"}
	ix := r.srv.Scheduler().Precise()
	now := time.Now()
	next := uint64(100)
	for _, b := range r.srv.Fleet().Snapshot().All {
		ix.Reset(b.ID, true, now)
		var evs []kvevents.Event
		for k, p := range prompts {
			if holders[k] != b.Name {
				continue
			}
			toks := ids(p)
			hashes := make([]uint64, len(toks)/16)
			for i := range hashes {
				next++
				hashes[i] = next
			}
			evs = append(evs, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: toks[:16*len(hashes)], BlockSize: 16})
		}
		ix.Apply(b.ID, evs, now)
	}
	for k, p := range prompts {
		res := r.post("/v1/chat/completions", chat("shared", false, p))
		if res.status != 200 {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		if got, reason := res.header.Get("X-Kvroute-Backend"), res.header.Get("X-Kvroute-Reason"); got != holders[k] || !strings.Contains(reason, "prefix=20/20 match=precise") {
			t.Errorf("prompt %d routed to %s (%q), want %s with all 20 blocks matched precisely", k, got, reason, holders[k])
		}
	}

	tk.down.Store(true)
	res := r.post("/v1/chat/completions", chat("shared", false, words("other", 64*20)))
	if res.status != 200 {
		t.Fatalf("tokenizer down: status %d: %s", res.status, res.body)
	}
	if reason := res.header.Get("X-Kvroute-Reason"); !strings.Contains(reason, "match=approximate") {
		t.Errorf("tokenizer down: reason %q, want match=approximate", reason)
	}
	if n := counterValue(r.srv.precise.Failures(tokenize.FailError)); n != 1 {
		t.Errorf("%v tokenize failures counted, want 1", n)
	}

	// A short prompt is not tokenized at all.
	before := tk.calls.Load()
	r.post("/v1/chat/completions", chat("shared", false, "hi"))
	if tk.calls.Load() != before {
		t.Error("a prompt under min_prompt_tokens was tokenized")
	}
}

// TestPreciseCacheSalt: an engine's events for a request with a
// cache_salt carry the salt in the first block's extra keys, and the
// router salts the request's token keys alike: a salted request matches
// the blocks stored under its salt, and neither an unsalted request nor
// another salt matches them.
func TestPreciseCacheSalt(t *testing.T) {
	tk := newTokenizer(t)
	r := newRig(t, "prefix", 3, func(c *config.Config) {
		for i := range c.Backends {
			c.Backends[i].KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i)
		}
		c.KVEvents.Tokenizer = tk.srv.URL
		c.KVEvents.TokenizeCache = 0
	})
	prompt := words("salted", 64*20)
	toks := ids(prompt)
	ix := r.srv.Scheduler().Precise()
	now := time.Now()
	next := uint64(100)
	// b1 holds the prompt stored under cache_salt s1; b2 holds it unsalted.
	for _, b := range r.srv.Fleet().Snapshot().All {
		ix.Reset(b.ID, true, now)
		if b.Name != "b1" && b.Name != "b2" {
			continue
		}
		hashes := make([]uint64, len(toks)/16)
		for i := range hashes {
			next++
			hashes[i] = next
		}
		ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: toks[:16*len(hashes)], BlockSize: 16}
		if b.Name == "b1" {
			ev.ExtraKeys = make([][]byte, len(hashes))
			ev.ExtraKeys[0] = kvevents.CacheSaltKeys("s1")
		}
		ix.Apply(b.ID, []kvevents.Event{ev}, now)
	}
	for _, tt := range []struct{ salt, want, match string }{
		{"s1", "b1", "prefix=20/20 match=precise"},
		{"", "b2", "prefix=20/20 match=precise"},
		{"s2", "", "prefix=0/20"},
	} {
		body := `{"model":"shared","messages":[{"role":"user","content":"` + prompt + `"}]`
		if tt.salt != "" {
			body += `,"cache_salt":"` + tt.salt + `"`
		}
		res := r.post("/v1/chat/completions", body+"}")
		if res.status != 200 {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		got, reason := res.header.Get(headerBackend), res.header.Get(headerReason)
		if (tt.want != "" && got != tt.want) || !strings.Contains(reason, tt.match) {
			t.Errorf("cache_salt %q: routed to %s (%q), want %s with %q", tt.salt, got, reason, tt.want, tt.match)
		}
	}
}
