package engine

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

func TestTokenIDs(t *testing.T) {
	tests := []struct {
		text string
		want []uint32
	}{
		{"", nil},
		{"a", []uint32{'a'}},
		{"abcd", []uint32{'a' | 'b'<<8 | 'c'<<16 | 'd'<<24}},
		{"abcdef", []uint32{'a' | 'b'<<8 | 'c'<<16 | 'd'<<24, 'e' | 'f'<<8}},
		{"\xff\xff\xff\xff\x01", []uint32{0xffffffff, 1}},
	}
	for _, tt := range tests {
		got := TokenIDs(nil, tt.text)
		if !slices.Equal(got, tt.want) {
			t.Errorf("TokenIDs(%q) = %#x, want %#x", tt.text, got, tt.want)
		}
		if len(got) != Tokens(tt.text) {
			t.Errorf("TokenIDs(%q) has %d ids, Tokens says %d", tt.text, len(got), Tokens(tt.text))
		}
	}
	// A prefix of whole tokens gives a prefix of the ids.
	s := "the quick brown fox jumps"
	if full := TokenIDs(nil, s); !slices.Equal(TokenIDs(nil, s[:12]), full[:3]) {
		t.Errorf("ids of a 12-byte prefix are not a prefix of the text's ids")
	}
}

// cacheModel replays KV events into the set of hashes they say the engine
// holds, checking each against the engine's own hashing.
type cacheModel struct {
	t    *testing.T
	held map[uint64]bool
}

func (m *cacheModel) apply(evs []kvevents.Event) {
	m.t.Helper()
	for _, ev := range evs {
		switch ev.Kind {
		case kvevents.BlockStored:
			if ev.BlockSize != BlockSize || ev.Medium != "GPU" {
				m.t.Fatalf("BlockStored block size %d medium %q", ev.BlockSize, ev.Medium)
			}
			if len(ev.TokenIDs) != len(ev.BlockHashes)*BlockSize {
				m.t.Fatalf("BlockStored of %d blocks carries %d token ids", len(ev.BlockHashes), len(ev.TokenIDs))
			}
			for _, h := range ev.BlockHashes {
				if m.held[h] {
					m.t.Fatalf("BlockStored %x already held", h)
				}
				m.held[h] = true
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if !m.held[h] {
					m.t.Fatalf("BlockRemoved %x not held", h)
				}
				delete(m.held, h)
			}
		case kvevents.AllBlocksCleared:
			clear(m.held)
		default:
			m.t.Fatalf("event of kind %v", ev.Kind)
		}
	}
}

// check compares the model with the hashes findable in the engine's cache.
func (m *cacheModel) check(e *Engine) {
	m.t.Helper()
	n := 0
	for b, ok := range e.kv.hashed {
		if !ok {
			continue
		}
		n++
		if !m.held[e.kv.hash[b]] {
			m.t.Fatalf("engine holds %x, events never stored it", e.kv.hash[b])
		}
	}
	if n != len(m.held) {
		m.t.Fatalf("events say %d blocks are held, the engine holds %d", len(m.held), n)
	}
}

func TestKVEventsStoredChain(t *testing.T) {
	e := New(testPreset(), 0)
	e.SetKVEvents(true)
	p := prompt(3, 1, 2, 3, 4, 5) // 5 full blocks and 3 tail tokens, prefilled in two chunks
	add(t, e, &Request{ID: 1, Prompt: p, OutputTokens: 2}, 0)
	var evs []kvevents.Event
	var now time.Duration
	for !e.Idle() {
		now += e.Step(now, &recorder{})
		evs = e.TakeKVEvents(evs)
	}
	var hashes []uint64
	var ids []uint32
	for i, ev := range evs {
		if ev.Kind != kvevents.BlockStored {
			t.Fatalf("event %d is %v", i, ev.Kind)
		}
		if want := len(hashes) > 0; ev.HasParent != want || (want && ev.Parent != hashes[len(hashes)-1]) {
			t.Fatalf("event %d: parent %x (%v), want the previous block %v", i, ev.Parent, ev.HasParent, hashes)
		}
		hashes = append(hashes, ev.BlockHashes...)
		ids = append(ids, ev.TokenIDs...)
	}
	if len(evs) != 2 {
		t.Errorf("%d BlockStored events, want one per prefill chunk (2)", len(evs))
	}
	if want := prefix.Hash(nil, p, BlockSize*BytesPerToken); !slices.Equal(hashes, want) {
		t.Errorf("stored hashes %x, want the prompt's %x", hashes, want)
	}
	all := TokenIDs(nil, p)
	if !slices.Equal(ids, all[:5*BlockSize]) {
		t.Errorf("stored token ids are not the prompt's first 5 blocks of ids")
	}
	// The same prompt again finds every block: nothing new is stored.
	add(t, e, &Request{ID: 2, Prompt: p, OutputTokens: 1}, now)
	run(t, e, now, &recorder{}, 10)
	if got := e.TakeKVEvents(nil); len(got) != 0 {
		t.Errorf("a cached prompt stored again: %+v", got)
	}
}

