// Package prefix is the router's approximate picture of which backend holds
// which prompt prefix in its KV cache. Prompt text is cut into fixed-size
// character blocks, each named by the hash of the whole prompt up to its end
// (one xxhash digest over the text, summed at every block boundary, seeded
// by the request's salt when it has one: vLLM's cache_salt, or the API
// key's identity), and the Index maps block hashes to the backends believed to hold them,
// with a per-backend capacity in blocks: the blocks of requests in flight
// are pinned, the others evicted least recently used first.
//
// Precise (precise.go) is the exact picture beside it: the blocks each
// engine reports through its KV cache events (package kvevents), keyed by
// the router's own chained hash over token ids, with the routed requests'
// blocks held speculatively until their events arrive, and per backend a
// verdict on whether its event stream can be trusted.
//
// The package does no I/O and knows nothing of HTTP, policies, engines'
// metrics or the events' wire format; backends are dense integer ids assigned by package fleet.
package prefix

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockChars is the default block size in characters (about 16
// tokens, the block size of vLLM's paged KV cache).
const DefaultBlockChars = 64

// DefaultCapacity is the default per-backend capacity in blocks, used until
// a backend's real capacity is known.
const DefaultCapacity = 100000

// Hash appends to dst the prefix hashes of the full blocks of blockChars
// bytes of text and returns the extended slice. A trailing partial block is
// not hashed: engines cache full blocks only. Block i's hash covers blocks
// 0..i, so equal hashes at position i mean equal prefixes through block i.
func Hash(dst []uint64, text string, blockChars int) []uint64 {
	return HashSalted(dst, text, blockChars, "")
}

// HashSalted is Hash under salt: the digest is seeded by the salt's hash,
// so that equal text under different salts shares no block (vLLM mixes a
// request's cache_salt into its first block's hash, which its chain
// carries into every later one; a seed is the same for a digest over the
// whole prefix). An empty salt is Hash.
func HashSalted(dst []uint64, text string, blockChars int, salt string) []uint64 {
	if blockChars <= 0 || len(text) < blockChars {
		return dst
	}
	// One xxhash digest runs over the whole text; block i's hash is the
	// digest's sum at the block's end: the hash of the whole prefix up to
	// it, so it names that prefix as a chained hash does, with each byte
	// hashed once and nothing copied.
	var d xxhash.Digest
	d.ResetWithSeed(seedKey(salt))
	for off := 0; off+blockChars <= len(text); off += blockChars {
		_, _ = d.WriteString(text[off : off+blockChars])
		dst = append(dst, d.Sum64())
	}
	return dst
}

// Index maps block hashes to the backends believed to hold them. It is safe
// for concurrent use, and built so that the router's own path never waits
// for another goroutine's write (a peer replica's routings, hundreds of
// blocks each, applied at thousands a second):
//
//   - Match, the pick's one read, takes no lock, whatever the fleet's
//     size. It reads only the block map, whose slots change by atomic
//     stores under seqlocks: a per-slot one, and one per table for the
//     blocks a deletion moves back, which a reader that saw it change
//     probes for again (see blockTable).
//   - Writes take the write lock. The router's own acquire and release
//     (AcquireNodesNoWait, ReleaseNodesNoWait) only try it: when another
//     goroutine holds it, they queue the write for that goroutine, which
//     applies the queue before letting go. Every holder applies the queue
//     before its own write, so a goroutine's writes apply in the order it
//     made them, and with one goroutine (the simulator) nothing is ever
//     queued. A queued acquire is not visible to a Match until applied:
//     microseconds, as between a pick and its acquire already.
//
// A backend's blocks are of two kinds, as in the engine's paged KV cache.
// Blocks of requests still in flight there (Acquire without its Release)
// are pinned: the engine cannot evict a block a running or queued request
// uses, so neither does the index. The others sit on a recency list and
// are evicted least recently used first once the backend holds more than
// its capacity, pinned blocks included. A released block becomes the most
// recently used, as a finished request's blocks do in the engine's free
// queue; without pinning, the blocks of a request that runs longer than the
// index takes to turn over would be forgotten while the engine still holds
// them.
//
// Every (block, backend) pair is one node in a slab, addressed by int32
// indices rather than pointers, which keeps a node at 24 bytes and gives the
// garbage collector nothing to scan. Recency is a per-backend log of
// touches, oldest first: refreshing a block stamps its node and appends
// (node, stamp) to the log, and eviction takes the oldest entry whose stamp
// is still its node's and whose node is unpinned. That is exactly least
// recently used order, and a refresh writes one node and the log's end
// instead of unlinking the node from between two others and relinking it
// at the head of a list: every one of those reads is a cache miss in a slab
// of millions of nodes, and they were most of the simulator's routing time.
// The log is compacted (its stale entries dropped, in order) when it would
// grow while at most half of it is live, so its capacity stays under four
// entries (32 bytes) per block the backend held unpinned at its fullest.
//
// Two tables find nodes. The block map gives, per block, a bitset of its
// holders, one 64-bit word per 64 backends, so that Match, the hot path,
// is one lookup and a few word operations per block (one word up to 64
// backends, 16 at 1,024). The pair table, open addressing over (block, backend), finds a
// given backend's node in O(1) however many backends hold the block: a
// shared system prompt is held by the whole fleet, and walking its holders
// on every insert would stall Match behind the write lock.
type Index struct {
	mu         sync.RWMutex
	defaultCap int
	blocks     blockTable
	nodes      []node
	free       int32 // head of the free-node list (see node.stamp), or nilNode
	backends   []lru
	pairs      pairTable

	// Writes posted while another goroutine held mu (see post), in order:
	// ops with their hashes in arena, under pmu; queued counts them.
	pmu    sync.Mutex
	ops    []op
	arena  []uint64
	queued atomic.Int32
	// The buffers the last drain emptied, for the next swap (under mu).
	spareOps   []op
	spareArena []uint64

	// spill is the lower tier evicted blocks go to (SetSpill), nil for
	// none; spilled the blocks evict dropped, for it (under mu).
	spill   *Index
	spilled []uint64
}

// opKind is a write that can wait in the queue.
type opKind uint8

const (
	opInsert opKind = iota
	opAcquire
	opRelease
)

// op is one queued write: kind on backend of arena[lo:hi].
type op struct {
	kind    opKind
	backend int32
	lo, hi  int
}

// nilNode ends the free-node list, marks a free node and an empty pair slot.
const nilNode = -1

type node struct {
	hash uint64
	// stamp is the node's last touch (see lru.log); in a free node, the
	// next free node.
	stamp uint32
	// backend is nilNode in a free node.
	backend int32
	// pins counts the requests in flight that use the block; the node is
	// never evicted while it is above 0.
	pins int32
}

// touch is one entry of a recency log: node was refreshed at stamp. It is
// live while the node still has that stamp (and so was not refreshed since,
// nor freed: a free node's backend never matches) and is unpinned.
//
// Stamps are 32 bits, counted per backend, to keep an entry at 8 bytes: the
// log is most of the index's memory. They may wrap, and a stale entry could
// then look live again, but only if it outlived 2^32 touches of its backend;
// every one of those is appended to the same log, which is compacted (every
// stale entry dropped) whenever it fills at most half live and only grows
// while more than half of it is live, so it is compacted at least once every
// few times its backend's capacity in touches, far fewer.
type touch struct {
	stamp uint32
	node  int32
}

// lru is one backend's blocks: log[head:] holds their touches oldest
// first, exactly one live entry per unpinned block. n counts every block,
// unpinned the unpinned ones; clock is the last touch's stamp.
type lru struct {
	log         []touch
	head        int
	n, unpinned int
	capacity    int
	id          int32
	clock       uint32
	evicted     uint64 // blocks dropped for capacity, ever
}

// NewIndex returns an empty index in which every backend has capacity
// defaultCapacity blocks until SetCapacity says otherwise.
func NewIndex(defaultCapacity int) *Index {
	if defaultCapacity < 0 {
		defaultCapacity = 0
	}
	return &Index{
		defaultCap: defaultCapacity,
		free:       nilNode,
	}
}

// backend returns backend's list, growing the table on first sight. The
// caller holds the write lock.
func (ix *Index) backend(b int) *lru {
	for len(ix.backends) <= b {
		ix.backends = append(ix.backends, lru{capacity: ix.defaultCap, id: int32(len(ix.backends))})
	}
	return &ix.backends[b]
}

// SetCapacity sets backend's capacity in blocks, evicting LRU blocks if it
// now holds more.
func (ix *Index) SetCapacity(backend int, blocks int) {
	if backend < 0 {
		return
	}
	if blocks < 0 {
		blocks = 0
	}
	ix.lock()
	defer ix.unlock()
	l := ix.backend(backend)
	l.capacity = blocks
	ix.evict(l)
}

// recently used, and evicts the backend's least recently used blocks beyond
// its capacity. Blocks pinned by a request in flight stay pinned.
//
// Within one insert, earlier blocks are made more recent than later ones:
// a chain's tail is worth nothing without its head, so eviction takes the
// deepest blocks of a prompt first (as vLLM frees a sequence's blocks in
// reverse order).
func (ix *Index) Insert(backend int, hashes []uint64) {
	if backend < 0 || len(hashes) == 0 {
		return
	}
	ix.lock()
	ix.insert(backend, hashes, false, nil, 0)
	ix.unlock()
}

// Acquire is Insert for a request routed to backend: its blocks are pinned
// until the matching Release, so that they are not evicted while the
// request is queued or running there. The caller must call Release with
// the same hashes exactly once.
func (ix *Index) Acquire(backend int, hashes []uint64) {
	if backend < 0 || len(hashes) == 0 {
		return
	}
	ix.lock()
	ix.insert(backend, hashes, true, nil, 0)
	ix.unlock()
}

// AcquireNodes is Acquire that also returns where each block is held:
// nodes[:0] extended to len(hashes) handles, to hand to ReleaseNodes with
// the same hashes so that it need not look the blocks up again. A handle is
// only a hint: ReleaseNodes checks it and falls back to the lookup, so that
// removing the backend in between is harmless.
func (ix *Index) AcquireNodes(backend int, hashes []uint64, nodes []int32) []int32 {
	nodes = slices.Grow(nodes[:0], len(hashes))[:len(hashes)]
	if backend < 0 || len(hashes) == 0 {
		for i := range nodes {
			nodes[i] = nilNode
		}
		return nodes
	}
	ix.lock()
	ix.insert(backend, hashes, true, nodes, 0)
	ix.unlock()
	return nodes
}

// AcquireNodesNoWait is AcquireNodes for the request's own path: it never
// waits for the index. When another goroutine holds it (a peer's or an
// engine's write), the acquire is queued for that goroutine to apply
// before it lets go, and the result is nil (no handles: ReleaseNodes looks
// the blocks up). Either way, a later write by the same goroutine applies
// after it.
//
// It also tells how fresh the backend's copy of the first matched blocks
// (the prefix the pick counted on) was: the Age of the least recently
// used of them, unknown when the acquire was queued.
func (ix *Index) AcquireNodesNoWait(backend int, hashes []uint64, matched int, nodes []int32) ([]int32, Age) {
	if backend < 0 || len(hashes) == 0 {
		return nil, Age{}
	}
	if !ix.mu.TryLock() {
		ix.post(opAcquire, backend, hashes)
		return nil, Age{}
	}
	ix.drain()
	nodes = slices.Grow(nodes[:0], len(hashes))[:len(hashes)]
	age := ix.insert(backend, hashes, true, nodes, matched)
	ix.unlock()
	return nodes, age
}

// Age is how long ago, in the backend's own touches of blocks, the least
// recently used of a request's matched blocks was last touched, against
// the backend's capacity: Touches below half of Capacity say that fewer
// than half the capacity's blocks were touched since, so an engine that
// evicts least recently used first and keeps at least half what the
// index thinks still holds them (a block in use by a request in flight
// is touched now). Known is false when it was not measured.
type Age struct {
	Touches, Capacity int
	Known             bool
}

// Fresh reports whether the age is known and under half the capacity.
func (a Age) Fresh() bool { return a.Known && 2*a.Touches < a.Capacity }

// insert records hashes for backend, pinned if pin, and sets nodes[i] (when
// nodes is not nil) to the node of hashes[i]. It returns the Age of the
// first matched blocks before the insert touched them (unknown when
// matched is 0). The caller holds the write lock.
func (ix *Index) insert(backend int, hashes []uint64, pin bool, nodes []int32, matched int) Age {
	l := ix.backend(backend)
	b := int32(backend)
	age := Age{Capacity: l.capacity, Known: matched > 0}
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		// A block the backend holds needs only its recency refreshed (or
		// its pin count raised): the block map is not touched.
		if n := ix.pairs.find(ix.nodes, h, b); n != nilNode {
			nd := &ix.nodes[n]
			if i < matched && nd.pins == 0 {
				age.Touches = max(age.Touches, int(l.clock-nd.stamp))
			}
			switch {
			case nd.pins > 0:
				if pin {
					nd.pins++
				}
			case pin:
				nd.pins = 1
				l.unpinned--
			default:
				ix.refresh(l, n)
			}
			if nodes != nil {
				nodes[i] = n
			}
			continue
		}
		n := ix.alloc()
		if nodes != nil {
			nodes[i] = n
		}
		ix.nodes[n] = node{hash: h, backend: b}
		ix.pairs.add(ix.nodes, n)
		ix.blocks.add(h, backend)
		if pin {
			ix.nodes[n].pins = 1
		} else {
			l.unpinned++
			ix.refresh(l, n)
		}
		l.n++
	}
	ix.evict(l)
	return age
}

