// Package prefix is the router's approximate picture of which backend holds
// which prompt prefix in its KV cache. Prompt text is cut into fixed-size
// character blocks hashed as a chain (each block's hash covers its parent's),
// and the Index maps block hashes to the backends believed to hold them,
// with a per-backend LRU capacity in blocks.
//
// The package does no I/O and knows nothing of HTTP, policies or engines'
// metrics; backends are dense integer ids assigned by package fleet.
package prefix

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockChars is the default block size in characters (about 16
// tokens, the block size of vLLM's paged KV cache).
const DefaultBlockChars = 64

// DefaultCapacity is the default per-backend capacity in blocks, used until
// a backend's real capacity is known.
const DefaultCapacity = 100000

// Hash appends to dst the chain hashes of the full blocks of blockChars
// bytes of text and returns the extended slice. A trailing partial block is
// not hashed: engines cache full blocks only. Block i's hash covers blocks
// 0..i, so equal hashes at position i mean equal prefixes through block i.
func Hash(dst []uint64, text string, blockChars int) []uint64 {
	var parent [8]byte
	var d xxhash.Digest
	for off := 0; off+blockChars <= len(text); off += blockChars {
		d.Reset()
		_, _ = d.Write(parent[:])
		_, _ = d.WriteString(text[off : off+blockChars])
		h := d.Sum64()
		dst = append(dst, h)
		for i := range 8 {
			parent[i] = byte(h >> (8 * i))
		}
	}
	return dst
}

// Index maps block hashes to the backends believed to hold them. It is safe
// for concurrent use; Match takes only a read lock.
//
// Every (block, backend) pair is one node in a slab. A node sits on two
// lists at once: its backend's recency list (doubly linked, for O(1) refresh
// and eviction) and its block's holder list (singly linked from the map
// entry, usually one to a few nodes long). Links are int32 slab indices
// rather than pointers, which keeps a node at 24 bytes and gives the garbage
// collector nothing to scan.
type Index struct {
	mu         sync.RWMutex
	defaultCap int
	// blocks maps a block hash to the first node of its holder list.
	blocks   map[uint64]int32
	nodes    []node
	free     int32 // head of the free-node list (linked through next), or nilNode
	backends []lru
}

// nilNode ends every list.
const nilNode = -1

type node struct {
	hash uint64
	// prev and next link the backend's recency list (prev towards the most
	// recent end); next also links the free list.
	prev, next int32
	// holder links the next node holding the same hash.
	holder  int32
	backend int32
}

// lru is one backend's recency list: head is the most recently used block.
type lru struct {
	head, tail int32
	n          int
	capacity   int
}

// NewIndex returns an empty index in which every backend has capacity
// defaultCapacity blocks until SetCapacity says otherwise.
func NewIndex(defaultCapacity int) *Index {
	if defaultCapacity < 0 {
		defaultCapacity = 0
	}
	return &Index{
		defaultCap: defaultCapacity,
		blocks:     make(map[uint64]int32),
		free:       nilNode,
	}
}

// backend returns backend's list, growing the table on first sight. The
// caller holds the write lock.
func (ix *Index) backend(b int) *lru {
	for len(ix.backends) <= b {
		ix.backends = append(ix.backends, lru{head: nilNode, tail: nilNode, capacity: ix.defaultCap})
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
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := ix.backend(backend)
	l.capacity = blocks
	ix.evict(l)
}

// Match sets out[b] to the number of leading blocks of hashes that backend
// b holds, for every b < len(out) (0 for a backend that holds none). It does
// not change recency and does not allocate.
func (ix *Index) Match(hashes []uint64, out []int32) {
	clear(out)
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	// out[b] == i means b holds blocks 0..i-1, so b still matches at block i
	// exactly when out[b] == i and b holds block i. The walk stops at the
	// first block no still-matching backend holds.
	for i, h := range hashes {
		n, ok := ix.blocks[h]
		if !ok {
			return
		}
		cur := int32(i)
		extended := false
		for ; n != nilNode; n = ix.nodes[n].holder {
			b := ix.nodes[n].backend
			if int(b) < len(out) && out[b] == cur {
				out[b] = cur + 1
				extended = true
			}
		}
		if !extended {
			return
		}
	}
}

// Insert records that backend now holds all of hashes, marking them most
// recently used, and evicts the backend's least recently used blocks beyond
// its capacity.
//
// Within one insert, earlier blocks are made more recent than later ones:
// a chain's tail is worth nothing without its head, so eviction takes the
// deepest blocks of a prompt first (as vLLM frees a sequence's blocks in
// reverse order).
func (ix *Index) Insert(backend int, hashes []uint64) {
	if backend < 0 || len(hashes) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := ix.backend(backend)
	b := int32(backend)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		head, ok := ix.blocks[h]
		n := head
		if ok {
			for n != nilNode && ix.nodes[n].backend != b {
				n = ix.nodes[n].holder
			}
		} else {
			head = nilNode
			n = nilNode
		}
		if n != nilNode {
			ix.unlinkLRU(l, n)
			ix.pushFront(l, n)
			continue
		}
		n = ix.alloc()
		ix.nodes[n] = node{hash: h, prev: nilNode, next: nilNode, holder: head, backend: b}
		ix.blocks[h] = n
		ix.pushFront(l, n)
		l.n++
	}
	ix.evict(l)
}

// RemoveBackend forgets everything backend holds (it crashed, was removed,
// or restarted with an empty cache).
func (ix *Index) RemoveBackend(backend int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if backend < 0 || backend >= len(ix.backends) {
		return
	}
	l := &ix.backends[backend]
	for l.tail != nilNode {
		ix.drop(l, l.tail)
	}
}

// Len returns the number of blocks backend holds.
func (ix *Index) Len(backend int) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if backend < 0 || backend >= len(ix.backends) {
		return 0
	}
	return ix.backends[backend].n
}

// evict drops l's least recently used blocks beyond its capacity.
func (ix *Index) evict(l *lru) {
	for l.n > l.capacity {
		ix.drop(l, l.tail)
	}
}

// drop removes node n from l and from its block's holder list, and frees it.
func (ix *Index) drop(l *lru, n int32) {
	ix.unlinkLRU(l, n)
	l.n--
	h := ix.nodes[n].hash
	head := ix.blocks[h]
	if head == n {
		if nx := ix.nodes[n].holder; nx == nilNode {
			delete(ix.blocks, h)
		} else {
			ix.blocks[h] = nx
		}
	} else {
		p := head
		for ix.nodes[p].holder != n {
			p = ix.nodes[p].holder
		}
		ix.nodes[p].holder = ix.nodes[n].holder
	}
	ix.nodes[n] = node{next: ix.free, prev: nilNode, holder: nilNode}
	ix.free = n
}

func (ix *Index) alloc() int32 {
	if n := ix.free; n != nilNode {
		ix.free = ix.nodes[n].next
		return n
	}
	ix.nodes = append(ix.nodes, node{})
	return int32(len(ix.nodes) - 1)
}

func (ix *Index) unlinkLRU(l *lru, n int32) {
	nd := &ix.nodes[n]
	if nd.prev != nilNode {
		ix.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next != nilNode {
		ix.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
	nd.prev, nd.next = nilNode, nilNode
}

func (ix *Index) pushFront(l *lru, n int32) {
	nd := &ix.nodes[n]
	nd.prev = nilNode
	nd.next = l.head
	if l.head != nilNode {
		ix.nodes[l.head].prev = n
	} else {
		l.tail = n
	}
	l.head = n
}
