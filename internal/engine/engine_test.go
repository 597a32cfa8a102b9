package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/request"
)

// testPreset has round coefficients so that step times can be worked out by
// hand: 1 ms per step, 10 µs per prefill token, 100 µs per decoding
// sequence, 1 µs per context token.
func testPreset() Preset {
	return Preset{
		Name: "test", Model: "test-model",
		KVBlocks: 100, MaxNumSeqs: 8, MaxBatchedTokens: 64, MaxModelLen: 1024,
		StepOverhead:    time.Millisecond,
		PerPrefillToken: 10 * time.Microsecond,
		PerDecodeSeq:    100 * time.Microsecond,
		PerContextToken: time.Microsecond,
	}
}

// block returns the text of one 16-token block (64 bytes) named by id:
// prompts built from the same ids share a token prefix.
func block(id int) string {
	s := fmt.Sprintf("<block %08d>", id)
	return strings.Repeat(s, BlockSize*BytesPerToken/len(s)+1)[:BlockSize*BytesPerToken]
}

// prompt builds a prompt of the given blocks followed by tail tokens.
func prompt(tail int, ids ...int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(block(id))
	}
	b.WriteString(strings.Repeat("tail", tail))
	return b.String()
}

type event struct {
	id        uint64
	generated int
	at        time.Duration
}

// recorder is a Sink that keeps every event.
type recorder struct {
	tokens   []event
	finished []event
	onToken  func(r *Request)
}

func (s *recorder) Token(r *Request, at time.Duration) {
	s.tokens = append(s.tokens, event{r.ID, r.Generated, at})
	if s.onToken != nil {
		s.onToken(r)
	}
}

func (s *recorder) Finished(r *Request, at time.Duration) {
	s.finished = append(s.finished, event{r.ID, r.Generated, at})
}

// run steps e until it is idle or maxSteps pass, returning the steps'
// durations and the clock at the end.
func run(t *testing.T, e *Engine, now time.Duration, s Sink, maxSteps int) ([]time.Duration, time.Duration) {
	t.Helper()
	var steps []time.Duration
	for !e.Idle() {
		if len(steps) == maxSteps {
			t.Fatalf("engine not idle after %d steps: %+v", maxSteps, e.Stats())
		}
		d := e.Step(now, s)
		if d <= 0 {
			// Only a pending transfer or hold may leave a busy engine
			// nothing to do, until Wake.
			w, ok := e.Wake()
			if !ok || w <= now {
				t.Fatalf("step %d of a busy engine took %v (wake %v, %v)", len(steps), d, w, ok)
			}
			now = w
			continue
		}
		steps = append(steps, d)
		now += d
	}
	return steps, now
}

func add(t *testing.T, e *Engine, r *Request, now time.Duration) *Request {
	t.Helper()
	if err := e.Add(r, now); err != nil {
		t.Fatalf("add %d: %v", r.ID, err)
	}
	return r
}

func TestTimingSingleRequest(t *testing.T) {
	e := New(testPreset(), 0)
	var s recorder
	r := add(t, e, &Request{ID: 1, Prompt: prompt(40), OutputTokens: 3}, 0)
	steps, end := run(t, e, 0, &s, 10)
	want := []time.Duration{
		// prefill 40 tokens reading a context of 40: 1ms + 400µs + 40µs
		1440 * time.Microsecond,
		// decode, context 41: 1ms + 100µs + 41µs
		1141 * time.Microsecond,
		// decode, context 42
		1142 * time.Microsecond,
	}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Fatalf("steps = %v, want %v", steps, want)
	}
	if r.FirstTokenAt != 1440*time.Microsecond {
		t.Errorf("FirstTokenAt = %v, want 1.44ms", r.FirstTokenAt)
	}
	if r.FinishedAt != 3723*time.Microsecond || end != r.FinishedAt {
		t.Errorf("FinishedAt = %v (clock %v), want 3.723ms", r.FinishedAt, end)
	}
	wantTokens := []event{{1, 1, 1440 * time.Microsecond}, {1, 2, 2581 * time.Microsecond}, {1, 3, 3723 * time.Microsecond}}
	if fmt.Sprint(s.tokens) != fmt.Sprint(wantTokens) {
		t.Errorf("tokens = %v, want %v", s.tokens, wantTokens)
	}
	if len(s.finished) != 1 || s.finished[0] != wantTokens[2] {
		t.Errorf("finished = %v, want once at the last token", s.finished)
	}
}