// Release ends the pin of an Acquire of the same hashes on backend: blocks
// no longer used by any request in flight become the most recently used
// (the first block most of all, as in Insert) and may then be evicted. A
// block the index no longer has (the backend was removed meanwhile) is
// skipped.
func (ix *Index) Release(backend int, hashes []uint64) {
	ix.ReleaseNodes(backend, hashes, nil)
}

// ReleaseNodes is Release with the handles AcquireNodes returned for the
// same hashes (nil: none), which spare it a lookup per block in the pair
// table. A handle whose node no longer holds its block for backend (the
// backend was removed, the node reused) is looked up again.
func (ix *Index) ReleaseNodes(backend int, hashes []uint64, nodes []int32) {
	if backend < 0 || len(hashes) == 0 {
		return
	}
	ix.lock()
	ix.release(backend, hashes, nodes)
	ix.unlock()
}

// ReleaseNodesNoWait is ReleaseNodes for the request's own path: like
// AcquireNodesNoWait, it never waits, and queues the release (without the
// handles) when another goroutine holds the index.
func (ix *Index) ReleaseNodesNoWait(backend int, hashes []uint64, nodes []int32) {
	if backend < 0 || len(hashes) == 0 {
		return
	}
	if !ix.mu.TryLock() {
		ix.post(opRelease, backend, hashes)
		return
	}
	ix.drain()
	ix.release(backend, hashes, nodes)
	ix.unlock()
}

