package engine

import (
	"slices"
	"testing"
	"time"
)

func loraPreset(t *testing.T, maxLoras int) Preset {
	t.Helper()
	p, err := testPreset().WithLoRA(maxLoras, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// An adapter's prompt blocks are its own: the same prompt under another
// adapter, or the base model, finds nothing cached; under the same adapter
// it finds its blocks.
func TestLoRAKVSeparation(t *testing.T) {
	e := New(loraPreset(t, 4), 0)
	p := prompt(3, 1, 2, 3, 4)
	now := time.Duration(0)
	for i, c := range []struct {
		adapter string
		cached  bool
	}{{"a", false}, {"a", true}, {"b", false}, {"", false}, {"", true}, {"b", true}} {
		r := &Request{ID: uint64(i + 1), Prompt: p, OutputTokens: 1, Adapter: c.adapter}
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
		_, now = run(t, e, now, &recorder{}, 100)
		if got := r.CachedTokens > 0; got != c.cached {
			t.Errorf("request %d under %q: cached %d tokens, want cached=%v", i+1, c.adapter, r.CachedTokens, c.cached)
		}
	}
}

// A step that loads an adapter takes LoRALoad longer; a resident adapter
// loads nothing; when every slot is taken the least recently used idle
// adapter is evicted.
func TestLoRALoadAndLRU(t *testing.T) {
	pr := loraPreset(t, 2)
	e := New(pr, 0)
	base := New(testPreset(), 0)
	now := time.Duration(0)
	wantLoads := int64(0)
	for i, c := range []struct {
		adapter string
		load    bool
	}{{"a", true}, {"b", true}, {"a", false}, {"c", true}, {"a", false}, {"b", true}} {
		p := prompt(i+1, 100+i)
		r := &Request{ID: uint64(i + 1), Prompt: p, OutputTokens: 1, Adapter: c.adapter}
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
		// The same work on an engine without adapters, for the step time.
		rb := &Request{ID: uint64(i + 1), Prompt: p, OutputTokens: 1}
		if err := base.Add(rb, now); err != nil {
			t.Fatal(err)
		}
		steps, _ := run(t, e, now, &recorder{}, 10)
		baseSteps, _ := run(t, base, now, &recorder{}, 10)
		extra := steps[0] - baseSteps[0]
		if c.load {
			wantLoads++
			if extra != pr.LoRALoad {
				t.Errorf("request %d (%s): step %v, %v without adapters; want %v more for the load", i+1, c.adapter, steps[0], baseSteps[0], pr.LoRALoad)
			}
		} else if extra != 0 {
			t.Errorf("request %d (%s): resident adapter, but the step took %v more", i+1, c.adapter, extra)
		}
		if got := e.Stats().LoRALoads; got != wantLoads {
			t.Errorf("after request %d: %d loads, want %d", i+1, got, wantLoads)
		}
		now += time.Second
	}
	if got, want := e.Resident(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("resident %v, want %v (c evicted as the least recently used)", got, want)
	}
}

// At most MaxLoras adapters run at once: a request for a third adapter
// waits while two others run, and requests behind it (the base model, a
// running adapter) are admitted past it, as vLLM skips it.
func TestLoRAMaxInBatch(t *testing.T) {
	e := New(loraPreset(t, 2), 0)
	add := func(id uint64, adapter string, out int) *Request {
		r := &Request{ID: id, Prompt: prompt(2, int(id)), OutputTokens: out, Adapter: adapter}
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := add(1, "a", 10)
	b := add(2, "b", 10)
	c := add(3, "c", 1)
	base := add(4, "", 1)
	a2 := add(5, "a", 1)
	info := e.LoRA()
	if !slices.Equal(info.Waiting, []string{"a", "b", "c"}) || len(info.Running) != 0 || info.MaxLoras != 2 {
		t.Errorf("before a step: %+v", info)
	}
	e.Step(0, &recorder{})
	for _, r := range []*Request{a, b, base, a2} {
		if r.ScheduledAt != 0 || r.state != stateRunning && r.state != stateDone {
			t.Errorf("request %d (%q) not admitted in the first step", r.ID, r.Adapter)
		}
	}
	if c.state != stateWaiting {
		t.Errorf("request for a third adapter admitted beside two others")
	}
	info = e.LoRA()
	if !slices.Equal(info.Running, []string{"a", "b"}) || !slices.Equal(info.Waiting, []string{"c"}) {
		t.Errorf("after a step: %+v", info)
	}
	_, end := run(t, e, time.Millisecond, &recorder{}, 100)
	if c.FirstTokenAt < a.FinishedAt && c.FirstTokenAt < b.FinishedAt {
		t.Errorf("c's first token at %v, before a (%v) or b (%v) left the batch", c.FirstTokenAt, a.FinishedAt, b.FinishedAt)
	}
	if !e.Idle() || end <= 0 {
		t.Errorf("engine not idle")
	}
}

func TestLoRARefusedWithoutLoRA(t *testing.T) {
	e := New(testPreset(), 0)
	if err := e.Add(&Request{ID: 1, Prompt: prompt(2, 1), OutputTokens: 1, Adapter: "a"}, 0); err == nil {
		t.Error("an adapter's request accepted by an engine without LoRA")
	}
	if _, err := testPreset().WithLoRA(-1, 0); err == nil {
		t.Error("max-loras -1 accepted")
	}
}