func TestTimingStartsAtNow(t *testing.T) {
	e := New(testPreset(), 0)
	var s recorder
	r := add(t, e, &Request{ID: 1, Prompt: prompt(40), OutputTokens: 1}, 5*time.Second)
	if d := e.Step(5*time.Second, &s); d != 1440*time.Microsecond {
		t.Fatalf("step = %v", d)
	}
	if r.Arrival != 5*time.Second || r.FirstTokenAt != 5*time.Second+1440*time.Microsecond || r.FinishedAt != r.FirstTokenAt {
		t.Errorf("arrival %v first %v finished %v", r.Arrival, r.FirstTokenAt, r.FinishedAt)
	}
	if d := e.Step(6*time.Second, &s); d != 0 || !e.Idle() {
		t.Errorf("idle step = %v, idle %v", d, e.Idle())
	}
}

func TestChunkedPrefill(t *testing.T) {
	tests := []struct {
		promptTokens, budget, steps int
	}{
		{64, 64, 1},
		{65, 64, 2},
		{200, 64, 4},
		{1000, 256, 4},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d/%d", tt.promptTokens, tt.budget), func(t *testing.T) {
			p := testPreset()
			p.MaxBatchedTokens = tt.budget
			e := New(p, 0)
			r := add(t, e, &Request{ID: 1, Prompt: prompt(tt.promptTokens), OutputTokens: 1}, 0)
			steps, _ := run(t, e, 0, &recorder{}, 100)
			if len(steps) != tt.steps {
				t.Fatalf("%d steps, want ceil(%d/%d) = %d", len(steps), tt.promptTokens, tt.budget, tt.steps)
			}
			// Each step: overhead + its chunk + the context computed so far.
			var want time.Duration
			for done := 0; done < tt.promptTokens; {
				chunk := min(tt.budget, tt.promptTokens-done)
				done += chunk
				want += p.StepOverhead + time.Duration(chunk)*p.PerPrefillToken + time.Duration(done)*p.PerContextToken
			}
			if r.FirstTokenAt != want {
				t.Errorf("FirstTokenAt = %v, want %v", r.FirstTokenAt, want)
			}
			if got := e.Stats().PrefillTokensComputed; got != int64(tt.promptTokens) {
				t.Errorf("PrefillTokensComputed = %d", got)
			}
		})
	}
}

// A long prefill shares its steps with running decodes, which go first.
func TestChunkedPrefillSharesStepsWithDecodes(t *testing.T) {
	e := New(testPreset(), 0)
	var s recorder
	short := add(t, e, &Request{ID: 1, Prompt: prompt(10), OutputTokens: 5}, 0)
	e.Step(0, &s) // short prefills and samples its first token
	long := add(t, e, &Request{ID: 2, Prompt: prompt(200), OutputTokens: 1}, 0)
	// Next step: 1 decode token for short, 63 prefill tokens for long:
	// 1ms + 63*10µs + 100µs + context (11 + 63)*1µs.
	if d := e.Step(0, &s); d != 1804*time.Microsecond {
		t.Errorf("mixed step = %v, want 1.804ms", d)
	}
	if short.Generated != 2 || long.Generated != 0 {
		t.Errorf("generated short %d long %d", short.Generated, long.Generated)
	}
	run(t, e, 0, &s, 100)
	if short.Generated != 5 || long.Generated != 1 {
		t.Errorf("final generated short %d long %d", short.Generated, long.Generated)
	}
}

