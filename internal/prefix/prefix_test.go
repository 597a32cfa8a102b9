package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// hs returns the distinct fake hashes base+1..base+n: chain hashes stand in
// for prompts whose blocks differ from everyone else's.
func hs(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i) + 1
	}
	return out
}

func match(t *testing.T, ix *Index, hashes []uint64, backends int) []int32 {
	t.Helper()
	out := make([]int32, backends)
	for i := range out {
		out[i] = -7 // Match must overwrite stale values
	}
	ix.Match(hashes, out)
	return out
}

func TestHash(t *testing.T) {
	a := strings.Repeat("a", 64) + strings.Repeat("b", 64) + "tail"
	b := strings.Repeat("a", 64) + strings.Repeat("c", 64)
	c := strings.Repeat("b", 64) + strings.Repeat("b", 64)
	ha, hb, hc := Hash(nil, a, 64), Hash(nil, b, 64), Hash(nil, c, 64)
	if len(ha) != 2 || len(hb) != 2 {
		t.Fatalf("block counts %d, %d, want 2 (partial tail is not hashed)", len(ha), len(hb))
	}
	if ha[0] != hb[0] {
		t.Errorf("equal first blocks hash differently")
	}
	if ha[1] == hb[1] {
		t.Errorf("different second blocks hash equal")
	}
	if hc[1] == ha[1] {
		t.Errorf("equal second blocks under different parents hash equal: the chain is broken")
	}
	if got := Hash(ha[:0], a, 64); got[0] != ha[0] || got[1] != ha[1] {
		t.Errorf("Hash is not deterministic")
	}
	if got := Hash(nil, "short", 64); len(got) != 0 {
		t.Errorf("text shorter than a block gave %d hashes", len(got))
	}
}

