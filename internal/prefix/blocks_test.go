package prefix

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// checkBlockSlots verifies the block map's slots: none is a tombstone,
// each used one is found from its block's home, at most half are used, as
// many as the count, and no deletion is left half done.
func checkBlockSlots(t *testing.T, bt *blockTable) {
	t.Helper()
	a := bt.arr.Load()
	if a == nil {
		if bt.n != 0 {
			t.Fatalf("no block map, %d blocks counted", bt.n)
		}
		return
	}
	used := 0
	for k := range a.slots {
		sl := &a.slots[k]
		if sl.empty() {
			if sl.mask.Load() != 0 || sl.holders != 0 {
				t.Fatalf("block map slot %d is empty but has holders", k)
			}
			continue
		}
		used++
		if sl.holders == 0 {
			t.Fatalf("block map slot %d is used with no holder", k)
		}
		if f := a.find(sl.hash.Load()); f != k {
			t.Fatalf("block map slot %d: its block is found at %d", k, f)
		}
	}
	if 2*used > len(a.slots) {
		t.Fatalf("block map uses %d of %d slots, over half", used, len(a.slots))
	}
	if a.moves.Load()&1 != 0 {
		t.Fatal("block map left with an odd count of moves")
	}
	if used != bt.n {
		t.Fatalf("block map has %d used slots, counts %d", used, bt.n)
	}
}

// TestBlockTableAgainstMap replays a long random sequence of holders
// added and removed (through the growths of the table and, at its size,
// tens of thousands of deletions that move blocks back) against a map from
// block to holders, and compares every lookup: Match over a random prompt
// and the holder words of one block, for backends in the first word and
// past it.
func TestBlockTableAgainstMap(t *testing.T) {
	backends := []int{0, 1, 63, 64, 130}
	const keys, steps = 3000, 20000
	rng := rand.New(rand.NewPCG(7, 8))
	ix := NewIndex(0)
	model := map[uint64][3]uint64{} // block -> holder words
	// Blocks are drawn from keys in clusters of neighbouring numbers, so
	// that runs of slots form and break up as blocks come and go.
	key := func() uint64 { return uint64(rng.IntN(keys)) + 1<<40 }
	holds := func(h uint64, b int) bool { return model[h][b/64]&(1<<(b%64)) != 0 }
	prompt := make([]uint64, 12)
	out := make([]int32, 131)
	for step := range steps {
		h, b := key(), backends[rng.IntN(len(backends))]
		// Add more often than remove while few are held, less often once
		// many are, so that the table grows and then churns at its size.
		addP := 0.8
		if len(model) > keys/2 {
			addP = 0.35
		}
		w := model[h]
		switch {
		case !holds(h, b) && rng.Float64() < addP:
			ix.blocks.add(h, b)
			w[b/64] |= 1 << (b % 64)
			model[h] = w
		case holds(h, b):
			ix.blocks.remove(h, b)
			if w[b/64] &^= 1 << (b % 64); w == [3]uint64{} {
				delete(model, h)
			} else {
				model[h] = w
			}
		}

		// A prompt of held and unheld blocks, most of it held by someone.
		for i := range prompt {
			prompt[i] = key()
		}
		ix.Match(prompt, out)
		for _, b := range backends {
			want := 0
			for want < len(prompt) && holds(prompt[want], b) {
				want++
			}
			if int(out[b]) != want {
				t.Fatalf("step %d: backend %d matched %d, want %d", step, b, out[b], want)
			}
		}
		if a := ix.blocks.arr.Load(); a != nil {
			all, got := make([]uint64, a.words), make([]uint64, a.words)
			for i := range all {
				all[i] = ^uint64(0)
			}
			q := key()
			a.read(q, all, got)
			for i := range got {
				if i < 3 && got[i] != model[q][i] {
					t.Fatalf("step %d: block %x holder word %d is %x, want %x", step, q, i, got[i], model[q][i])
				}
			}
		}
		if step%5000 == 0 || step == steps-1 {
			checkBlockSlots(t, &ix.blocks)
			if ix.blocks.n != len(model) {
				t.Fatalf("step %d: %d blocks counted, %d held", step, ix.blocks.n, len(model))
			}
		}
	}
	if a := ix.blocks.arr.Load(); len(a.slots) < 4*minPairSlots || a.moves.Load() < 200 {
		t.Fatalf("the table has %d slots and counted %d moves: it should have grown twice and, at its last size, moved blocks in a hundred deletions", len(a.slots), a.moves.Load())
	}
}