func TestPrefixHitAccounting(t *testing.T) {
	tests := []struct {
		name       string
		second     string
		wantCached int
	}{
		{"shares two of three blocks", prompt(10, 1, 2, 9), 32},
		{"same prompt", prompt(10, 1, 2, 3), 48},
		{"same full blocks, no tail: last token recomputed", prompt(0, 1, 2, 3), 32},
		{"longer prompt", prompt(10, 1, 2, 3, 4), 48},
		{"first block differs", prompt(10, 9, 2, 3), 0},
		{"shorter than a block", "hi", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testPreset(), 0)
			first := add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2, 3), OutputTokens: 2}, 0)
			_, now := run(t, e, 0, &recorder{}, 10)
			if first.CachedTokens != 0 {
				t.Fatalf("first request cached %d", first.CachedTokens)
			}
			second := add(t, e, &Request{ID: 2, Prompt: tt.second, OutputTokens: 2}, now)
			run(t, e, now, &recorder{}, 10)
			if second.CachedTokens != tt.wantCached {
				t.Errorf("CachedTokens = %d, want %d", second.CachedTokens, tt.wantCached)
			}
			st := e.Stats()
			if st.PrefixQueries != int64(first.PromptTokens+second.PromptTokens) || st.PrefixHits != int64(tt.wantCached) {
				t.Errorf("queries %d hits %d, want %d and %d", st.PrefixQueries, st.PrefixHits,
					first.PromptTokens+second.PromptTokens, tt.wantCached)
			}
			if st.PrefillTokensComputed != int64(first.PromptTokens+second.PromptTokens-tt.wantCached) {
				t.Errorf("PrefillTokensComputed = %d", st.PrefillTokensComputed)
			}
		})
	}
}

// The cache hit shortens the prefill in the timing model.
func TestPrefixHitShortensPrefill(t *testing.T) {
	e := New(testPreset(), 0)
	add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2, 3), OutputTokens: 1}, 0)
	_, now := run(t, e, 0, &recorder{}, 10)
	r := add(t, e, &Request{ID: 2, Prompt: prompt(10, 1, 2, 3), OutputTokens: 1}, now)
	// 48 cached, 10 computed, context 58: 1ms + 100µs + 58µs.
	if d := e.Step(now, &recorder{}); d != 1158*time.Microsecond || r.FirstTokenAt != now+d {
		t.Errorf("step %v first token %v", d, r.FirstTokenAt-now)
	}
}

// A request admitted while an earlier one is still computing a shared
// prefix finds the blocks already scheduled, as in vLLM.
func TestPrefixHitWhileRunning(t *testing.T) {
	e := New(testPreset(), 0)
	add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2), OutputTokens: 20}, 0)
	e.Step(0, &recorder{})
	r := add(t, e, &Request{ID: 2, Prompt: prompt(3, 1, 2, 5), OutputTokens: 1}, 0)
	run(t, e, 0, &recorder{}, 50)
	if r.CachedTokens != 32 {
		t.Errorf("CachedTokens = %d, want 32", r.CachedTokens)
	}
}

// Unreferenced blocks are evicted least recently freed first, and a
// finished request's blocks are freed tail first.
func TestEvictionOrder(t *testing.T) {
	// 8 blocks. A = [a0 a1]+1 token takes blocks 0,1,2 and frees them tail
	// first; B = [b0 b1]+1 takes 3,4,5. The free list is then, from the
	// eviction end: 6 7 | 2(A tail) 1(a1) 0(a0) | 5(B tail) 4(b1) 3(b0).
	tests := []struct {
		name         string
		fillerBlocks int // blocks the filler request takes from the head
		wantA, wantB int // cached tokens of A and B asked again afterwards
	}{
		{"nothing evicted", 3, 32, 32},
		{"A's tail block first", 4, 16, 32},
		{"all of A before any of B", 5, 0, 32},
		{"then B's tail", 7, 0, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, again := range []int{1, 2} {
				e := New(testPreset(), 8)
				var now time.Duration
				for i, ids := range [][]int{{1, 2}, {3, 4}} {
					add(t, e, &Request{ID: uint64(i + 1), Prompt: prompt(1, ids...), OutputTokens: 1}, now)
					_, now = run(t, e, now, &recorder{}, 10)
				}
				// The filler needs exactly fillerBlocks blocks and holds
				// them while the prompt is asked again, so that only the
				// filler's allocations evict.
				fillerText := strings.Repeat("f", ((tt.fillerBlocks-1)*BlockSize+1)*BytesPerToken)
				filler := add(t, e, &Request{ID: 3, Prompt: fillerText, OutputTokens: 2}, now)
				for filler.Generated == 0 {
					now += e.Step(now, &recorder{})
				}
				if len(filler.blocks) != tt.fillerBlocks {
					t.Fatalf("filler holds %d blocks", len(filler.blocks))
				}
				ids, want := []int{1, 2}, tt.wantA
				if again == 2 {
					ids, want = []int{3, 4}, tt.wantB
				}
				r := add(t, e, &Request{ID: 4, Prompt: prompt(1, ids...), OutputTokens: 1}, now)
				run(t, e, now, &recorder{}, 10)
				if r.CachedTokens != want {
					t.Errorf("request %d again: CachedTokens = %d, want %d", again, r.CachedTokens, want)
				}
			}
		})
	}
}