func TestMatch(t *testing.T) {
	p := hs(0, 10)
	tests := []struct {
		name    string
		inserts map[int][]uint64
		query   []uint64
		want    []int32
	}{
		{"empty index", nil, p, []int32{0, 0, 0}},
		{"full match on one backend", map[int][]uint64{1: p}, p, []int32{0, 10, 0}},
		{"different depths", map[int][]uint64{0: p[:3], 1: p, 2: p[:7]}, p, []int32{3, 10, 7}},
		{"query shorter than held", map[int][]uint64{0: p}, p[:4], []int32{4, 0, 0}},
		{"hole in the chain stops the match", map[int][]uint64{0: append(append([]uint64{}, p[:2]...), p[3:]...)}, p, []int32{2, 0, 0}},
		{"not holding the first block matches nothing", map[int][]uint64{2: p[1:]}, p, []int32{0, 0, 0}},
		{"empty query", map[int][]uint64{0: p}, nil, []int32{0, 0, 0}},
		{"backend beyond out is ignored", map[int][]uint64{5: p, 0: p[:1]}, p, []int32{1, 0, 0}},
		{"wide backend beyond out is ignored", map[int][]uint64{70: p, 1: p[:1]}, p, []int32{0, 1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := NewIndex(100)
			for b, h := range tt.inserts {
				ix.Insert(b, h)
			}
			got := match(t, ix, tt.query, len(tt.want))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Match = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEviction(t *testing.T) {
	a, b := hs(0, 4), hs(100, 4)
	tests := []struct {
		name     string
		capacity int
		steps    func(ix *Index)
		query    []uint64
		want     int32
		wantLen  int
	}{
		{"under capacity keeps all", 8, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b) }, a, 4, 8},
		{"deepest blocks of a prompt go first", 6, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b) }, a, 2, 6},
		{"refresh protects the older prompt", 6, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b); ix.Insert(0, a) }, a, 4, 6},
		{"refresh moves the newer prompt out", 6, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b); ix.Insert(0, a) }, b, 2, 6},
		{"capacity shrink evicts", 8, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b); ix.SetCapacity(0, 3) }, b, 3, 3},
		{"capacity shrink evicts LRU prompt", 8, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, b); ix.SetCapacity(0, 3) }, a, 0, 3},
		{"capacity zero holds nothing", 0, func(ix *Index) { ix.Insert(0, a) }, a, 0, 0},
		{"reinsert counts once", 8, func(ix *Index) { ix.Insert(0, a); ix.Insert(0, a); ix.Insert(0, a[:2]) }, a, 4, 4},
		{"remove backend", 8, func(ix *Index) { ix.Insert(0, a); ix.RemoveBackend(0) }, a, 0, 0},
		{"capacity grow keeps all", 2, func(ix *Index) { ix.SetCapacity(0, 8); ix.Insert(0, a); ix.Insert(0, b) }, a, 4, 8},
		{"pinned blocks outlive newer inserts", 6, func(ix *Index) { ix.Acquire(0, a); ix.Insert(0, b); ix.Insert(0, hs(200, 4)) }, a, 4, 6},
		{"pinned blocks beyond capacity stay", 2, func(ix *Index) { ix.Acquire(0, a); ix.Insert(0, b) }, a, 4, 4},
		{"release makes the blocks most recent", 6, func(ix *Index) { ix.Acquire(0, a); ix.Insert(0, b); ix.Release(0, a); ix.Insert(0, hs(200, 2)) }, a, 4, 6},
		{"released blocks are evicted in turn", 6, func(ix *Index) { ix.Acquire(0, a); ix.Release(0, a); ix.Insert(0, b); ix.Insert(0, hs(200, 2)) }, a, 0, 6},
		{"two acquires need two releases", 4, func(ix *Index) {
			ix.Acquire(0, a)
			ix.Acquire(0, a)
			ix.Release(0, a)
			ix.Insert(0, b) // evicted at once: a is still pinned
		}, a, 4, 4},
		{"insert leaves a pin alone", 4, func(ix *Index) { ix.Acquire(0, a); ix.Insert(0, a); ix.Insert(0, b) }, a, 4, 4},
		{"remove backend drops pinned blocks", 8, func(ix *Index) { ix.Acquire(0, a); ix.RemoveBackend(0) }, a, 0, 0},
		{"release after removal is harmless", 8, func(ix *Index) { ix.Acquire(0, a); ix.RemoveBackend(0); ix.Release(0, a); ix.Insert(0, b) }, b, 4, 4},
		{"release of an unknown backend is harmless", 8, func(ix *Index) { ix.Release(5, a); ix.Insert(0, a) }, a, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := NewIndex(tt.capacity)
			tt.steps(ix)
			if got := match(t, ix, tt.query, 1)[0]; got != tt.want {
				t.Errorf("matched %d blocks, want %d", got, tt.want)
			}
			if got := ix.Len(0); got != tt.wantLen {
				t.Errorf("Len = %d, want %d", got, tt.wantLen)
			}
		})
	}
}

// TestSharedBlocks checks that evicting or removing one holder of a block
// leaves the other holders intact.
func TestMatchWide(t *testing.T) {
	p := hs(0, 10)
	ix := NewIndex(100)
	ix.Insert(3, p[:2])
	ix.Insert(63, p[:9])
	ix.Insert(64, p)
	ix.Insert(65, p[:5])
	ix.Insert(200, p[:7])
	out := match(t, ix, p, 201)
	want := map[int]int32{3: 2, 63: 9, 64: 10, 65: 5, 200: 7}
	for b, got := range out {
		if got != want[b] {
			t.Errorf("backend %d matched %d, want %d", b, got, want[b])
		}
	}
	short := match(t, ix, p, 65)
	if short[64] != 10 || short[63] != 9 {
		t.Errorf("with out of length 65: backend 63 %d, 64 %d, want 9 and 10", short[63], short[64])
	}
}

func TestSharedBlocks(t *testing.T) {
	p := hs(0, 5)
	ix := NewIndex(10)
	for b := range 4 {
		ix.Insert(b, p)
	}
	ix.RemoveBackend(1)
	ix.SetCapacity(2, 2)
	ix.SetCapacity(0, 4)
	got := match(t, ix, p, 4)
	if want := "[4 0 2 5]"; fmt.Sprint(got) != want {
		t.Fatalf("Match = %v, want %s", got, want)
	}
	// Everything freed is reused rather than leaked.
	ix.RemoveBackend(0)
	ix.RemoveBackend(2)
	ix.RemoveBackend(3)
	if ix.blocks.n != 0 {
		t.Errorf("%d map entries left after removing every backend", ix.blocks.n)
	}
	n := len(ix.nodes)
	ix.Insert(7, p)
	if len(ix.nodes) != n {
		t.Errorf("slab grew from %d to %d nodes with free nodes available", n, len(ix.nodes))
	}
	if got := match(t, ix, p, 8)[7]; got != 5 {
		t.Errorf("new backend matched %d, want 5", got)
	}
}

