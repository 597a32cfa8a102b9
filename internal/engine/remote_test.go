package engine

import (
	"cmp"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
)

// remotePreset is testPreset with round transfer figures: 5 ms a transfer
// plus 20 µs a token.
func remotePreset() Preset {
	p := testPreset()
	p.KVTransferLatency = 5 * time.Millisecond
	p.KVTransferPerToken = 20 * time.Microsecond
	return p
}

// A RemotePrefill request waits for its transfer, holding its prompt's
// blocks, then computes only its last prompt token: its first token comes
// one one-token step after the transfer, which moved the prompt less what
// the engine had cached itself.
func TestRemotePrefillTiming(t *testing.T) {
	tests := []struct {
		name   string
		warm   string // run to completion first: the engine's own cache
		prompt string
		cached int // prompt tokens the engine holds itself
	}{
		{"cold", "", prompt(10, 1, 2, 3), 0},
		{"own prefix cached", prompt(0, 1, 2), prompt(10, 1, 2, 3), 2 * BlockSize},
		// A hit never covers the last token: of 3 cached blocks of a
		// 48-token prompt, 2 count and the third is transferred.
		{"whole prompt cached", prompt(0, 1, 2, 3), prompt(0, 1, 2, 3), 2 * BlockSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := remotePreset()
			e := New(p, 0)
			var s recorder
			var now time.Duration
			if tt.warm != "" {
				add(t, e, &Request{ID: 9, Prompt: tt.warm, OutputTokens: 1}, 0)
				_, now = run(t, e, 0, &s, 10)
			}
			computedBefore := e.Stats().PrefillTokensComputed
			r := add(t, e, &Request{ID: 1, Prompt: tt.prompt, OutputTokens: 3, RemotePrefill: true}, now)
			if d := e.Step(now, &s); d != 0 {
				t.Fatalf("admitting step took %v: want 0, nothing to compute", d)
			}
			n := Tokens(tt.prompt)
			if r.TransferredTokens != n-tt.cached {
				t.Errorf("TransferredTokens = %d, want %d (prompt %d less %d cached)", r.TransferredTokens, n-tt.cached, n, tt.cached)
			}
			st := e.Stats()
			if st.Waiting != 1 || st.RemoteWaiting != 1 || st.Running != 0 || e.Idle() {
				t.Errorf("during the transfer: %+v, idle %v: want one waiting for remote KV", st, e.Idle())
			}
			if used := e.kv.used(); used != blocksFor(n) {
				t.Errorf("during the transfer %d blocks used, want the prompt's %d", used, blocksFor(n))
			}
			ready := now + p.KVTransferLatency + time.Duration(n-tt.cached)*p.KVTransferPerToken
			if w, ok := e.Wake(); !ok || w != ready || r.KVReadyAt != ready {
				t.Fatalf("Wake = %v, %v; KVReadyAt %v: want %v", w, ok, r.KVReadyAt, ready)
			}
			if d := e.Step(ready-1, &s); d != 0 || r.Generated != 0 {
				t.Fatalf("a step before the transfer ends took %v, generated %d", d, r.Generated)
			}
			// The step at ready computes one token over the whole prompt.
			want := p.StepOverhead + p.PerPrefillToken + time.Duration(n)*p.PerContextToken
			if d := e.Step(ready, &s); d != want || r.FirstTokenAt != ready+want {
				t.Fatalf("first step after the transfer took %v (first token at %v), want %v at %v", d, r.FirstTokenAt, want, ready+want)
			}
			if got := e.Stats().PrefillTokensComputed - computedBefore; got != 1 {
				t.Errorf("%d prefill tokens computed, want 1 (the last prompt token)", got)
			}
			if r.CachedTokens != n-1 || r.ScheduledAt != ready {
				t.Errorf("CachedTokens %d, ScheduledAt %v: want %d (vLLM's num_cached_tokens) and %v", r.CachedTokens, r.ScheduledAt, n-1, ready)
			}
			run(t, e, ready+want, &s, 10)
			if r.Generated != 3 || e.Stats().KVTransferTokens != int64(n-tt.cached) {
				t.Errorf("generated %d, KVTransferTokens %d", r.Generated, e.Stats().KVTransferTokens)
			}
			if _, ok := e.Wake(); ok {
				t.Errorf("Wake reports a pending transfer on an idle engine")
			}
		})
	}
}