func TestPreemption(t *testing.T) {
	// 10 blocks (160 tokens); each request grows to 40+100 tokens = 9
	// blocks, so the two cannot both finish without a preemption.
	e := New(testPreset(), 10)
	var s recorder
	a := add(t, e, &Request{ID: 1, Prompt: prompt(8, 1, 2), OutputTokens: 100}, 0)
	b := add(t, e, &Request{ID: 2, Prompt: prompt(8, 3, 4), OutputTokens: 100}, 0)
	run(t, e, 0, &s, 2000)
	st := e.Stats()
	if st.Preemptions < 1 {
		t.Fatalf("no preemption: %+v", st)
	}
	for _, r := range []*Request{a, b} {
		if r.Generated != 100 || r.FinishedAt == 0 {
			t.Errorf("request %d: generated %d finished %v", r.ID, r.Generated, r.FinishedAt)
		}
		// Tokens arrive once each, in order, whatever the preemptions.
		n := 0
		for _, ev := range s.tokens {
			if ev.id == r.ID {
				n++
				if ev.generated != n {
					t.Fatalf("request %d: token %d reported as %d", r.ID, n, ev.generated)
				}
			}
		}
		if n != 100 {
			t.Errorf("request %d: %d tokens reported", r.ID, n)
		}
	}
	if len(s.finished) != 2 {
		t.Errorf("finished %d times", len(s.finished))
	}
	// The most recently admitted request is the victim: a runs through.
	if a.FinishedAt >= b.FinishedAt {
		t.Errorf("a finished at %v, b at %v: b should have been preempted", a.FinishedAt, b.FinishedAt)
	}
	if st.GenerationTokens != 200 || st.KVUsage != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("stats after the run: %+v", st)
	}
	// Recomputation shows as prefill beyond the prompts.
	if st.PrefillTokensComputed <= int64(a.PromptTokens+b.PromptTokens) {
		t.Errorf("PrefillTokensComputed = %d: no recomputation counted", st.PrefillTokensComputed)
	}
	if a.CachedTokens != 0 || b.CachedTokens != 0 {
		t.Errorf("cached tokens a %d b %d: set at first admission only", a.CachedTokens, b.CachedTokens)
	}
}

func TestContextError(t *testing.T) {
	e := New(testPreset(), 0)
	err := e.Add(&Request{ID: 1, Prompt: prompt(1000), OutputTokens: 100}, 0)
	var ce *ContextError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ContextError", err)
	}
	want := "This model's maximum context length is 1024 tokens. However, you requested 1100 tokens (1000 in the messages, 100 in the completion)."
	if !strings.HasPrefix(ce.Message, want) {
		t.Errorf("message %q", ce.Message)
	}
	if !e.Idle() {
		t.Error("rejected request queued")
	}
	if err := e.Add(&Request{ID: 2, Prompt: prompt(1000), OutputTokens: 24}, 0); err != nil {
		t.Errorf("exactly the context length: %v", err)
	}
	// max_tokens counts even when the request would stop earlier, as in vLLM.
	err = e.Add(&Request{ID: 4, Prompt: prompt(1000), OutputTokens: 5, MaxTokens: 100}, 0)
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Message, want) {
		t.Errorf("prompt + max_tokens over the context: %v", err)
	}
	// max_tokens near 2^63 must not wrap the sum below the context (it
	// was accepted and generated until the client left); the message's
	// total saturates.
	fresh := New(testPreset(), 0)
	for _, huge := range []int{math.MaxInt, math.MaxInt - 999, math.MaxInt / 2} {
		err = fresh.Add(&Request{ID: 5, Prompt: prompt(1000), OutputTokens: 5, MaxTokens: huge}, 0)
		if !errors.As(err, &ce) {
			t.Fatalf("max_tokens %d: err = %v, want *ContextError", huge, err)
		}
		if total := fmt.Sprintf("you requested %d tokens", request.AddTokens(1000, huge)); !strings.Contains(ce.Message, total) {
			t.Errorf("max_tokens %d: message %q, want %q", huge, ce.Message, total)
		}
	}
	if !fresh.Idle() {
		t.Error("a request with max_tokens near 2^63 was queued")
	}
	// A KV cache smaller than the context length lowers it.
	small := New(testPreset(), 4)
	if small.Preset().MaxModelLen != 64 {
		t.Errorf("MaxModelLen with 4 blocks = %d", small.Preset().MaxModelLen)
	}
	if err := small.Add(&Request{ID: 3, Prompt: prompt(60), OutputTokens: 5}, 0); !errors.As(err, &ce) {
		t.Errorf("over the KV cache: %v", err)
	}
}

