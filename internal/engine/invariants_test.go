package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

// checkInvariants verifies the engine's bookkeeping from scratch: every
// block's reference count is the number of block tables that hold it, the
// free list holds exactly the unreferenced blocks, every hashed block is
// findable under its hash, and every request holds the blocks its computed
// tokens need.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	c := e.kv
	refs := make([]int32, len(c.ref))
	for _, r := range e.running {
		if r.state != stateRunning {
			t.Fatalf("request %d in the running list in state %d", r.ID, r.state)
		}
		if len(r.blocks) < blocksFor(r.computed) || r.computed >= r.tokens()+1 {
			t.Fatalf("request %d: %d blocks for %d computed of %d tokens", r.ID, len(r.blocks), r.computed, r.tokens())
		}
		for _, b := range r.blocks {
			refs[b]++
		}
	}
	// A request waiting for its remote KV holds its whole prompt's blocks,
	// a held one the blocks it finished with.
	for _, r := range e.remote {
		if r.state != stateRemote || len(r.blocks) != blocksFor(r.PromptTokens) {
			t.Fatalf("remote request %d: state %d, %d blocks for %d prompt tokens", r.ID, r.state, len(r.blocks), r.PromptTokens)
		}
		for _, b := range r.blocks {
			refs[b]++
		}
	}
	for _, r := range e.held {
		if r.state != stateHeld || len(r.blocks) == 0 {
			t.Fatalf("held request %d: state %d, %d blocks", r.ID, r.state, len(r.blocks))
		}
		for _, b := range r.blocks {
			refs[b]++
		}
	}
	for i := range e.waiting.len() {
		if r := e.waiting.at(i); r.state != stateWaiting || len(r.blocks) != 0 {
			t.Fatalf("waiting request %d: state %d, %d blocks", r.ID, r.state, len(r.blocks))
		}
	}
	inList := make([]bool, len(c.ref))
	n := 0
	for b := c.fresh; int(b) < len(c.ref); b++ {
		if c.hashed[b] {
			t.Fatalf("never allocated block %d has a hash", b)
		}
		inList[b] = true
		n++
	}
	for b := c.next[c.sentinel()]; b != c.sentinel(); b = c.next[b] {
		if b >= c.fresh {
			t.Fatalf("never allocated block %d is linked in the free list", b)
		}
		inList[b] = true
		n++
	}
	if n != c.free {
		t.Fatalf("free list has %d blocks, count says %d", n, c.free)
	}
	for b := range c.ref {
		if c.ref[b] != refs[b] {
			t.Fatalf("block %d: ref %d, held by %d tables", b, c.ref[b], refs[b])
		}
		if inList[b] != (refs[b] == 0) {
			t.Fatalf("block %d: ref %d, in free list %v", b, refs[b], inList[b])
		}
		if c.hashed[b] {
			if got, ok := c.lookup(c.hash[b]); !ok || got != int32(b) {
				t.Fatalf("hashed block %d not found under its hash", b)
			}
		}
	}
	hashedCount := 0
	for _, v := range c.index {
		if v != 0 {
			hashedCount++
			if !c.hashed[v-1] {
				t.Fatalf("index holds unhashed block %d", v-1)
			}
		}
	}
	for b := range c.hashed {
		if c.hashed[b] {
			hashedCount--
		}
	}
	if hashedCount != 0 {
		t.Fatalf("index and hashed flags disagree by %d", hashedCount)
	}
}

// A random workload on a small cache, with shared prefixes, preemptions
// and aborts (some from inside the sink): the bookkeeping holds after every
// step and every request that is not aborted generates exactly its tokens.
func TestRandomWorkloadInvariants(t *testing.T) {
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 99))
		p := testPreset()
		p.MaxNumSeqs = 6
		e := New(p, 24) // 384 tokens
		var reqs []*Request
		tokens := map[*Request]int{}
		finished := map[*Request]int{}
		aborted := map[*Request]bool{}
		s := &funcSink{
			token: func(r *Request, _ time.Duration) {
				tokens[r]++
				if tokens[r] != r.Generated {
					t.Fatalf("request %d: token %d reported with Generated %d", r.ID, tokens[r], r.Generated)
				}
				// At its last token a request is already done: Abort is a no-op.
				if rng.IntN(500) == 0 && r.state == stateRunning {
					e.Abort(r)
					aborted[r] = true
				}
			},
			finished: func(r *Request, _ time.Duration) { finished[r]++ },
		}
		var now time.Duration
		for step := 0; step < 3000; step++ {
			if len(reqs) < 150 && rng.IntN(3) == 0 {
				ids := []int{rng.IntN(3), 10 + rng.IntN(3), 100 + rng.IntN(1000)}[:1+rng.IntN(3)]
				r := &Request{ID: uint64(len(reqs)), Prompt: prompt(rng.IntN(40), ids...), OutputTokens: 1 + rng.IntN(150),
					RemotePrefill: rng.IntN(4) == 0, HoldKV: rng.IntN(6) == 0}
				if err := e.Add(r, now); err != nil {
					continue // over the 384-token context
				}
				reqs = append(reqs, r)
			}
			if len(reqs) > 0 && rng.IntN(40) == 0 {
				r := reqs[rng.IntN(len(reqs))]
				switch r.state {
				case stateWaiting, stateRunning, stateRemote:
					e.Abort(r)
					aborted[r] = true
				case stateHeld:
					e.ReleaseKV(r) // the decode engine read them
				}
			}
			d := e.Step(now, s)
			if w, ok := e.Wake(); d == 0 && ok {
				now = max(now, w)
			}
			now += d
			checkInvariants(t, e)
		}
		_, now = run(t, e, now, s, 100000)
		checkInvariants(t, e)
		// Holds not released time out.
		e.Step(now+KVHoldTimeout, s)
		checkInvariants(t, e)
		if e.kv.used() != 0 {
			t.Fatalf("seed %d: %d blocks still used", seed, e.kv.used())
		}
		for _, r := range reqs {
			if aborted[r] {
				if finished[r] != 0 {
					t.Fatalf("aborted request %d finished", r.ID)
				}
				continue
			}
			if r.Generated != r.OutputTokens || finished[r] != 1 || tokens[r] != r.OutputTokens {
				t.Fatalf("seed %d request %d: generated %d of %d, finished %d times", seed, r.ID, r.Generated, r.OutputTokens, finished[r])
			}
		}
		if st := e.Stats(); st.Preemptions == 0 || st.KVTransferTokens == 0 {
			t.Errorf("seed %d: no preemption or no transfer exercised: %+v", seed, st)
		}
	}
}

type funcSink struct {
	token, finished func(*Request, time.Duration)
}

func (s *funcSink) Token(r *Request, at time.Duration)    { s.token(r, at) }
func (s *funcSink) Finished(r *Request, at time.Duration) { s.finished(r, at) }
