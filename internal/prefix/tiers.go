package prefix

import (
	"math/bits"
	"slices"
	"strings"
)

// Tier is a level of an engine's KV cache hierarchy. A prompt's block found
// on a lower tier is loaded back into GPU memory before its request runs:
// cheaper than computing it again, dearer than a GPU hit.
type Tier uint8

// The tiers, fastest first.
const (
	// TierGPU is the engine's GPU KV cache.
	TierGPU Tier = iota
	// TierCPU is host memory: vLLM's OffloadingConnector's CPU tier,
	// SGLang's hierarchical cache's host pool (L2).
	TierCPU
	// TierDisk is storage past host memory: local disk or a remote store
	// (vLLM's STORAGE medium, SGLang's L3).
	TierDisk
	// NumTiers is the number of tiers.
	NumTiers
)

// String names t as configuration and metrics do.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	}
	return "disk"
}

// TierOf is the tier a KV event's medium names, in any case: "" and "GPU"
// (vLLM's MEDIUM_GPU; an engine that names none reports its GPU cache),
// "CPU" (vLLM's MEDIUM_CPU, what its OffloadingConnector publishes) and
// SGLang's hierarchical cache's "CPU_TIER1" (host memory) are the GPU and
// CPU tiers; "CPU_TIER2" (SGLang's L3 storage), vLLM's "STORAGE" and any
// other medium, the disk tier: an unknown medium is priced as the slowest.
func TierOf(medium string) Tier {
	switch strings.ToUpper(medium) {
	case "", "GPU":
		return TierGPU
	case "CPU", "CPU_TIER1":
		return TierCPU
	}
	return TierDisk
}

// Tiers is how the leading blocks of one backend's match are spread over
// its tiers: the first Tiers[TierGPU] on its GPU, the next Tiers[TierCPU]
// in host memory, the next Tiers[TierDisk] on disk. A block held on
// several tiers counts on the fastest.
type Tiers [NumTiers]int32

// Total is the match's leading blocks, whatever their tier.
func (t Tiers) Total() int32 { return t[TierGPU] + t[TierCPU] + t[TierDisk] }

// SetSpill makes lower the tier that ix's blocks evicted for capacity go
// to, as an engine offloads the blocks its GPU evicts to host memory: each
// evicted block is inserted into lower for the same backend (whose
// capacity SetCapacity sets there). nil, the default, drops them. Call it
// before ix is used. lower is written while ix's lock is held: it must
// never write back to ix.
func (ix *Index) SetSpill(lower *Index) {
	ix.lock()
	ix.spill = lower
	ix.unlock()
}

// spillEvicted inserts the blocks evict just dropped for l into the lower
// tier. The caller holds the write lock.
func (ix *Index) spillEvicted(l *lru) {
	if len(ix.spilled) == 0 {
		return
	}
	// Evicted oldest first; Insert makes its first block the most recent.
	slices.Reverse(ix.spilled)
	ix.spill.Insert(int(l.id), ix.spilled)
	ix.spilled = ix.spilled[:0]
}

// MatchTiers sets out[b] to the leading blocks of hashes backend b holds
// in any of tiers (fastest first; nil entries are skipped), per tier: the
// first out[b][TierGPU] in tiers[0], the next ones in tiers[0] or
// tiers[1] (counted on TierCPU), the next in any (TierDisk). It does not
// change recency, takes no lock and never waits for a writer, like Match.
func MatchTiers(hashes []uint64, tiers []*Index, out []Tiers) {
	clear(out)
	if len(out) == 0 || len(tiers) == 0 {
		return
	}
	var arrs [NumTiers]*blockArray
	for t, ix := range tiers[:min(len(tiers), int(NumTiers))] {
		if ix != nil {
			arrs[t] = ix.blocks.arr.Load()
		}
	}
	nw := (len(out) + 63) / 64
	// alive[t] is the set of backends that hold every block so far in
	// one of tiers 0..t; a backend leaving it at block i held i blocks
	// there. Each set contains the one before. m is a block's holders on
	// tiers 0..t, w one tier's.
	var buf [(NumTiers + 2) * stackWords]uint64
	words, stride := buf[:], max(nw, stackWords)
	if nw > stackWords {
		words = make([]uint64, int(NumTiers+2)*stride)
	}
	var alive [NumTiers][]uint64
	for t := range alive {
		alive[t] = words[t*stride:][:nw]
		for k := range alive[t] {
			alive[t][k] = ^uint64(0)
		}
		if r := len(out) % 64; r != 0 {
			alive[t][nw-1] = 1<<r - 1
		}
	}
	m := words[int(NumTiers)*stride:][:nw]
	w := words[int(NumTiers+1)*stride:][:nw]
	i := 0
	for ; i < len(hashes); i++ {
		clear(m)
		live := false
		for t := range arrs {
			if a := arrs[t]; a != nil {
				k := min(nw, a.words)
				a.read(hashes[i], alive[NumTiers-1][:k], w[:k])
				for j := range k {
					m[j] |= w[j]
				}
			}
			// m is now the holders on tiers 0..t.
			for j, al := range alive[t] {
				if al == 0 {
					continue
				}
				live = true
				for gone := al &^ m[j]; gone != 0; gone &= gone - 1 {
					b := 64*j + bits.TrailingZeros64(gone)
					setDepth(&out[b], Tier(t), int32(i))
				}
				alive[t][j] = al & m[j]
			}
		}
		if !live {
			break
		}
	}
	for t := range alive {
		for j, al := range alive[t] {
			for ; al != 0; al &= al - 1 {
				setDepth(&out[64*j+bits.TrailingZeros64(al)], Tier(t), int32(i))
			}
		}
	}
	// out[b][t] holds the depth of tiers 0..t; make them per tier.
	for b := range out {
		d := out[b]
		out[b][TierCPU] = d[TierCPU] - d[TierGPU]
		out[b][TierDisk] = d[TierDisk] - d[TierCPU]
	}
}

// setDepth records that a backend's run through tiers 0..t ended at depth.
func setDepth(x *Tiers, t Tier, depth int32) { x[t] = depth }
