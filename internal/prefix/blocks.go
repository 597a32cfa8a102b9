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

// match1 is Match for up to 64 backends: one word per block, the first
// probe written out (called, it costs Match a quarter more).
func (a *blockArray) match1(hashes []uint64, out []int32) {
	slots := len(a.slots) - 1
	// alive is the set of backends that hold every block so far; a
	// backend leaving it at block i held exactly i blocks.
	alive := ^uint64(0)
	if len(out) < 64 {
		alive = 1<<len(out) - 1
	}
	i := 0
	for ; i < len(hashes); i++ {
		h := hashes[i]
		var m uint64
		for j := a.home(h); ; j = (j + 1) & slots {
			sl := &a.slots[j]
			v := sl.ver.Load()
			if v == 0 {
				break
			}
			if sl.hash.Load() == h {
				m = sl.mask.Load()
				if v&1 != 0 || sl.ver.Load() != v {
					want, w := [1]uint64{^uint64(0)}, [1]uint64{}
					a.read(h, want[:], w[:])
					m = w[0]
				}
				break
			}
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
// to 0 for the others and when h has no slot. It takes no
// lock. A torn read is tried again: the writer is three stores from done,
// unless it was descheduled in between, so after a few tries it is let
// run.
func (a *blockArray) read(h uint64, want, m []uint64) {
	for tries := 0; ; tries++ {
		if tries > 8 {
			runtime.Gosched()
		}
		if !a.try(h, want, m) {
			return
		}
	}
}

// try is read's one try; it reports a torn read: h's slot was being
// rewritten as it was read (see blockTable), and the read must be tried
// again.
func (a *blockArray) try(h uint64, want, m []uint64) (torn bool) {
	mask := len(a.slots) - 1
	for i := a.home(h); ; i = (i + 1) & mask {
		sl := &a.slots[i]
		v := sl.ver.Load()
		if v == 0 {
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
		return v&1 != 0 || sl.ver.Load() != v
	}
}

// blockTable is the block map: each block's hash and its holders, in
// open addressing with linear probing. It is the one part of the index that
// Match reads, and Match reads it without any lock (see Index), so slots
// never move while a reader may be on them:
//
//   - A block that loses its last holder leaves a tombstone (a used slot
//     with no holder) rather than shifting the slots after it back, which
//     a reader probing past them could miss. The block finds its own
//     tombstone if it comes back; a new block takes the first tombstone on
//     its probe path, so that churn does not fill the table.
//   - Holders change with atomic stores. A slot's hash changes only when a
//     tombstone is taken, and then inside a version bump (a seqlock per
//     slot): a reader that saw the version change reads the slot again.
//   - The table grows (or, when mostly tombstones, is rebuilt at its size,
//     or with more holder words for a backend past them) into a new
//     array, published atomically once complete: a reader still on the
//     old one reads a picture a few writes old, never a torn one.
//
// A block's holders are a bitset of words backends: word 0 in its slot,
// which is all a fleet of up to 64 reads, and the others side by side in
// the array's hi. Used slots, tombstones included, stay under three
// quarters. It replaces a map[uint64]entry: inserting a new block took a
// lookup and an assignment there, and Match's lookups were a tenth of the
// simulator's routing.
type blockTable struct {
	arr  atomic.Pointer[blockArray]
	n    int // slots with a holder
	used int // slots used in the current array, tombstones included
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
}

// blockSlot is one slot. ver is 0 while the slot was never used (the end
// of a probe), odd while its hash is being changed.
type blockSlot struct {
	hash atomic.Uint64
	// mask has bit b set when backend b < 64 holds the block.
	mask atomic.Uint64
	// holders counts the backends that hold the block (0: a tombstone).
	// Only writers read it.
	holders atomic.Int32
	ver     atomic.Uint32
}

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
		if sl.ver.Load() == 0 {
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
	a.slots[i].holders.Add(1)
}

// remove records that backend no longer holds h, which it held. The
// caller holds the write lock.
func (t *blockTable) remove(h uint64, backend int) {
	a := t.arr.Load()
	i := a.find(h)
	a.word(i, backend).And(^(uint64(1) << (backend % 64)))
	if a.slots[i].holders.Add(-1) == 0 {
		t.n-- // a tombstone now
	}
}

// upsert returns the array and h's slot in it to add a holder to, giving
// h a slot if it has none (its own tombstone, else the first tombstone on
// its probe path, else the empty slot that ends it), in an array of at
// least words holder words. The caller holds the write lock and must give
// the slot a holder.
func (t *blockTable) upsert(h uint64, words int) (*blockArray, int) {
	a := t.arr.Load()
	if a == nil || 4*(t.used+1) > 3*len(a.slots) || a.words < words {
		// Words double, so that a fleet growing to n backends rebuilds
		// for them log2(n/64) times, not n/64.
		a = t.rebuild(1 << bits.Len(uint(words-1)))
	}
	mask := len(a.slots) - 1
	tomb := -1
	i := a.home(h)
	for ; a.slots[i].ver.Load() != 0; i = (i + 1) & mask {
		sl := &a.slots[i]
		empty := sl.holders.Load() == 0
		if sl.hash.Load() == h {
			if empty {
				t.n++
			}
			return a, i
		}
		if empty && tomb < 0 {
			tomb = i
		}
	}
	t.n++
	if tomb >= 0 {
		sl := &a.slots[tomb]
		sl.ver.Add(1)
		sl.hash.Store(h)
		sl.ver.Add(1)
		return a, tomb
	}
	sl := &a.slots[i]
	sl.hash.Store(h)
	sl.ver.Store(2)
	t.used++
	return a, i
}

// rebuild copies the live slots into a new array, twice the size if more
// than half of the current one is live, else the same size, with at least
// words holder words, and publishes it. The caller holds the write lock.
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
			if sl.holders.Load() == 0 {
				continue
			}
			h := sl.hash.Load()
			i := a.home(h)
			for a.slots[i].ver.Load() != 0 {
				i = (i + 1) & mask
			}
			d := &a.slots[i]
			d.hash.Store(h)
			d.mask.Store(sl.mask.Load())
			d.holders.Store(sl.holders.Load())
			d.ver.Store(2)
			for w := 1; w < old.words; w++ {
				a.hi[i*(words-1)+w-1].Store(old.hi[k*(old.words-1)+w-1].Load())
			}
		}
	}
	t.used = t.n
	t.arr.Store(a)
	return a
}
