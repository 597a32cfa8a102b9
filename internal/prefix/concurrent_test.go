package prefix

import (
	"sync"
	"testing"
)

// TestNoWaitQueuedWhileHeld: a write that must not wait finds the lock
// held, by a writer or a reader, returns at once, and is applied in order
// by the holder when it lets go.
func TestNoWaitQueuedWhileHeld(t *testing.T) {
	for _, held := range []string{"write", "read"} {
		t.Run(held, func(t *testing.T) {
			ix := NewIndex(1000)
			p := hs(1<<20, 40)
			hold, release := ix.mu.Lock, ix.unlock
			if held == "read" {
				hold, release = ix.mu.RLock, ix.runlock
			}

			hold()
			if nodes, _ := ix.AcquireNodesNoWait(3, p, 0, nil); nodes != nil {
				t.Fatalf("acquire under a held lock returned %d handles, want none (queued)", len(nodes))
			}
			if got := ix.queued.Load(); got != 1 {
				t.Fatalf("%d writes queued, want 1", got)
			}
			if out := make([]int32, 4); held == "write" {
				// The queued acquire is not visible before it is applied.
				ix.Match(p, out)
				if out[3] != 0 {
					t.Fatalf("a queued acquire matched %d blocks before it was applied", out[3])
				}
			}
			release()
			if got := match(t, ix, p, 4)[3]; got != 40 {
				t.Fatalf("after the holder let go, backend 3 matches %d blocks, want 40", got)
			}
			if ix.queued.Load() != 0 {
				t.Fatalf("%d writes still queued after the holder let go", ix.queued.Load())
			}
			checkPins(t, ix, 3, 40)

			// A release queued behind its own acquire applies after it.
			q := hs(1<<30, 10)
			hold()
			ix.AcquireNodesNoWait(3, q, 0, nil)
			ix.ReleaseNodesNoWait(3, q, nil)
			release()
			checkPins(t, ix, 3, 40)
			checkInvariants(t, ix)
		})
	}
}

// checkPins fails unless backend has exactly pinned pinned blocks.
func checkPins(t *testing.T, ix *Index, backend, pinned int) {
	t.Helper()
	ix.mu.RLock()
	defer ix.runlock()
	l := &ix.backends[backend]
	if got := l.n - l.unpinned; got != pinned {
		t.Fatalf("backend %d has %d pinned blocks, want %d", backend, got, pinned)
	}
}

// TestConcurrentMatch races picks against writers that churn the index
// well past its capacity (evicting, emptying slots, rebuilding the block
// map): a prompt pinned on one backend throughout must match in full on
// every pick, as it would under a lock, and when the writers are done
// every pin they took is released and nothing is left queued. Run under
// the race detector, it also checks that the lock-free read is a
// synchronised one.
func TestConcurrentMatch(t *testing.T) {
	ix := NewIndex(3000)
	const backends = 4
	p := hs(1<<50, 40)
	ix.Acquire(2, p)

	var writers sync.WaitGroup
	// A peer's routings, waiting for the lock: 20 in flight at a time.
	writers.Go(func() {
		var inflight [][]uint64
		for i := range 400 {
			h := hs(uint64(i+1)<<32, 125)
			ix.Acquire(i%backends, h)
			inflight = append(inflight, h)
			if len(inflight) > 20 {
				ix.Release((i-20)%backends, inflight[0])
				inflight = inflight[1:]
			}
		}
		for k, h := range inflight {
			ix.Release((400-len(inflight)+k)%backends, h)
		}
	})
	// This replica's own routings, never waiting.
	for g := range 2 {
		writers.Go(func() {
			for i := range 300 {
				h := append(hs(uint64(g+1)<<60, 20), hs(uint64(g+1)<<58|uint64(i+1)<<24, 100)...)
				b := (i + g) % backends
				nodes, _ := ix.AcquireNodesNoWait(b, h, 0, nil)
				ix.ReleaseNodesNoWait(b, h, nodes)
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			out := make([]int32, backends)
			for picks := 0; ; picks++ {
				select {
				case <-stop:
					if picks == 0 {
						t.Error("no pick ran beside the writers")
					}
					return
				default:
				}
				ix.Match(p, out)
				if out[2] != int32(len(p)) {
					t.Errorf("pick %d: the pinned prompt matched %d blocks on its backend, want %d", picks, out[2], len(p))
					return
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()

	if n := ix.queued.Load(); n != 0 {
		t.Fatalf("%d writes left queued", n)
	}
	for b := range backends {
		want := 0
		if b == 2 {
			want = len(p)
		}
		checkPins(t, ix, b, want)
	}
	checkInvariants(t, ix)
}