// TestRandomAgainstModel drives Insert, Acquire, Release, SetCapacity,
// Remove and RemoveBackend at random and compares every Match and Len with a direct
// model: per backend, a recency list of unpinned blocks and a pin count per
// pinned block, evicting the least recent unpinned block while the backend
// holds more than its capacity. Backends are tracked in the entries' holder
// mask (IDs below 64), beyond it, and both.
func TestRandomAgainstModel(t *testing.T) {
	for _, ids := range [][]int{{0, 1, 2, 3}, {64, 65, 100, 130}, {0, 5, 63, 64, 65, 127, 128}} {
		t.Run(fmt.Sprint(ids), func(t *testing.T) { randomAgainstModel(t, ids) })
	}
}

func randomAgainstModel(t *testing.T, ids []int) {
	const capacity = 10
	backends := ids[len(ids)-1] + 1
	rng := rand.New(rand.NewPCG(3, 4))
	ix := NewIndex(capacity)
	recent := make([][]uint64, backends) // most recent first
	pins := make([]map[uint64]int, backends)
	caps := make([]int, backends)
	for i := range pins {
		pins[i], caps[i] = map[uint64]int{}, capacity
	}
	without := func(l []uint64, h uint64) []uint64 {
		return slices.DeleteFunc(l, func(x uint64) bool { return x == h })
	}
	evict := func(b int) {
		for len(recent[b])+len(pins[b]) > caps[b] && len(recent[b]) > 0 {
			recent[b] = recent[b][:len(recent[b])-1]
		}
	}
	insert := func(b int, p []uint64, pin bool) {
		for i := len(p) - 1; i >= 0; i-- {
			h := p[i]
			if pins[b][h] > 0 {
				if pin {
					pins[b][h]++
				}
				continue
			}
			recent[b] = without(recent[b], h)
			if pin {
				pins[b][h] = 1
			} else {
				recent[b] = append([]uint64{h}, recent[b]...)
			}
		}
		evict(b)
	}
	release := func(b int, p []uint64) {
		for i := len(p) - 1; i >= 0; i-- {
			h := p[i]
			switch {
			case pins[b][h] > 1:
				pins[b][h]--
			case pins[b][h] == 1:
				delete(pins[b], h)
				recent[b] = append([]uint64{h}, recent[b]...)
			case contains(recent[b], h):
				recent[b] = append([]uint64{h}, without(recent[b], h)...)
			}
		}
		evict(b)
	}
	// Half the flights keep AcquireNodes' handles for ReleaseNodes; those
	// that outlive a RemoveBackend hold handles to freed or reused nodes.
	type flight struct {
		b     int
		p     []uint64
		nodes []int32
	}
	var inflight []flight
	prompts := make([][]uint64, 6)
	for i := range prompts {
		prompts[i] = hs(uint64(i)*1000, 1+rng.IntN(8))
	}
	for step := range 3000 {
		b := ids[rng.IntN(len(ids))]
		p := prompts[rng.IntN(len(prompts))]
		p = p[:1+rng.IntN(len(p))]
		switch r := rng.IntN(30); {
		case r == 0:
			ix.RemoveBackend(b)
			recent[b], pins[b] = nil, map[uint64]int{}
		case r == 1:
			caps[b] = rng.IntN(2 * capacity)
			ix.SetCapacity(b, caps[b])
			evict(b)
		case r == 2:
			// The engine reports evicting some blocks, pinned or not.
			gone := p[rng.IntN(len(p)):]
			ix.Remove(b, gone...)
			for _, h := range gone {
				delete(pins[b], h)
				recent[b] = without(recent[b], h)
			}
		case r < 10:
			var nodes []int32
			if step%2 == 0 {
				nodes = ix.AcquireNodes(b, p, nil)
			} else {
				ix.Acquire(b, p)
			}
			insert(b, p, true)
			inflight = append(inflight, flight{b, p, nodes})
		case r < 19 && len(inflight) > 0:
			k := rng.IntN(len(inflight))
			f := inflight[k]
			inflight = slices.Delete(inflight, k, k+1)
			if f.nodes != nil {
				ix.ReleaseNodes(f.b, f.p, f.nodes)
			} else {
				ix.Release(f.b, f.p)
			}
			release(f.b, f.p)
		default:
			ix.Insert(b, p)
			insert(b, p, false)
		}
		compareModel(t, ix, step, prompts[rng.IntN(len(prompts))], ids,
			func(b int, h uint64) bool { return pins[b][h] > 0 || contains(recent[b], h) },
			func(b int) int { return len(recent[b]) + len(pins[b]) })
	}
	checkInvariants(t, ix)
}

