package engine

// kvCache is the paged KV cache with automatic prefix caching, after vLLM
// v1's BlockPool: a fixed array of blocks addressed by int32 ids, a
// reference count per block, a map from block hash to the block that holds
// it, and an intrusive doubly linked free list of unreferenced blocks in
// eviction order (head = least recently freed = evicted first). A freed
// block keeps its hash and stays findable until it is taken from the head
// of the free list for new data; only then is its hash dropped. This is
// what makes an idle engine's cache a true LRU of prefixes.
type kvCache struct {
	ref    []int32  // references by running requests; 0 = in the free list
	hash   []uint64 // valid when hashed[b]
	hashed []bool
	// prev and next link the free list; index n is the sentinel.
	prev, next []int32
	free       int // blocks in the free list (hashed or not)
	byHash     map[uint64]int32
}

func newKVCache(n int) *kvCache {
	c := &kvCache{
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		hashed: make([]bool, n),
		prev:   make([]int32, n+1),
		next:   make([]int32, n+1),
		byHash: make(map[uint64]int32, n),
	}
	s := int32(n)
	c.prev[s], c.next[s] = s, s
	for b := range int32(n) {
		c.pushBack(b)
	}
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
// prefix it held. The caller has checked that c.free > 0.
func (c *kvCache) alloc() int32 {
	b := c.next[c.sentinel()]
	c.unlink(b)
	if c.hashed[b] {
		delete(c.byHash, c.hash[b])
		c.hashed[b] = false
	}
	c.ref[b] = 1
	return b
}

// lookup returns the block holding hash h, if any.
func (c *kvCache) lookup(h uint64) (int32, bool) {
	b, ok := c.byHash[h]
	return b, ok
}

// acquire adds a reference to a cached block found by lookup, taking it out
// of the free list if nobody referenced it.
func (c *kvCache) acquire(b int32) {
	if c.ref[b] == 0 {
		c.unlink(b)
	}
	c.ref[b]++
}

// register makes b findable under h once its tokens are computed. When
// another block already holds h (two requests computed the same prefix
// concurrently) the first one stays the cached copy and b stays anonymous,
// as in vLLM, so that a hash maps to exactly one block.
func (c *kvCache) register(b int32, h uint64) {
	if _, dup := c.byHash[h]; dup {
		return
	}
	c.byHash[h] = b
	c.hash[b] = h
	c.hashed[b] = true
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