// release is ReleaseNodes under the write lock.
func (ix *Index) release(backend int, hashes []uint64, nodes []int32) {
	if len(nodes) != len(hashes) {
		nodes = nil
	}
	if backend >= len(ix.backends) {
		return
	}
	l := &ix.backends[backend]
	b := int32(backend)
	for i := len(hashes) - 1; i >= 0; i-- {
		n := int32(nilNode)
		if nodes != nil {
			// The pair (block, backend) has at most one node, so a node
			// that holds it is the one the lookup would find.
			if c := nodes[i]; c >= 0 && int(c) < len(ix.nodes) && ix.nodes[c].backend == b && ix.nodes[c].hash == hashes[i] {
				n = c
			}
		}
		if n == nilNode {
			n = ix.pairs.find(ix.nodes, hashes[i], b)
		}
		if n == nilNode {
			continue
		}
		switch nd := &ix.nodes[n]; nd.pins {
		case 0:
			// Re-added unpinned after the backend was removed: nothing
			// to release, only recency to refresh.
			ix.refresh(l, n)
		case 1:
			nd.pins = 0
			l.unpinned++
			ix.refresh(l, n)
		default:
			nd.pins--
		}
	}
	ix.evict(l)
}

// lock takes the write lock, waiting for it, and applies the writes
// queued before it (see post).
func (ix *Index) lock() {
	ix.mu.Lock()
	ix.drain()
}