// compareModel checks Match of q and Len against a model's holds and size
// for every backend in ids, and the invariants every 50 steps.
func compareModel(t *testing.T, ix *Index, step int, q []uint64, ids []int, holds func(b int, h uint64) bool, size func(b int) int) {
	t.Helper()
	got := match(t, ix, q, ids[len(ids)-1]+1)
	for _, b := range ids {
		want := 0
		for want < len(q) && holds(b, q[want]) {
			want++
		}
		if int(got[b]) != want {
			t.Fatalf("step %d backend %d: matched %d, want %d", step, b, got[b], want)
		}
		if ix.Len(b) != size(b) {
			t.Fatalf("step %d backend %d: Len %d, want %d", step, b, ix.Len(b), size(b))
		}
	}
	if step%50 == 0 {
		checkInvariants(t, ix)
	}
}

func contains(s []uint64, h uint64) bool {
	for _, x := range s {
		if x == h {
			return true
		}
	}
	return false
}

func TestConcurrent(t *testing.T) {
	const backends = 8
	ix := NewIndex(200)
	shared := hs(0, 20)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			out := make([]int32, backends)
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 2000 {
				b := rng.IntN(backends)
				switch rng.IntN(10) {
				case 0:
					ix.RemoveBackend(b)
				case 1:
					ix.SetCapacity(b, 50+rng.IntN(200))
				case 2, 3, 4:
					ix.Insert(b, append(slices.Clip(shared[:rng.IntN(20)]), hs(uint64(g*1e6+i*100), 10)...))
				default:
					ix.Match(shared, out)
					for _, m := range out {
						if m < 0 || m > int32(len(shared)) {
							t.Errorf("match %d out of range", m)
							return
						}
					}
					_ = ix.Len(b)
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, ix)
	for b := range backends {
		if n := ix.Len(b); n > 250 {
			t.Errorf("backend %d holds %d blocks, above any capacity it had", b, n)
		}
	}
}

// hashStreaming is the reference definition of Hash: block i's hash is
// the xxhash of the whole text up to the end of block i, hashed afresh.
func hashStreaming(text string, blockChars int) []uint64 {
	var dst []uint64
	for end := blockChars; end <= len(text); end += blockChars {
		dst = append(dst, xxhash.Sum64String(text[:end]))
	}
	return dst
}

func TestHashMatchesReference(t *testing.T) {
	text := strings.Repeat("the quick brown fox jumps over the lazy dog; ", 200)
	for _, bc := range []int{1, 7, 16, 64, 100, 256, 257, 1000} {
		got, want := Hash(nil, text, bc), hashStreaming(text, bc)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("blockChars %d: Hash differs from the streaming reference", bc)
		}
	}
	if got := Hash([]uint64{42}, "x", 0); len(got) != 1 {
		t.Errorf("blockChars 0 appended %d hashes", len(got)-1)
	}
}

