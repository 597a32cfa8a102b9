package epp_test

import (
	"encoding/binary"
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

// tokenIDs are the ids of text as the fake tokenizer gives them: one per
// 4 bytes.
func tokenIDs(text string) []uint32 {
	out := make([]uint32, 0, len(text)/4)
	for b := []byte(text); len(b) >= 4; b = b[4:] {
		out = append(out, binary.LittleEndian.Uint32(b))
	}
	return out
}

// newTokenizer is a /tokenize service answering the ids of a request's
// last message; calls counts its requests.
func newTokenizer(t *testing.T, calls *atomic.Int64) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req tokenize.Request
		var msgs []struct{ Content string }
		if r.URL.Path != "/tokenize" || json.NewDecoder(r.Body).Decode(&req) != nil || json.Unmarshal(req.Messages, &msgs) != nil || len(msgs) == 0 {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		toks := tokenIDs(msgs[len(msgs)-1].Content)
		b, _ := json.Marshal(map[string]any{"count": len(toks), "max_model_len": 8192, "tokens": toks})
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// preciseRig is a rig whose engines have KV event streams, their
// tokenizer the fake one, with holders[k]'s events saying it holds
// prompts[k]'s 20 blocks (played into the index by the test: no stream
// is followed).
func preciseRig(t *testing.T, calls *atomic.Int64, prompts, holders []string) *rig {
	tk := newTokenizer(t, calls)
	rg := newRig(t, 3, func(c *config.Config) {
		c.Policy = "prefix"
		for i := range c.Backends {
			c.Backends[i].KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i)
		}
		c.KVEvents.Tokenizer = tk
	})
	ix := rg.srv.Scheduler().Precise()
	now := time.Now()
	byName := map[string]int{}
	for _, b := range rg.srv.Fleet().Snapshot().All {
		ix.Reset(b.ID, true, now)
		byName[b.Name] = b.ID
	}
	for k, p := range prompts {
		toks := tokenIDs(p)
		ev := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, TokenIDs: toks[:len(toks)/16*16]}
		for i := range len(toks) / 16 {
			ev.BlockHashes = append(ev.BlockHashes, uint64(1000*(k+1)+i))
		}
		ix.Apply(byName[holders[k]], []kvevents.Event{ev}, now)
	}
	return rg
}

// TestPrecise: with the engines' KV events saying where each prompt's
// blocks are, the picker routes on them as the HTTP front does (the same
// /tokenize call and keys): both send each prompt to its holder, in an
// order the approximate index, knowing nothing, does not produce; a
// prompt the engine accepted keeps its token ids, so that its next pick
// asks the tokenizer nothing.
func TestPrecise(t *testing.T) {
	prompts := []string{promptOf("precise-a"), promptOf("precise-b"), promptOf("precise-c")}
	holders := []string{"e2", "e2", "e0"}

	var httpCalls atomic.Int64
	rh := preciseRig(t, &httpCalls, prompts, holders)
	var viaHTTP []string
	for _, p := range prompts {
		resp, err := http.Post("http://"+rh.srv.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chat("", p, false)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		viaHTTP = append(viaHTTP, resp.Header.Get("X-Kvroute-Backend"))
	}

	var calls atomic.Int64
	rg := preciseRig(t, &calls, prompts, holders)
	pick := func(p string) string { return rg.pick(t, chat("", p, false), nil).name }
	for k, p := range prompts {
		got := pick(p)
		t.Logf("prompt %d: HTTP front %s, picker %s, holder %s", k, viaHTTP[k], got, holders[k])
		if got != holders[k] || viaHTTP[k] != holders[k] {
			t.Errorf("prompt %d: the HTTP front routed it to %s, the picker to %s; its blocks are on %s", k, viaHTTP[k], got, holders[k])
		}
	}
	if n := calls.Load(); n != int64(len(prompts)) {
		t.Fatalf("the picker asked the tokenizer %d times for %d prompts", n, len(prompts))
	}
	rg.waitIdle(t)
	if got := pick(prompts[0]); got != holders[0] {
		t.Errorf("again: prompt 0 routed to %s, want %s", got, holders[0])
	}
	if n := calls.Load(); n != int64(len(prompts)) {
		t.Errorf("a prompt the engine accepted was tokenized again (%d calls)", n)
	}
}

// promptOf is a prompt of exactly 20 blocks of 16 tokens (1280 bytes)
// whose first block is tag's own.
func promptOf(tag string) string {
	return (tag + " " + strings.Repeat("the quick brown fox jumps over the lazy dog ", 40))[:1280]
}

// pick sends body through the picker with hs, forwards it to the decision
// and settles it (the test as the gateway), and returns its engine.
func (rg *rig) pick(t *testing.T, body string, hs map[string]string) *engine {
	t.Helper()
	st := rg.open(t, t.Context())
	envoy{raw: true, pseudo: true, chunk: 4096, headers: hs}.sendRequest(t, st, body)
	d := readDecision(t, st)
	e := rg.byAddr[d.dest]
	if e == nil {
		t.Fatalf("destination %q", d.dest)
	}
	forward(t, st, d.dest, "", body, true)
	closeStream(t, st)
	return e
}
