package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// A prompt evicted from the GPU by another is loaded back from the CPU
// tier: its blocks count as cached (vLLM's num_cached_tokens counts
// external hits), only its tail is computed, and its first token comes
// the load's time after its admission plus one step. Without a CPU tier
// the same prompt is computed again.
func TestCPUTierReload(t *testing.T) {
	for _, cpu := range []int{0, 16} {
		p := testPreset()
		p.KVBlocks = 4
		p.HostLoadPerToken = time.Microsecond
		p, _ = p.WithCPUTier(cpu)
		e := New(p, 0)
		e.SetKVEvents(true)
		var evs []kvevents.Event
		a := add(t, e, &Request{ID: 1, Prompt: prompt(4, 1, 2, 3), OutputTokens: 1}, 0)
		_, now := run(t, e, 0, &recorder{}, 10)
		evs = e.TakeKVEvents(evs)
		add(t, e, &Request{ID: 2, Prompt: prompt(4, 4, 5, 6), OutputTokens: 1}, now)
		_, now = run(t, e, now, &recorder{}, 10)
		evs = e.TakeKVEvents(evs)
		computed := e.Stats().PrefillTokensComputed
		c := add(t, e, &Request{ID: 3, Prompt: a.Prompt, OutputTokens: 1}, now)
		start := now
		run(t, e, now, &recorder{}, 10)
		evs = e.TakeKVEvents(evs)
		tail := e.Stats().PrefillTokensComputed - computed
		if cpu == 0 {
			if c.CachedTokens != 0 || tail != int64(c.PromptTokens) {
				t.Errorf("no CPU tier: cached %d, computed %d of %d", c.CachedTokens, tail, c.PromptTokens)
			}
			continue
		}
		if c.CachedTokens != 3*BlockSize || tail != int64(c.PromptTokens-3*BlockSize) {
			t.Errorf("CPU tier: cached %d, computed %d of %d; want 48 cached", c.CachedTokens, tail, c.PromptTokens)
		}
		// The load (48 tokens at 1 µs) then one step of the 4-token tail
		// after 48 tokens of context: 1 ms + 4x10 µs + 52x1 µs.
		if want := start + 48*time.Microsecond + time.Millisecond + 40*time.Microsecond + 52*time.Microsecond; c.FirstTokenAt != want {
			t.Errorf("first token at %v, want %v", c.FirstTokenAt, want)
		}
		if st := e.Stats(); st.ExternalHits != 3*BlockSize || st.PrefixHits != 0 {
			t.Errorf("stats: external hits %d, prefix hits %d", st.ExternalHits, st.PrefixHits)
		}
		// Events: A's blocks stored on the GPU then on the CPU, removed
		// from the GPU (B took their room), and stored on the GPU again
		// when loaded; nothing removed from the CPU (room for 16).
		var got []string
		for _, ev := range evs {
			s := ev.Kind.String() + "/" + ev.Medium
			if ev.Medium == mediumCPU && (ev.TokenIDs != nil || ev.HasParent || ev.BlockSize != 0) {
				t.Errorf("CPU event carries more than hashes: %+v", ev)
			}
			if len(got) == 0 || got[len(got)-1] != s {
				got = append(got, s)
			}
		}
		want := []string{"BlockStored/GPU", "BlockStored/CPU", "BlockRemoved/GPU", "BlockStored/GPU", "BlockStored/CPU", "BlockRemoved/GPU", "BlockStored/GPU"}
		// Taken once a request's run: within each, the GPU's events come
		// first, the CPU tier's after.
		if !slices.Equal(got, want) {
			t.Errorf("events %v, want %v", got, want)
		}
	}
}

// The CPU tier keeps its capacity's most recently used blocks.
func TestCPUTierLRU(t *testing.T) {
	c := newCPUTier(2)
	c.store(1)
	c.store(2)
	c.touch(1)
	if ev, ok, added := c.store(3); !ok || ev != 2 || !added {
		t.Fatalf("store 3 evicted %d (%v), want 2", ev, ok)
	}
	if !c.has(1) || c.has(2) || !c.has(3) {
		t.Errorf("holds 1 %v, 2 %v, 3 %v; want 1 and 3", c.has(1), c.has(2), c.has(3))
	}
	c.reset()
	if c.has(1) || c.has(3) {
		t.Errorf("reset kept blocks")
	}
}
