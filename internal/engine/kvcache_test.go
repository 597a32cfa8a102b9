package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The hash index against a map, with hashes crowded into a few home slots
// so that probe runs wrap around the table and deletions shift entries.
func TestKVCacheIndexMatchesMap(t *testing.T) {
	c := newKVCache(8) // 16 slots
	rng := rand.New(rand.NewPCG(5, 6))
	want := map[uint64]int32{}
	owner := map[int32]uint64{}
	for step := range 20000 {
		b := int32(rng.IntN(8))
		if h, ok := owner[b]; ok && rng.IntN(2) == 0 {
			c.unregister(b)
			delete(want, h)
			delete(owner, b)
		} else if !ok {
			// Home slots 14, 15 and 0 only; the upper bits tell hashes apart.
			h := uint64(rng.IntN(40))<<8 | uint64([]int{14, 15, 0}[rng.IntN(3)])
			c.register(b, h)
			if _, dup := want[h]; !dup {
				want[h] = b
				owner[b] = h
			}
		}
		for h := uint64(0); h < 40<<8; h += 1 << 8 {
			for _, home := range []uint64{14, 15, 0} {
				got, ok := c.lookup(h | home)
				wb, wok := want[h|home]
				if ok != wok || (ok && got != wb) {
					t.Fatalf("step %d: lookup(%#x) = %d %v, want %d %v", step, h|home, got, ok, wb, wok)
				}
			}
		}
	}
}

// The free list hands out blocks least recently freed first, and a cached
// block taken back by a hit leaves the list.
func TestKVCacheFreeList(t *testing.T) {
	c := newKVCache(4)
	a, b := c.alloc(), c.alloc()
	if a != 0 || b != 1 || c.free != 2 {
		t.Fatalf("alloc %d %d free %d", a, b, c.free)
	}
	c.register(a, 100)
	c.release([]int32{a, b}) // tail first: b then a
	// Order from the eviction end: 2 3 1 0.
	c.acquire(a) // a hit on block 0 takes it out of the list
	var got []int32
	for c.free > 0 {
		got = append(got, c.alloc())
	}
	if len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 1 {
		t.Errorf("eviction order %v, want [2 3 1]", got)
	}
	if bl, ok := c.lookup(100); !ok || bl != 0 || c.ref[0] != 1 {
		t.Errorf("acquired block lost its hash: %d %v ref %d", bl, ok, c.ref[0])
	}
}

// The free list as New makes it lazily (blocks never used counted, not
// linked) against the list built eagerly, block by block: every sequence
// of allocations, releases and hits takes the same blocks in the same order.
func TestKVCacheFreshBlocksMatchEagerList(t *testing.T) {
	const n = 16
	c := newKVCache(n)
	// The reference: blocks 0..n-1 linked in order, as New once did.
	ref := &kvCache{ref: make([]int32, n), hash: make([]uint64, n), hashed: make([]bool, n),
		prev: make([]int32, n+1), next: make([]int32, n+1), fresh: n}
	ref.index, ref.mask = make([]int32, 2*n), 2*n-1
	ref.prev[n], ref.next[n] = n, n
	for b := range int32(n) {
		ref.pushBack(b)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var held, refHeld [][]int32
	for step := range 5000 {
		switch op := rng.IntN(3); {
		case op == 0 && c.free > 0:
			k := 1 + rng.IntN(c.free)
			var got, want []int32
			for range k {
				b, rb := c.alloc(), ref.alloc()
				h := uint64(rng.IntN(64))
				c.register(b, h)
				ref.register(rb, h)
				got, want = append(got, b), append(want, rb)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d: alloc %v, eager list %v", step, got, want)
			}
			held, refHeld = append(held, got), append(refHeld, want)
		case op == 1 && len(held) > 0:
			i := rng.IntN(len(held))
			c.release(held[i])
			ref.release(refHeld[i])
			held, refHeld = append(held[:i], held[i+1:]...), append(refHeld[:i], refHeld[i+1:]...)
		default:
			h := uint64(rng.IntN(64))
			b, ok := c.lookup(h)
			rb, rok := ref.lookup(h)
			if b != rb || ok != rok {
				t.Fatalf("step %d: lookup(%d) = %d %v, eager list %d %v", step, h, b, ok, rb, rok)
			}
			if ok {
				c.acquire(b)
				ref.acquire(rb)
				held, refHeld = append(held, []int32{b}), append(refHeld, []int32{rb})
			}
		}
		if c.free != ref.free {
			t.Fatalf("step %d: %d free, eager list %d", step, c.free, ref.free)
		}
	}
}