// unlock applies the writes queued while the caller held the write lock
// and lets go of it; if more were queued after the last look, and nobody
// else has taken the lock meanwhile, it takes it back to apply them.
func (ix *Index) unlock() {
	for {
		ix.drain()
		ix.mu.Unlock()
		if ix.queued.Load() == 0 || !ix.mu.TryLock() {
			return
		}
	}
}

// runlock ends a read, applying the writes queued meanwhile if no writer
// has taken the lock to do so.
func (ix *Index) runlock() {
	ix.mu.RUnlock()
	if ix.queued.Load() != 0 && ix.mu.TryLock() {
		ix.unlock()
	}
}

// post queues a write that found the lock held, for its holder to apply
// in unlock or runlock. The holder may have let go between the caller's
// failed TryLock and the queueing: then nobody would, so post tries once
// more itself. Whoever fails that try fails it because another holds the
// lock, and that holder looks at the queue after letting go.
func (ix *Index) post(kind opKind, backend int, hashes []uint64) {
	ix.pmu.Lock()
	lo := len(ix.arena)
	ix.arena = append(ix.arena, hashes...)
	ix.ops = append(ix.ops, op{kind: kind, backend: int32(backend), lo: lo, hi: len(ix.arena)})
	ix.queued.Add(1)
	ix.pmu.Unlock()
	if ix.mu.TryLock() {
		ix.unlock()
	}
}