// checkInvariants verifies the index's internal tables against its lists:
// every held node is found through the pair table and is on the recency
// list exactly when it has no pins, every block's holder words and count
// agree with the nodes, and nothing else is left in either table.
func checkInvariants(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	want := map[uint64]map[int]uint64{} // block -> holder word -> bits
	total := 0
	for b := range ix.backends {
		l := &ix.backends[b]
		if int(l.id) != b {
			t.Fatalf("backend %d: list says it is %d", b, l.id)
		}
		// Every unpinned node has exactly one live entry in the log, and
		// live entries are in stamp order.
		liveSeen := map[int32]bool{}
		var last uint32
		for _, tc := range l.log[l.head:] {
			if !ix.live(l, tc) {
				continue
			}
			if liveSeen[tc.node] || tc.stamp <= last {
				t.Fatalf("backend %d: live log entry %+v repeated or out of order", b, tc)
			}
			liveSeen[tc.node], last = true, tc.stamp
		}
		count, unpinned := 0, 0
		for n, nd := range ix.nodes {
			if int(nd.backend) != b {
				continue
			}
			if nd.pins < 0 {
				t.Fatalf("backend %d: node %d with %d pins", b, n, nd.pins)
			}
			if nd.pins == 0 {
				unpinned++
				if !liveSeen[int32(n)] {
					t.Fatalf("backend %d: unpinned node %d has no live log entry", b, n)
				}
			}
			if got := ix.pairs.find(ix.nodes, nd.hash, nd.backend); got != int32(n) {
				t.Fatalf("backend %d: pair table finds %d for node %d", b, got, n)
			}
			if want[nd.hash] == nil {
				want[nd.hash] = map[int]uint64{}
			}
			want[nd.hash][b/64] |= 1 << (b % 64)
			count++
		}
		if count != l.n || unpinned != l.unpinned || len(liveSeen) != unpinned {
			t.Fatalf("backend %d: slab holds %d nodes (%d unpinned, %d live log entries), recorded %d (%d)", b, count, unpinned, len(liveSeen), l.n, l.unpinned)
		}
		total += count
	}
	if ix.pairs.n != total {
		t.Fatalf("pair table holds %d, lists hold %d", ix.pairs.n, total)
	}
	if ix.blocks.n != len(want) {
		t.Fatalf("block map has %d entries, want %d", ix.blocks.n, len(want))
	}
	checkBlockSlots(t, &ix.blocks)
	a := ix.blocks.arr.Load()
	for h, e := range want {
		all, got := make([]uint64, a.words), make([]uint64, a.words)
		for w := range all {
			all[w] = ^uint64(0)
		}
		a.read(h, all, got)
		n := 0
		for w, bits := range got {
			if bits != e[w] {
				t.Fatalf("block %x: holder word %d is %x, want %x", h, w, bits, e[w])
			}
			n += popcount(bits)
		}
		if sl := &a.slots[a.find(h)]; int(sl.holders) != n {
			t.Fatalf("block %x: %d holders counted, %d in its words", h, sl.holders, n)
		}
	}
}

// TestChurn fills, evicts and removes tens of thousands of blocks, enough
// to grow the pair table several times and shift-delete through long runs,
// and then checks every invariant and every match against what was inserted
// last.
func TestChurn(t *testing.T) {
	ix := NewIndex(3000)
	rng := rand.New(rand.NewPCG(5, 6))
	ids := []int{0, 1, 2, 40, 63, 64, 65, 99}
	for i := range 400 {
		b := ids[rng.IntN(len(ids))]
		switch rng.IntN(25) {
		case 0:
			ix.RemoveBackend(b)
		case 1:
			ix.SetCapacity(b, 500+rng.IntN(4000))
		default:
			// Shared prefixes (a few system prompts) plus unique tails.
			p := hs(uint64(rng.IntN(4))<<40, 30)
			ix.Insert(b, append(p, hs(uint64(i+1)<<20, 100+rng.IntN(300))...))
		}
	}
	checkInvariants(t, ix)
	for _, b := range ids {
		p := append(hs(1<<40, 30), hs(1<<50, 10)...)
		ix.Insert(b, p)
		out := make([]int32, 100)
		ix.Match(p, out)
		if out[b] != 40 {
			t.Errorf("backend %d matched %d of a prompt it was just given, want 40", b, out[b])
		}
	}
	checkInvariants(t, ix)
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}