// TestMatchWhileMoving races Match against a writer that adds and deletes
// blocks in front of a held prompt, in one long run, so that deletions
// keep moving the prompt's blocks back along it: every pick must find the
// whole prompt on its backend, and never a block nobody holds. (A reader
// misses a block only if a deletion's moves pass it in the middle of its
// probe, which this run makes possible, not likely: the count of moves
// that tells it so is checked by TestDeletionCountsMoves. Under the race
// detector, it also checks that the reads are synchronised ones.)
func TestMatchWhileMoving(t *testing.T) {
	// Every block's home is in the first 64 of the table's 1,024 slots:
	// they form one run of hundreds, which a reader takes microseconds to
	// probe and every deletion in it moves blocks back along.
	const size = minPairSlots
	home := &blockArray{shift: uint(64 - bits.TrailingZeros(size))}
	next := uint64(0)
	clustered := func(n int) []uint64 {
		out := make([]uint64, 0, n)
		for ; len(out) < n; next++ {
			if home.home(next) < 64 {
				out = append(out, next)
			}
		}
		return out
	}
	ix := NewIndex(0)
	// A quarter of the slots of other blocks, churned one out one
	// in, and the prompt after them in the run: deletions in front of it
	// move its blocks back.
	const promptLen = 32
	churn := clustered(size / 4)
	for _, h := range churn {
		ix.blocks.add(h, 1)
	}
	p := clustered(promptLen)
	for _, h := range p {
		ix.blocks.add(h, 3)
	}
	fresh := clustered(1 << 16)
	never := clustered(8)
	// The writer churns until both readers have picked 200 times beside
	// it.
	var picked atomic.Int32
	started := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			<-started
			out := make([]int32, 4)
			for picks := 0; picks < 200; picks++ {
				ix.Match(p, out)
				if out[3] != int32(len(p)) {
					t.Errorf("reader %d, pick %d: the held prompt matched %d blocks, want %d", r, picks, out[3], len(p))
					break
				}
				ix.Match(never, out)
				if out[1] != 0 || out[3] != 0 {
					t.Errorf("reader %d, pick %d: blocks nobody holds matched %v", r, picks, out)
					break
				}
			}
			picked.Add(1)
		})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; picked.Load() < 2; i++ {
		k := rng.IntN(len(churn))
		ix.blocks.remove(churn[k], 1)
		churn[k] = fresh[i%len(fresh)]
		ix.blocks.add(churn[k], 1)
		if i == 0 {
			close(started)
		}
	}
	wg.Wait()
	if a := ix.blocks.arr.Load(); len(a.slots) != size || a.moves.Load() == 0 {
		t.Fatalf("the table has %d slots, %d moves: the churn did not run in one array, moving blocks", len(a.slots), a.moves.Load())
	}
	checkBlockSlots(t, &ix.blocks)
}

// TestDeletionCountsMoves: a deletion that moves any block still held to
// another slot does it inside one odd count of the array's moves, which
// is what tells a reader probing meanwhile to probe again (see
// blockTable); no deletion leaves the count odd.
func TestDeletionCountsMoves(t *testing.T) {
	ix := NewIndex(0)
	rng := rand.New(rand.NewPCG(9, 10))
	var held []uint64
	// Just under half of the table's first size: long runs.
	for len(held) < minPairSlots/2-1 {
		held = append(held, rng.Uint64())
		ix.blocks.add(held[len(held)-1], 0)
	}
	a := ix.blocks.arr.Load()
	// A block moved into a slot that held another before the deletion:
	// it adds none.
	before := make([]uint64, len(a.slots))
	movers := 0
	const steps = 1000
	for step := range steps {
		for k := range a.slots {
			before[k] = a.slots[k].hash.Load()
		}
		m0 := a.moves.Load()
		k := rng.IntN(len(held))
		ix.blocks.remove(held[k], 0)
		moved := false
		for k := range a.slots {
			moved = moved || !a.slots[k].empty() && a.slots[k].hash.Load() != before[k]
		}
		switch m1 := a.moves.Load(); {
		case m1 != m0 && m1 != m0+2:
			t.Fatalf("step %d: a deletion took the count of moves from %d to %d", step, m0, m1)
		case moved && m1 == m0:
			t.Fatalf("step %d: a deletion moved blocks without counting it", step)
		case moved:
			movers++
		}
		held[k] = rng.Uint64()
		ix.blocks.add(held[k], 0)
	}
	if a != ix.blocks.arr.Load() || movers < steps/10 {
		t.Fatalf("%d of %d deletions moved blocks in one array (%v): the test did not test", movers, steps, a == ix.blocks.arr.Load())
	}
	checkBlockSlots(t, &ix.blocks)
}