// drain applies the queued writes in the order they were queued. The
// caller holds the write lock.
func (ix *Index) drain() {
	if ix.queued.Load() == 0 {
		return
	}
	ix.pmu.Lock()
	ops, arena := ix.ops, ix.arena
	ix.ops, ix.arena = ix.spareOps[:0], ix.spareArena[:0]
	ix.queued.Store(0)
	ix.pmu.Unlock()
	for _, o := range ops {
		hashes := arena[o.lo:o.hi]
		switch o.kind {
		case opAcquire:
			ix.insert(int(o.backend), hashes, true, nil, 0)
		case opRelease:
			ix.release(int(o.backend), hashes, nil)
		default:
			ix.insert(int(o.backend), hashes, false, nil, 0)
		}
	}
	ix.spareOps, ix.spareArena = ops[:0], arena[:0]
}

// RemoveBackend forgets everything backend holds (it crashed, was removed,
// or restarted with an empty cache). It walks the whole slab, as pinned
// blocks are on no list: a rare event pays for the hot path's saving.
func (ix *Index) RemoveBackend(backend int) {
	ix.lock()
	defer ix.unlock()
	if backend < 0 || backend >= len(ix.backends) {
		return
	}
	l := &ix.backends[backend]
	for n := range ix.nodes {
		if l.n == 0 {
			break
		}
		if ix.nodes[n].backend == l.id {
			ix.drop(l, int32(n))
		}
	}
	clear(l.log)
	l.log, l.head = l.log[:0], 0
}

// Len returns the number of blocks backend holds.
func (ix *Index) Len(backend int) int {
	ix.mu.RLock()
	defer ix.runlock()
	if l := ix.known(backend); l != nil {
		return l.n
	}
	return 0
}

// Pinned returns the blocks backend holds pinned by requests in flight,
// and its capacity: the owner of peers' pins (package replica) unpins the
// oldest of theirs while the pinned blocks exceed the capacity, so that no
// peer can grow the index beyond it.
func (ix *Index) Pinned(backend int) (pinned, capacity int) {
	ix.mu.RLock()
	defer ix.runlock()
	if l := ix.known(backend); l != nil {
		return l.n - l.unpinned, l.capacity
	}
	return 0, ix.defaultCap
}

// evict drops l's least recently used unpinned blocks while it holds more
// than its capacity; pinned blocks are never evicted.
func (ix *Index) evict(l *lru) {
	for l.n > l.capacity && l.unpinned > 0 {
		// unpinned > 0: a live entry is left in the log.
		t := l.log[l.head]
		l.head++
		if ix.live(l, t) {
			if ix.spill != nil {
				ix.spilled = append(ix.spilled, ix.nodes[t.node].hash)
			}
			ix.drop(l, t.node)
			l.evicted++
		}
	}
	if l.head == len(l.log) {
		l.log, l.head = l.log[:0], 0
	}
	if ix.spill != nil {
		ix.spillEvicted(l)
	}
}

// live reports whether t is the last touch of an unpinned node of l.
func (ix *Index) live(l *lru, t touch) bool {
	nd := &ix.nodes[t.node]
	return nd.backend == l.id && nd.stamp == t.stamp && nd.pins == 0
}

// refresh makes node n, unpinned, l's most recently used block.
func (ix *Index) refresh(l *lru, n int32) {
	l.clock++
	ix.nodes[n].stamp = l.clock
	if len(l.log) == cap(l.log) && 2*l.unpinned <= len(l.log) {
		// Full and at least half stale (the entries before head are
		// stale too): drop the stale ones in place rather than grow.
		kept := l.log[:0]
		for _, t := range l.log[l.head:] {
			if ix.live(l, t) {
				kept = append(kept, t)
			}
		}
		l.log, l.head = kept, 0
	}
	l.log = append(l.log, touch{stamp: l.clock, node: n})
}

