package prefix

import (
	"math/bits"
	"runtime"
	"sync/atomic"
)

// Match sets out[b] to the number of leading blocks of hashes that backend
// b holds, for every b < len(out) (0 for a backend that holds none). It does
// not change recency, takes no lock and never waits for a writer (see
// Index), and allocates nothing for fleets of up to 64*stackWords backends.
func (ix *Index) Match(hashes []uint64, out []int32) {
	clear(out)
	a := ix.blocks.arr.Load()
	if a == nil || len(out) == 0 {
		return
	}
	// Backends past the array's words hold none of its blocks: their 0
	// stands.
	out = out[:min(len(out), 64*a.words)]
	if len(out) <= 64 {
		a.match1(hashes, out)
		return
	}
	a.matchWide(hashes, out)
}

// match1 is Match for up to 64 backends: one word per block, the probe
// written out (called, it costs Match a quarter more). A probe that a
// deletion's moves may have crossed (see blockTable) is done again by read.
func (a *blockArray) match1(hashes []uint64, out []int32) {
	slots := len(a.slots) - 1
	// alive is the set of backends that hold every block so far; a
	// backend leaving it at block i held exactly i blocks.
	alive := ^uint64(0)
	if len(out) < 64 {
		alive = 1<<len(out) - 1
	}
	moves := a.moves.Load()
	i := 0
	for ; i < len(hashes); i++ {
		h := hashes[i]
		var m uint64
		torn := false
		for j := a.home(h); ; j = (j + 1) & slots {
			sl := &a.slots[j]
			v := sl.ver.Load()
			if v&verUsed == 0 {
				break
			}
			if sl.hash.Load() == h {
				m = sl.mask.Load()
				torn = sl.ver.Load() != v
				break
			}
		}
		if torn || moves&1 != 0 || a.moves.Load() != moves {
			want, w := [1]uint64{^uint64(0)}, [1]uint64{}
			a.read(h, want[:], w[:])
			m = w[0]
			moves = a.moves.Load()
		}
		for gone := alive &^ m; gone != 0; gone &= gone - 1 {
			out[bits.TrailingZeros64(gone)] = int32(i)
		}
		if alive &= m; alive == 0 {
			return
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[bits.TrailingZeros64(alive)] = int32(i)
	}
}

// stackWords is the number of holder words Match keeps on the stack: fleets
// of up to 2,048 backends match without allocating.
const stackWords = 32

// matchWide is Match for more than 64 backends: per block, only the words
// of backends that held every block so far are read.
func (a *blockArray) matchWide(hashes []uint64, out []int32) {
	nw := (len(out) + 63) / 64
	var buf [2 * stackWords]uint64
	alive, m := buf[:nw], buf[stackWords:stackWords+nw]
	if nw > stackWords {
		alive, m = make([]uint64, nw), make([]uint64, nw)
	}
	for w := range alive {
		alive[w] = ^uint64(0)
	}
	if r := len(out) % 64; r != 0 {
		alive[nw-1] = 1<<r - 1
	}
	live := nw // words of alive with a bit set
	i := 0
	for ; i < len(hashes); i++ {
		a.read(hashes[i], alive, m)
		for w, al := range alive {
			if al == 0 {
				continue
			}
			for gone := al &^ m[w]; gone != 0; gone &= gone - 1 {
				out[64*w+bits.TrailingZeros64(gone)] = int32(i)
			}
			if alive[w] = al & m[w]; alive[w] == 0 {
				live--
			}
		}
		if live == 0 {
			return
		}
	}
	for w, al := range alive {
		for ; al != 0; al &= al - 1 {
			out[64*w+bits.TrailingZeros64(al)] = int32(i)
		}
	}
}

// read sets m[w] to h's holder word w for every w with want[w] != 0, and
// to 0 for the others and when h has no slot. It takes no lock. A torn
// read (h's slot rewritten as it was read, or blocks moved while it
// probed) is tried again: the writer is a few stores from done, unless it
// was descheduled in between, so after a few tries it is let run.
func (a *blockArray) read(h uint64, want, m []uint64) {
	for tries := 0; ; tries++ {
		if tries > 8 {
			runtime.Gosched()
		}
		moves := a.moves.Load()
		if moves&1 != 0 {
			continue
		}
		if !a.try(h, want, m) && a.moves.Load() == moves {
			return
		}
	}
}

// try is read's one probe; it reports a torn read: h's slot was being
// rewritten as it was read (see blockTable), and the read must be tried
// again. The caller checks for moves.
func (a *blockArray) try(h uint64, want, m []uint64) (torn bool) {
	mask := len(a.slots) - 1
	for i := a.home(h); ; i = (i + 1) & mask {
		sl := &a.slots[i]
		v := sl.ver.Load()
		if v&verUsed == 0 {
			// A slot whose hash is not h may be changing to h, but h had
			// no slot then: it was not held as the read began.
			clear(m)
			return false
		}
		if sl.hash.Load() != h {
			continue
		}
		hi := a.hi[i*(a.words-1):]
		for w := range m {
			switch {
			case want[w] == 0:
				m[w] = 0
			case w == 0:
				m[w] = sl.mask.Load()
			default:
				m[w] = hi[w-1].Load()
			}
		}
		return sl.ver.Load() != v
	}
}

// blockTable is the block map: each block's hash and its holders, in
// open addressing with linear probing. It is the one part of the index that
// Match reads, and Match reads it without any lock (see Index):
//
//   - A block that loses its last holder is deleted at once, and the
//     blocks after it in its run whose probe passed its slot are moved
//     back (Knuth's algorithm R, as pairTable does), so that the table
//     never fills with tombstones and never has to be copied to be rid of
//     them. A reader probing while blocks move could miss one moved behind
//     it, so the moves of one deletion happen inside an odd count of the
//     array's moves (a seqlock over the whole array, for moves only): a
//     reader whose probe saw moves change, or odd, probes again. A
//     deletion with nothing to move (the slot after it empty) only empties
//     the slot: no probe crosses it to a block after it.
//   - A slot that changes in place, filled or emptied, changes inside its
//     own version (a seqlock per slot, whose count only goes up, see
//     blockSlot): a reader that saw it change reads the slot again.
//     Holders change with atomic stores.
//   - The table grows (or takes more holder words for a backend past
//     them) into a new array, published atomically once complete: a
//     reader still on the old one reads a picture a few writes old, never
//     a torn one. At most half its slots are used, so it grows only while
//     the blocks held grow: an index at its capacity, evicting as much as
//     it inserts, never copies it.
//
// A block's holders are a bitset of words backends: word 0 in its slot,
// which is all a fleet of up to 64 reads, and the others side by side in
// the array's hi. It replaces a map[uint64]entry: inserting a new block
// took a lookup and an assignment there, and Match's lookups were a tenth
// of the simulator's routing.
//
// Deleting with tombstones, as the table once did, left a table at its
// capacity to fill with them and be copied whole, at the same size, every
// few hundred 220 KB requests (every 340 at 8 backends of 100,000 blocks):
// the request that found it due paid for the copy, most of it the page
// faults of a fresh 48 MB array (0.5-0.7 s of CPU on a loaded 2-core
// machine). Moving blocks back was chosen over the other ways out:
// emptying only the tombstones at the end of a run (safe without moves)
// slowed the creep of used slots but did not stop it (0.73 of the table
// after 3,000 requests, every probe longer for it), so the copy still
// came; copying incrementally (readers on the old array while each write
// fills the new one a few slots further) would bound the copy's work per
// write but not the fresh array's page faults, which scattered slots touch
// within a few thousand writes of the start; and a table twice the size
// (at most a quarter live after a copy) would copy a third as often but
// twice as much each time, with 96 MB instead of 48. Moves cost a
// deletion a few stores, and a reader one more load per block.
// docs/benchmarks.md, "The Endpoint Picker".
type blockTable struct {
	arr atomic.Pointer[blockArray]
	n   int // slots used: blocks with a holder
}

// blockArray is one generation of the table's slots.
type blockArray struct {
	slots []blockSlot // len is a power of two
	shift uint        // 64 - log2(len(slots)): home = mixed hash >> shift
	// words is the holder words per block: backends 0..64*words-1 may
	// hold blocks in this array. hi holds words 1.. of slot i at
	// hi[i*(words-1):(i+1)*(words-1)].
	words int
	hi    []atomic.Uint64
	// moves counts the deletions that moved blocks, twice each: odd while
	// one is moving them. It has a cache line of its own, which the
	// writer alone writes.
	_     [64]byte
	moves atomic.Uint32
	_     [60]byte
}

// blockSlot is one slot. Its ver counts the slot's changes in place, 2
// each, filled (empty to used) or emptied, so that ver&verUsed says
// whether it is used (empty: the end of a probe): a reader that saw the
// same ver before and after reading a used slot read one picture of it,
// even across the slot being emptied and filled again in between. The
// blocks a deletion moves from slot to slot leave ver alone: the array's
// count of moves covers them.
type blockSlot struct {
	hash atomic.Uint64
	// mask has bit b set when backend b < 64 holds the block.
	mask atomic.Uint64
	// holders counts the backends that hold the block. Only writers,
	// under the write lock, read or write it: a plain field.
	holders int32
	ver     atomic.Uint32
}

// verUsed is the bit of a slot's ver set while it is used.
const verUsed = 2

// empty reports whether the slot ends a probe.
func (sl *blockSlot) empty() bool { return sl.ver.Load()&verUsed == 0 }

// home is h's first slot. Block hashes are uniform already, but tests and
// callers may pass plain numbers; the multiply spreads any key.
func (a *blockArray) home(h uint64) int {
	return int(((h ^ h>>31) * 0xbf58476d1ce4e5b9) >> a.shift)
}

// word is backend b's holder word in slot i.
func (a *blockArray) word(i, b int) *atomic.Uint64 {
	if b < 64 {
		return &a.slots[i].mask
	}
	return &a.hi[i*(a.words-1)+b/64-1]
}

// find returns h's slot index, -1 if h has none. The caller holds the
// write lock.
func (a *blockArray) find(h uint64) int {
	mask := len(a.slots) - 1
	for i := a.home(h); ; i = (i + 1) & mask {
		sl := &a.slots[i]
		if sl.empty() {
			return -1
		}
		if sl.hash.Load() == h {
			return i
		}
	}
}

// add records that backend holds h. The caller holds the write lock.
func (t *blockTable) add(h uint64, backend int) {
	a, i := t.upsert(h, backend/64+1)
	a.word(i, backend).Or(1 << (backend % 64))
	a.slots[i].holders++
}

// remove records that backend no longer holds h, which it held, deleting
// h when that was its last holder. The caller holds the write lock.
func (t *blockTable) remove(h uint64, backend int) {
	a := t.arr.Load()
	i := a.find(h)
	a.word(i, backend).And(^(uint64(1) << (backend % 64)))
	if a.slots[i].holders--; a.slots[i].holders == 0 {
		t.n--
		a.delete(i)
	}
}

// delete empties slot i, whose block has no holder left, moving back the
// blocks after it in its run that would no longer be found past an empty
// slot, inside an odd count of moves (see blockTable). The caller holds
// the write lock.
func (a *blockArray) delete(i int) {
	mask := len(a.slots) - 1
	if !a.slots[(i+1)&mask].empty() {
		a.moves.Add(1)
		defer a.moves.Add(1)
		for j := (i + 1) & mask; !a.slots[j].empty(); j = (j + 1) & mask {
			// The block in j stays unless its home is cyclically in
			// (i, j]: a probe from it would not reach j past an empty i.
			if k := a.home(a.slots[j].hash.Load()); (j-k)&mask >= (j-i)&mask {
				a.move(j, i)
				i = j
			}
		}
	}
	sl := &a.slots[i]
	sl.ver.Add(verUsed) // empty
	sl.mask.Store(0)
	sl.holders = 0
	for w := range a.words - 1 {
		a.hi[i*(a.words-1)+w].Store(0)
	}
}

// move copies used slot j's block into used slot i, whose block is gone
// or moved. It leaves i's version alone: the caller holds the count of
// moves odd, which every reader checks.
func (a *blockArray) move(j, i int) {
	src, dst := &a.slots[j], &a.slots[i]
	dst.hash.Store(src.hash.Load())
	dst.mask.Store(src.mask.Load())
	dst.holders = src.holders
	for w := range a.words - 1 {
		a.hi[i*(a.words-1)+w].Store(a.hi[j*(a.words-1)+w].Load())
	}
}

// upsert returns the array and h's slot in it to add a holder to, giving
// h the empty slot that ends its probe if it has none, in an array of at
// least words holder words. The caller holds the write lock and must give
// the slot a holder.
func (t *blockTable) upsert(h uint64, words int) (*blockArray, int) {
	a := t.arr.Load()
	if a == nil || 2*(t.n+1) > len(a.slots) || a.words < words {
		// Words double, so that a fleet growing to n backends rebuilds
		// for them log2(n/64) times, not n/64.
		a = t.rebuild(1 << bits.Len(uint(words-1)))
	}
	mask := len(a.slots) - 1
	i := a.home(h)
	for ; !a.slots[i].empty(); i = (i + 1) & mask {
		if a.slots[i].hash.Load() == h {
			return a, i
		}
	}
	t.n++
	sl := &a.slots[i]
	sl.hash.Store(h)
	sl.ver.Add(verUsed) // used
	return a, i
}

// rebuild copies the used slots into a new array, twice the size if more
// than half of the current one would be used, else the same size, with at
// least words holder words, and publishes it. The caller holds the write
// lock.
func (t *blockTable) rebuild(words int) *blockArray {
	size := minPairSlots
	old := t.arr.Load()
	if old != nil {
		size = len(old.slots)
		words = max(words, old.words)
	}
	for 2*(t.n+1) > size {
		size *= 2
	}
	a := &blockArray{slots: make([]blockSlot, size), shift: uint(64 - bits.TrailingZeros(uint(size))),
		words: words, hi: make([]atomic.Uint64, size*(words-1))}
	mask := size - 1
	if old != nil {
		for k := range old.slots {
			sl := &old.slots[k]
			if sl.empty() {
				continue
			}
			h := sl.hash.Load()
			i := a.home(h)
			for !a.slots[i].empty() {
				i = (i + 1) & mask
			}
			d := &a.slots[i]
			d.hash.Store(h)
			d.mask.Store(sl.mask.Load())
			d.holders = sl.holders
			d.ver.Store(verUsed)
			for w := 1; w < old.words; w++ {
				a.hi[i*(words-1)+w-1].Store(old.hi[k*(old.words-1)+w-1].Load())
			}
		}
	}
	t.arr.Store(a)
	return a
}