func TestAbort(t *testing.T) {
	e := New(testPreset(), 0)
	var s recorder
	running := add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2), OutputTokens: 50}, 0)
	e.Step(0, &s)
	p := e.Preset()
	p.MaxNumSeqs = 1
	e.p = p
	waiting := add(t, e, &Request{ID: 2, Prompt: prompt(10), OutputTokens: 5}, 0)
	e.Step(0, &s)
	if st := e.Stats(); st.Running != 1 || st.Waiting != 1 || st.KVUsage != 3.0/100 {
		t.Fatalf("before abort: %+v", st)
	}
	e.Abort(waiting)
	if st := e.Stats(); st.Waiting != 0 || st.Running != 1 {
		t.Fatalf("after aborting the waiting request: %+v", st)
	}
	e.Abort(running)
	if st := e.Stats(); st.Running != 0 || st.KVUsage != 0 || !e.Idle() {
		t.Fatalf("after aborting the running request: %+v", st)
	}
	if len(s.finished) != 0 {
		t.Errorf("Finished called on abort: %v", s.finished)
	}
	e.Abort(running) // twice is harmless
	// Its prompt blocks stay cached for the next request.
	again := add(t, e, &Request{ID: 3, Prompt: prompt(10, 1, 2), OutputTokens: 1}, 0)
	run(t, e, 0, &s, 10)
	if again.CachedTokens != 32 {
		t.Errorf("CachedTokens after abort = %d, want 32", again.CachedTokens)
	}
}

func TestAbortFromSink(t *testing.T) {
	e := New(testPreset(), 0)
	var reqs []*Request
	for i := range 4 {
		reqs = append(reqs, add(t, e, &Request{ID: uint64(i), Prompt: prompt(10), OutputTokens: 10}, 0))
	}
	s := &recorder{}
	s.onToken = func(r *Request) {
		// Request 2 leaves at its third token, and takes request 0 with it.
		if r.ID == 2 && r.Generated == 3 {
			e.Abort(r)
			e.Abort(reqs[0])
		}
	}
	run(t, e, 0, s, 100)
	if reqs[0].Generated != 3 || reqs[2].Generated != 3 || reqs[1].Generated != 10 || reqs[3].Generated != 10 {
		t.Errorf("generated %d %d %d %d", reqs[0].Generated, reqs[1].Generated, reqs[2].Generated, reqs[3].Generated)
	}
	if st := e.Stats(); st.KVUsage != 0 || st.Running != 0 {
		t.Errorf("after the run: %+v", st)
	}
}