// drop removes node n from l and from both tables, and frees it.
func (ix *Index) drop(l *lru, n int32) {
	if ix.nodes[n].pins == 0 {
		l.unpinned--
	}
	l.n--
	ix.pairs.remove(ix.nodes, n)
	ix.blocks.remove(ix.nodes[n].hash, int(ix.nodes[n].backend))
	ix.nodes[n] = node{stamp: uint32(ix.free), backend: nilNode}
	ix.free = n
}

func (ix *Index) alloc() int32 {
	if n := ix.free; n != nilNode {
		ix.free = int32(ix.nodes[n].stamp)
		return n
	}
	ix.nodes = append(ix.nodes, node{})
	return int32(len(ix.nodes) - 1)
}

// pairTable finds the node of a (block, backend) pair: open addressing with
// linear probing over node indices. Each slot also keeps the top 32 bits of
// its pair's mixed key (the tag), from which the slot's home follows and
// which rules out most mismatches: probing, deleting and growing never read
// a node except to confirm a tag match, and nodes are scattered over a slab
// of millions where every read is a cache miss. It is kept at most half
// full, and deletes by shifting the following run back (no tombstones), so
// probes stay short under churn.
type pairTable struct {
	slots []pairSlot // len is a power of two, at most 1<<32
	shift uint       // 32 - log2(len(slots)): home = tag >> shift
	n     int
}

// pairSlot is one slot: a node index (nilNode when empty) and its tag.
type pairSlot struct {
	node int32
	tag  uint32
}

// minPairSlots is the table's first size.
const minPairSlots = 1 << 10

// tag mixes a pair into 32 bits whose leading bits are its home.
func pairTag(h uint64, b int32) uint32 {
	// h is already a good hash, but tests and callers may pass plain
	// numbers; the multiply spreads any key over the high bits taken.
	return uint32(((h ^ uint64(b)*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9) >> 32)
}

func (t *pairTable) find(nodes []node, h uint64, b int32) int32 {
	if t.n == 0 {
		return nilNode
	}
	tag := pairTag(h, b)
	mask := len(t.slots) - 1
	for i := int(tag >> t.shift); ; i = (i + 1) & mask {
		sl := t.slots[i]
		if sl.node == nilNode {
			return nilNode
		}
		if sl.tag == tag && nodes[sl.node].hash == h && nodes[sl.node].backend == b {
			return sl.node
		}
	}
}

func (t *pairTable) add(nodes []node, n int32) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	t.place(pairSlot{node: n, tag: pairTag(nodes[n].hash, nodes[n].backend)})
	t.n++
}

func (t *pairTable) place(sl pairSlot) {
	mask := len(t.slots) - 1
	i := int(sl.tag >> t.shift)
	for t.slots[i].node != nilNode {
		i = (i + 1) & mask
	}
	t.slots[i] = sl
}

func (t *pairTable) grow() {
	old := t.slots
	size := max(minPairSlots, 2*len(old))
	t.slots = make([]pairSlot, size)
	for i := range t.slots {
		t.slots[i].node = nilNode
	}
	t.shift = uint(32 - bits.TrailingZeros(uint(size)))
	for _, sl := range old {
		if sl.node != nilNode {
			t.place(sl)
		}
	}
}

// remove deletes node n, which the table holds.
func (t *pairTable) remove(nodes []node, n int32) {
	mask := len(t.slots) - 1
	i := int(pairTag(nodes[n].hash, nodes[n].backend) >> t.shift)
	for t.slots[i].node != n {
		i = (i + 1) & mask
	}
	// Shift back every later entry of the run whose home is not in the
	// cyclic range (i, j], so that no probe ever crosses an empty slot.
	for j := (i + 1) & mask; t.slots[j].node != nilNode; j = (j + 1) & mask {
		k := int(t.slots[j].tag >> t.shift)
		if (j-k)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i].node = nilNode
	t.n--
}

// Gamma is SplitMix64's increment, the odd integer closest to 2^64 divided
// by the golden ratio.
const Gamma = 0x9e3779b97f4a7c15

// Mix64 is SplitMix64's output for state x: x+Gamma through its finaliser,
// a bijection, so that consecutive inputs give unrelated outputs. It is the
// module's one mixing function: the policies' seeded random numbers, the
// engine's output lengths, the warm-up filter and the synthetic workloads'
// text all draw from it.
func Mix64(x uint64) uint64 {
	z := x + Gamma
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
