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
type Index struct {
	// implementation owned by the index
}

// NewIndex returns an empty index in which every backend has capacity
// defaultCapacity blocks until SetCapacity says otherwise.
func NewIndex(defaultCapacity int) *Index {
	panic("unimplemented")
}

// SetCapacity sets backend's capacity in blocks, evicting LRU blocks if it
// now holds more.
func (ix *Index) SetCapacity(backend int, blocks int) {
	panic("unimplemented")
}

// Match sets out[b] to the number of leading blocks of hashes that backend
// b holds, for every b < len(out) (0 for a backend that holds none). It does
// not change recency and does not allocate.
func (ix *Index) Match(hashes []uint64, out []int32) {
	panic("unimplemented")
}

// Insert records that backend now holds all of hashes, marking them most
// recently used, and evicts the backend's least recently used blocks beyond
// its capacity.
func (ix *Index) Insert(backend int, hashes []uint64) {
	panic("unimplemented")
}

// RemoveBackend forgets everything backend holds (it crashed, was removed,
// or restarted with an empty cache).
func (ix *Index) RemoveBackend(backend int) {
	panic("unimplemented")
}

// Len returns the number of blocks backend holds.
func (ix *Index) Len(backend int) int {
	panic("unimplemented")
}