// TestKVEventsTrackCache runs a random workload through a small cache with
// evictions, preemptions, aborts and resets, and checks after every step
// that the events, replayed, say exactly which blocks the cache holds.
func TestKVEventsTrackCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	e := New(testPreset(), 40)
	e.SetKVEvents(true)
	m := &cacheModel{t: t, held: map[uint64]bool{}}
	var now time.Duration
	var live []*Request
	var evs []kvevents.Event
	kinds := map[kvevents.Kind]int{}
	for step := 0; step < 3000; step++ {
		if len(live) < 6 && rng.IntN(3) == 0 {
			ids := make([]int, 1+rng.IntN(8))
			for i := range ids {
				ids[i] = rng.IntN(12) + 20*i
			}
			r := &Request{ID: uint64(step), Prompt: prompt(rng.IntN(20), ids...), OutputTokens: 1 + rng.IntN(40)}
			add(t, e, r, now)
			live = append(live, r)
		}
		switch rng.IntN(200) {
		case 0:
			e.ResetPrefixCache()
		case 1:
			if len(live) > 0 {
				e.Abort(live[0])
			}
		}
		now += e.Step(now, &recorder{})
		live = slices.DeleteFunc(live, func(r *Request) bool { return r.state == stateDone })
		evs = e.TakeKVEvents(evs[:0])
		for _, ev := range evs {
			kinds[ev.Kind]++
		}
		m.apply(evs)
		m.check(e)
	}
	for _, k := range []kvevents.Kind{kvevents.BlockStored, kvevents.BlockRemoved, kvevents.AllBlocksCleared} {
		if kinds[k] == 0 {
			t.Errorf("no %v event in the run: %v", k, kinds)
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Errorf("the run never preempted")
	}
}

func TestKVEventsOff(t *testing.T) {
	e := New(testPreset(), 8)
	for i := range 6 {
		add(t, e, &Request{ID: uint64(i), Prompt: prompt(1, i, i+1, i+2), OutputTokens: 1}, 0)
		run(t, e, 0, &recorder{}, 20)
	}
	e.ResetPrefixCache()
	if got := e.TakeKVEvents(nil); len(got) != 0 {
		t.Errorf("events recorded while off: %d", len(got))
	}
	// Turning events off drops what was recorded.
	e.SetKVEvents(true)
	add(t, e, &Request{ID: 9, Prompt: strings.Repeat("x", 200), OutputTokens: 1}, 0)
	run(t, e, 0, &recorder{}, 20)
	e.SetKVEvents(false)
	if got := e.TakeKVEvents(nil); len(got) != 0 {
		t.Errorf("SetKVEvents(false) kept %d events", len(got))
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := New(testPreset(), 0)
	e.SetKVEvents(true)
	p := prompt(1, 1, 2)
	add(t, e, &Request{ID: 1, Prompt: p, OutputTokens: 1}, 0)
	_, now := run(t, e, 0, &recorder{}, 10)
	e.ResetPrefixCache()
	evs := e.TakeKVEvents(nil)
	if last := evs[len(evs)-1]; last.Kind != kvevents.AllBlocksCleared {
		t.Fatalf("last event %v, want AllBlocksCleared", last.Kind)
	}
	r := add(t, e, &Request{ID: 2, Prompt: p, OutputTokens: 1}, now)
	run(t, e, now, &recorder{}, 10)
	if r.CachedTokens != 0 {
		t.Errorf("after a reset the prompt found %d cached tokens", r.CachedTokens)
	}
}

// A salted request's blocks are its own (vLLM's cache_salt), and its first
// BlockStored names the salt in its extra keys, one entry a block, so that
// a router reading the events keys them under the same salt.
func TestKVEventsCacheSalt(t *testing.T) {
	e := New(testPreset(), 0)
	e.SetKVEvents(true)
	p := prompt(3, 1, 2, 3)
	add(t, e, &Request{ID: 1, Prompt: p, OutputTokens: 1, CacheSalt: "tenant-a"}, 0)
	_, now := run(t, e, 0, &recorder{}, 10)
	evs := e.TakeKVEvents(nil)
	if len(evs) == 0 || evs[0].HasParent || len(evs[0].ExtraKeys) != len(evs[0].BlockHashes) {
		t.Fatalf("first event %+v: want a parentless BlockStored with one extra key a block", evs)
	}
	if got := kvevents.CacheSalt(evs[0].ExtraKeys[0], ""); got != "tenant-a" {
		t.Errorf("the first block names salt %q, want tenant-a", got)
	}
	if want := prefix.HashSalted(nil, p, BlockSize*BytesPerToken, "tenant-a"); evs[0].BlockHashes[0] != want[0] {
		t.Errorf("the first block's hash is not the salted prompt's")
	}
	// The same prompt unsalted finds nothing cached and stores its own.
	add(t, e, &Request{ID: 2, Prompt: p, OutputTokens: 1}, now)
	run(t, e, now, &recorder{}, 10)
	if got := e.TakeKVEvents(nil); len(got) == 0 {
		t.Error("an unsalted request reused a salted request's blocks")
	}
}
