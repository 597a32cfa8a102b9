package engine

// kvCache is the paged KV cache with automatic prefix caching, after vLLM
// v1's BlockPool: a fixed array of blocks addressed by int32 ids, a
// reference count per block, an index from block hash to the block that
// holds it, and an intrusive doubly linked free list of unreferenced blocks
// in eviction order (head = least recently freed = evicted first). A freed
// block keeps its hash and stays findable until it is taken from the head
// of the free list for new data; only then is its hash dropped. This is
// what makes an idle engine's cache a true LRU of prefixes.
//
// Blocks never used yet stand, in id order, before every linked one: they
// are the free list's head as New made it (blocks 0..n-1), and every block
// freed since went to the other end. They are not linked but counted from
// fresh, and an empty index slot is 0, so that a new cache writes nothing
// per block: a simulated fleet of 64 engines of tens of thousands of blocks
// each, once per policy, spent a tenth of a run setting up lists and slots
// most of which a short run never touched.
type kvCache struct {
	ref    []int32  // references by running requests; 0 = in the free list
	hash   []uint64 // valid when hashed[b]
	hashed []bool
	// prev and next link the free list's used blocks; index n is the
	// sentinel.
	prev, next []int32
	free       int   // blocks in the free list (hashed or not, fresh or not)
	fresh      int32 // blocks fresh..n-1 have never been allocated
	// index is an open-addressing hash table (linear probing) of block ids
	// keyed by hash[b], each stored plus one: 0 is an empty slot. Block
	// hashes are already uniform, so their low bits are the slot. At most
	// one hash per block and twice as many slots as blocks keep probes
	// short. It replaces a map[uint64]int32, which cost a third of the
	// engine's time in BenchmarkEngine, and stores 4 bytes per slot instead
	// of 12.
	index []int32
	mask  uint64
}

func newKVCache(n int) *kvCache {
	c := &kvCache{
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		hashed: make([]bool, n),
		prev:   make([]int32, n+1),
		next:   make([]int32, n+1),
	}
	slots := 1
	for slots < 2*n {
		slots <<= 1
	}
	c.index = make([]int32, slots)
	c.mask = uint64(slots - 1)
	s := int32(n)
	c.prev[s], c.next[s] = s, s
	c.free = n
	return c
}

func (c *kvCache) sentinel() int32 { return int32(len(c.ref)) }

// pushBack appends b at the most recently freed end of the free list.
func (c *kvCache) pushBack(b int32) {
	s := c.sentinel()
	last := c.prev[s]
	c.next[last], c.prev[b] = b, last
	c.next[b], c.prev[s] = s, b
	c.free++
}

// unlink removes b from the free list.
func (c *kvCache) unlink(b int32) {
	p, n := c.prev[b], c.next[b]
	c.next[p], c.prev[n] = n, p
	c.free--
}

// alloc takes the least recently freed block for new data, evicting the
// prefix it held: a block never used while there is one, in id order. The
// caller has checked that c.free > 0.
func (c *kvCache) alloc() int32 {
	if b := c.fresh; int(b) < len(c.ref) {
		c.fresh++
		c.free--
		c.ref[b] = 1
		return b
	}
	b := c.next[c.sentinel()]
	c.unlink(b)
	c.unregister(b)
	c.ref[b] = 1
	return b
}

// lookup returns the block holding hash h, if any.
func (c *kvCache) lookup(h uint64) (int32, bool) {
	for i := h & c.mask; ; i = (i + 1) & c.mask {
		b := c.index[i] - 1
		if b < 0 {
			return -1, false
		}
		if c.hash[b] == h {
			return b, true
		}
	}
}

// acquire adds a reference to a cached block found by lookup, taking it out
// of the free list if nobody referenced it.
func (c *kvCache) acquire(b int32) {
	if c.ref[b] == 0 {
		c.unlink(b)
	}
	c.ref[b]++
}

// register makes b findable under h once its tokens are computed and
// reports whether it did. When another block already holds h (two requests
// computed the same prefix concurrently) the first one stays the cached
// copy and b stays anonymous, so that a hash maps to exactly one block.
func (c *kvCache) register(b int32, h uint64) bool {
	i := h & c.mask
	for ; c.index[i] != 0; i = (i + 1) & c.mask {
		if c.hash[c.index[i]-1] == h {
			return false
		}
	}
	c.index[i] = b + 1
	c.hash[b] = h
	c.hashed[b] = true
	return true
}

// evictee returns the hash the next alloc evicts, if it evicts one.
func (c *kvCache) evictee() (uint64, bool) {
	if int(c.fresh) < len(c.ref) || c.free == 0 {
		return 0, false
	}
	b := c.next[c.sentinel()]
	return c.hash[b], c.hashed[b]
}

// reset drops every block's hash: no block is findable any more, and
// referenced blocks stay with their requests as anonymous blocks.
func (c *kvCache) reset() {
	clear(c.index)
	clear(c.hashed)
}

// unregister drops b's hash from the index, if it has one, closing the gap
// by shifting later entries of the probe run back (no tombstones, so a long
// simulation never degrades the table).
func (c *kvCache) unregister(b int32) {
	if !c.hashed[b] {
		return
	}
	c.hashed[b] = false
	i := c.hash[b] & c.mask
	for c.index[i] != b+1 {
		i = (i + 1) & c.mask
	}
	for j := (i + 1) & c.mask; c.index[j] != 0; j = (j + 1) & c.mask {
		// The entry at j may move to the hole at i if its home slot is not
		// in the cyclic range (i, j].
		home := c.hash[c.index[j]-1] & c.mask
		if (j-home)&c.mask >= (j-i)&c.mask {
			c.index[i] = c.index[j]
			i = j
		}
	}
	c.index[i] = 0
}

// release drops one reference to each block of a block table, last block
// first: the tail of a prompt is the least likely to be shared, so it is
// put nearest the eviction end (vLLM frees in reverse order for the same
// reason).
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.ref[b]--
		if c.ref[b] == 0 {
			c.pushBack(b)
		}
	}
}

// used is the number of referenced blocks.
func (c *kvCache) used() int { return len(c.ref) - c.free }
