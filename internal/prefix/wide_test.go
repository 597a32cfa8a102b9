package prefix

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestMatchWideLockFree: Match over a fleet of 1,024 backends, the
// holders of every block spread over all their words, never waits for a
// writer: it returns while another goroutine holds the write lock (a
// peer's routings being applied), with the picture as of before it.
func TestMatchWideLockFree(t *testing.T) {
	ix := NewIndex(1000)
	p := hs(1<<20, 20)
	for _, b := range []int{3, 64, 700, 1023} {
		ix.Insert(b, p[:b%17+1])
	}
	ix.mu.Lock()
	defer ix.unlock()
	done := make(chan []int32, 1)
	go func() {
		out := make([]int32, 1024)
		ix.Match(p, out)
		done <- out
	}()
	select {
	case out := <-done:
		for _, b := range []int{3, 64, 700, 1023} {
			if int(out[b]) != b%17+1 {
				t.Errorf("backend %d matched %d blocks, want %d", b, out[b], b%17+1)
			}
		}
	case <-time.After(time.Minute):
		// Match takes microseconds; a minute is no load, it is a wait
		// for the lock held above.
		t.Error("Match over 1,024 backends waited for the write lock")
	}
}

// TestMatchWideAgreesWithHolds checks Match over fleets of several sizes
// against the pair table's answer, block by block, after random inserts,
// evictions and removals.
func TestMatchWideAgreesWithHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{8, 64, 65, 200, 1024} {
		ix := NewIndex(400)
		prompts := make([][]uint64, 6)
		for i := range prompts {
			prompts[i] = hs(uint64(i+1)<<40, 50)
		}
		for range 3 * n {
			b := rng.IntN(n)
			switch rng.IntN(20) {
			case 0:
				ix.RemoveBackend(b)
			default:
				p := prompts[rng.IntN(len(prompts))]
				ix.Insert(b, p[:1+rng.IntN(len(p))])
			}
		}
		checkInvariants(t, ix)
		out := make([]int32, n)
		for _, p := range prompts {
			ix.Match(p, out)
			for b := range n {
				want := 0
				for want < len(p) && ix.Holds(b, p[want]) {
					want++
				}
				if int(out[b]) != want {
					t.Fatalf("%d backends: backend %d matched %d blocks, holds %d", n, b, out[b], want)
				}
			}
		}
	}
}

// TestMatchWhileWidening: Matches over 512 backends run while a writer
// adds backends one by one (rebuilding the block map with more holder
// words as it passes each 64) and evicts: every answer is a picture the
// index was in, so a block a backend holds from the start and never
// loses is always matched.
func TestMatchWhileWidening(t *testing.T) {
	ix := NewIndex(60)
	p := hs(1<<20, 40)
	ix.Insert(0, p[:10]) // held throughout: backend 0 never passes its capacity
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := 1; b < 512; b++ {
			ix.Insert(b, p[:1+b%40])
			ix.Insert(b, hs(uint64(b)<<30, 50)) // evicts part of the prompt
		}
	}()
	out := make([]int32, 512)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		ix.Match(p, out)
		if out[0] != 10 {
			t.Fatalf("backend 0 matched %d blocks while widening, want 10", out[0])
		}
		for b, n := range out {
			if n < 0 || int(n) > len(p) {
				t.Fatalf("backend %d matched %d blocks of %d", b, n, len(p))
			}
		}
	}
	checkInvariants(t, ix)
}