// The blocks a decode engine received are in its prefix cache: stored in
// its KV events, hit by the next request with the same prefix.
func TestRemotePrefillRegistersBlocks(t *testing.T) {
	e := New(remotePreset(), 0)
	e.SetKVEvents(true)
	m := &cacheModel{t: t, held: map[uint64]bool{}}
	var s recorder
	pr := prompt(10, 1, 2, 3)
	add(t, e, &Request{ID: 1, Prompt: pr, OutputTokens: 2, RemotePrefill: true}, 0)
	e.Step(0, &s)
	if evs := e.TakeKVEvents(nil); len(evs) != 0 {
		t.Fatalf("events %+v before the transfer ended: want none", evs)
	}
	w, _ := e.Wake()
	_, now := run(t, e, w, &s, 10)
	m.apply(e.TakeKVEvents(nil))
	m.check(e)
	for _, h := range prefix.Hash(nil, pr, BlockSize*BytesPerToken) {
		if !m.held[h] {
			t.Errorf("received block %x never stored", h)
		}
	}
	r := add(t, e, &Request{ID: 2, Prompt: pr, OutputTokens: 1}, now)
	run(t, e, now, &s, 10)
	if r.CachedTokens != 3*BlockSize {
		t.Errorf("a later request hit %d tokens, want the 3 received blocks", r.CachedTokens)
	}
}

// A prefill engine keeps a HoldKV request's blocks after it finishes, until
// the driver releases them or KVHoldTimeout passes.
func TestHoldKV(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration // Request.HoldTimeout
		release func(e *Engine, r *Request, until time.Duration)
	}{
		{"released", 0, func(e *Engine, r *Request, _ time.Duration) { e.ReleaseKV(r) }},
		{"timed out", 0, func(e *Engine, _ *Request, until time.Duration) { e.Step(until, &recorder{}) }},
		{"own timeout", 30 * time.Millisecond, func(e *Engine, _ *Request, until time.Duration) { e.Step(until, &recorder{}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testPreset(), 0)
			var s recorder
			pr := prompt(10, 1, 2, 3)
			r := add(t, e, &Request{ID: 1, Prompt: pr, OutputTokens: 1, HoldKV: true, HoldTimeout: tt.timeout}, 0)
			run(t, e, 0, &s, 10)
			if len(s.finished) != 1 || !e.Idle() {
				t.Fatalf("finished %v, idle %v", s.finished, e.Idle())
			}
			if used := e.kv.used(); used != blocksFor(Tokens(pr)) || e.Stats().HeldRequests != 1 {
				t.Fatalf("%d blocks used, %d held after the finish: want the prompt's %d", used, e.Stats().HeldRequests, blocksFor(Tokens(pr)))
			}
			until := r.FinishedAt + cmp.Or(tt.timeout, KVHoldTimeout)
			if w, ok := e.Wake(); !ok || w != until {
				t.Errorf("Wake = %v, %v: want the hold's timeout %v", w, ok, until)
			}
			if ids := r.BlockIDs(nil); len(ids) != blocksFor(Tokens(pr)) {
				t.Errorf("BlockIDs %v: want the prompt's %d blocks", ids, blocksFor(Tokens(pr)))
			}
			e.Step(until-1, &s)
			if e.kv.used() == 0 {
				t.Fatalf("hold released before its timeout")
			}
			tt.release(e, r, until)
			if ids := r.BlockIDs(nil); len(ids) != 0 {
				t.Errorf("BlockIDs %v after the release", ids)
			}
			checkInvariants(t, e)
			if used := e.kv.used(); used != 0 || e.Stats().HeldRequests != 0 {
				t.Errorf("%d blocks used, %d held after the release", used, e.Stats().HeldRequests)
			}
			if _, ok := e.Wake(); ok {
				t.Errorf("Wake pending after the release")
			}
			// The blocks stay cached.
			r2 := add(t, e, &Request{ID: 2, Prompt: pr, OutputTokens: 1}, r.FinishedAt)
			run(t, e, r.FinishedAt, &s, 10)
			if r2.CachedTokens != 3*BlockSize {
				t.Errorf("next request hit %d tokens, want 48", r2.CachedTokens)
			}
		})
	}
}

// A request aborted while it waits for its KV frees its blocks at once.
func TestRemotePrefillAbort(t *testing.T) {
	e := New(remotePreset(), 0)
	r := add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2, 3), OutputTokens: 2, RemotePrefill: true}, 0)
	e.Step(0, &recorder{})
	e.Abort(r)
	checkInvariants(t, e)
	if e.kv.used() != 0 || !e.Idle() || e.Stats().Waiting != 0 {
		t.Errorf("after the abort: %d blocks used, %+v", e.kv.used(), e.Stats())
	}
	if _, ok := e.Wake(); ok {
		t.Errorf("Wake pending after the abort")
	}
}