func TestStats(t *testing.T) {
	e := New(testPreset(), 0)
	var busy time.Duration
	add(t, e, &Request{ID: 1, Prompt: prompt(10, 1), OutputTokens: 4}, 0)
	add(t, e, &Request{ID: 2, Prompt: prompt(20, 1), OutputTokens: 2}, 0)
	if st := e.Stats(); st.Waiting != 2 || st.Running != 0 {
		t.Fatalf("queued: %+v", st)
	}
	busy += e.Step(0, &recorder{})
	st := e.Stats()
	// 26 + 36 tokens in 2 + 3 blocks; both admitted in the same step, so the
	// second finds the first's block 1 already scheduled.
	if st.Running != 2 || st.Waiting != 0 || st.KVUsage != 4.0/100 {
		t.Errorf("after one step: %+v", st)
	}
	steps, _ := run(t, e, busy, &recorder{}, 10)
	for _, d := range steps {
		busy += d
	}
	st = e.Stats()
	want := Stats{
		PrefixQueries: 26 + 36, PrefixHits: 16,
		PromptTokens: 26 + 36, GenerationTokens: 6,
		BusyTime: busy, PrefillTokensComputed: 26 + 20,
	}
	if st != want {
		t.Errorf("stats = %+v\nwant    %+v", st, want)
	}
}

func TestMaxNumSeqs(t *testing.T) {
	p := testPreset()
	p.MaxNumSeqs = 2
	e := New(p, 0)
	for i := range 5 {
		add(t, e, &Request{ID: uint64(i), Prompt: prompt(4), OutputTokens: 3}, 0)
	}
	e.Step(0, &recorder{})
	if st := e.Stats(); st.Running != 2 || st.Waiting != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestOutputTokens(t *testing.T) {
	tests := []struct {
		name                string
		max, min            int
		ignoreEOS           bool
		prompt, maxModelLen int
		wantLo, wantHi      int
	}{
		{"ignore_eos with max_tokens", 100, 0, true, 10, 1000, 100, 100},
		{"ignore_eos without max_tokens: default cap", 0, 0, true, 10, 100000, DefaultMaxTokens, DefaultMaxTokens},
		{"ignore_eos without max_tokens: rest of context", 0, 0, true, 900, 1000, 100, 100},
		{"natural within [min, max]", 100, 20, false, 10, 1000, 20, 100},
		{"natural without max_tokens", 0, 0, false, 10, 100000, 1, DefaultMaxTokens},
		{"min_tokens equal to max_tokens", 50, 50, false, 10, 1000, 50, 50},
		{"no room left", 0, 0, true, 1000, 1000, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[int]bool{}
			for seed := range uint64(200) {
				n := OutputTokens(tt.max, tt.min, tt.ignoreEOS, tt.prompt, tt.maxModelLen, seed)
				if n < tt.wantLo || n > tt.wantHi {
					t.Fatalf("seed %d: %d not in [%d, %d]", seed, n, tt.wantLo, tt.wantHi)
				}
				if n != OutputTokens(tt.max, tt.min, tt.ignoreEOS, tt.prompt, tt.maxModelLen, seed) {
					t.Fatalf("seed %d: not deterministic", seed)
				}
				seen[n] = true
			}
			if tt.wantHi-tt.wantLo > 50 && len(seen) < 50 {
				t.Errorf("only %d distinct lengths over 200 seeds", len(seen))
			}
		})
	}
}

// TestSetOutputSeed checks that SetOutput, which hashes the prompt only
// when the length depends on it, gives what the rule gives with the
// prompt's hash as the seed.
func TestSetOutputSeed(t *testing.T) {
	prompt := strings.Repeat("abcd ", 300)
	for _, ignoreEOS := range []bool{false, true} {
		for _, maxTokens := range []int{0, 1, 7, 200} {
			r := Request{Prompt: prompt}
			r.SetOutput(maxTokens, 3, ignoreEOS, 4096)
			want := OutputTokens(maxTokens, 3, ignoreEOS, Tokens(prompt), 4096, xxhash.Sum64String(prompt))
			if r.OutputTokens != want || r.MaxTokens != maxTokens {
				t.Errorf("ignoreEOS=%v max_tokens=%d: SetOutput gave %d tokens (max %d), want %d", ignoreEOS, maxTokens, r.OutputTokens, r.MaxTokens, want)
			}
		}
	}
}

func TestPresets(t *testing.T) {
	for _, name := range []string{"h100-llama3-8b", "a100-llama3-8b", "h100-llama3-70b-tp4"} {
		p, err := LookupPreset(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name != name || p.KVBlocks <= 0 || p.StepOverhead <= 0 || p.PerPrefillToken <= 0 ||
			p.PerContextToken <= 0 || p.MaxModelLen > p.KVBlocks*BlockSize {
			t.Errorf("%s: %+v", name, p)
		}
	}
	_, err := LookupPreset("tpu")
	if err == nil || !strings.Contains(err.Error(), "h100-llama3-8b") {
		t.Errorf("unknown preset error %v", err)
	}
	// Hand arithmetic for h100-llama3-8b (docs/engine.md): weights 16.06 GB
	// read at 0.8 x 3.35 TB/s; 16.06 GFLOP per token at 0.4 x 989 TFLOPS;
	// 128 KiB of KV per token; (72 GiB - 16.06 GB - 2 GiB) / 128 KiB / 16;
	// a rank-16 adapter of 16 x 81,920 x 32 BF16 parameters (83.9 MB) at
	// 2 GB/s; a KV transfer of 128 KiB a token at 0.8 x 400 Gb/s after two
	// 50 µs round trips; a load from the CPU tier of 128 KiB a token at
	// 0.8 x 64 GB/s (PCIe 5.0 x16).
	p, _ := LookupPreset("h100-llama3-8b")
	want := Preset{
		Name: "h100-llama3-8b", Model: "meta-llama/Llama-3.1-8B-Instruct",
		KVBlocks: 28181, MaxNumSeqs: 1024, MaxBatchedTokens: 8192, MaxModelLen: 131072,
		StepOverhead: 5992537, PerPrefillToken: 40597, PerDecodeSeq: 40597, PerContextToken: 49,
		LoRALoad: 41943040, KVTransferLatency: 100 * time.Microsecond, KVTransferPerToken: 3277,
		HostLoadPerToken: 2560,
	}
	if p != want {
		t.Errorf("h100-llama3-8b = %+v\nwant %+v", p, want)
	}
	// 8192 / (5.992537 ms + 8192 x 40.597 µs) = 24,196 tokens/s.
	if got := p.PrefillTokensPerSec(); got < 24195 || got > 24197 {
		t.Errorf("PrefillTokensPerSec = %f", got)
	}
}

// PromptHashes given by the driver are used as they are.
func TestPromptHashesFromDriver(t *testing.T) {
	e := New(testPreset(), 0)
	add(t, e, &Request{ID: 1, Prompt: prompt(10, 1, 2), OutputTokens: 1, PromptHashes: []uint64{7, 8}}, 0)
	_, now := run(t, e, 0, &recorder{}, 10)
	r := add(t, e, &Request{ID: 2, Prompt: prompt(10, 3, 4), OutputTokens: 1, PromptHashes: []uint64{7, 9}}, now)
	run(t, e, now, &recorder{}, 10)
	if r.CachedTokens != 16 {
		t.Errorf("CachedTokens = %d, want 16 (the hashes decide)", r.CachedTokens)
	}
}

func TestWithLimits(t *testing.T) {
	base, err := LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                 string
		seqs, batched        int
		wantSeqs, wantTokens int
		wantErr              string
	}{
		{"zero keeps the preset's", 0, 0, base.MaxNumSeqs, base.MaxBatchedTokens, ""},
		{"small cap", 8, 0, 8, base.MaxBatchedTokens, ""},
		{"small chunk", 0, 512, base.MaxNumSeqs, 512, ""},
		{"both", 4, 2048, 4, 2048, ""},
		{"negative cap", -1, 0, 0, 0, "max-num-seqs"},
		{"negative chunk", 0, -1, 0, 0, "max-num-batched-tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := base.WithLimits(tt.seqs, tt.batched)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.MaxNumSeqs != tt.wantSeqs || p.MaxBatchedTokens != tt.wantTokens {
				t.Fatalf("MaxNumSeqs %d MaxBatchedTokens %d, want %d and %d", p.MaxNumSeqs, p.MaxBatchedTokens, tt.wantSeqs, tt.wantTokens)
			}
			// The engine runs with them: a cap of N admits N sequences.
			e := New(p, 0)
			if got := e.Preset(); got.MaxNumSeqs != tt.wantSeqs || got.MaxBatchedTokens != tt.wantTokens {
				t.Fatalf("engine runs with %d seqs and %d tokens, want %d and %d", got.MaxNumSeqs, got.MaxBatchedTokens, tt.wantSeqs, tt.wantTokens)
			}
		})
	}
}
