package prefix

import (
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
)

func TestTierOf(t *testing.T) {
	for medium, want := range map[string]Tier{
		"": TierGPU, "GPU": TierGPU, "gpu": TierGPU, "CPU": TierCPU, "cpu": TierCPU,
		"CPU_TIER1": TierCPU, "CPU_TIER2": TierDisk, "STORAGE": TierDisk, "nvme": TierDisk,
	} {
		if got := TierOf(medium); got != want {
			t.Errorf("TierOf(%q) = %v, want %v", medium, got, want)
		}
	}
}

// Blocks a GPU index evicts for capacity land in its spill tier, and
// MatchTiers counts a chain's leading blocks on each tier: on the GPU
// first, then on the CPU, then on disk, across 64-backend words.
func TestSpillAndMatchTiers(t *testing.T) {
	gpu, cpu, disk := NewIndex(2), NewIndex(4), NewIndex(8)
	gpu.SetSpill(cpu)
	hashes := []uint64{1, 2, 3, 4, 5, 6}
	gpu.Insert(0, hashes[:4]) // room for 2: the deepest two are evicted
	cpu.Insert(1, hashes[:2])
	disk.Insert(0, hashes[4:5])
	gpu.Insert(70, hashes[:1])
	cpu.Insert(70, hashes[1:3])
	disk.Insert(70, hashes[3:])
	out := make([]Tiers, 72)
	MatchTiers(hashes, []*Index{gpu, cpu, disk}, out)
	want := map[int]Tiers{0: {2, 2, 1}, 1: {0, 2, 0}, 70: {1, 2, 3}}
	for b := range out {
		if out[b] != want[b] {
			t.Errorf("backend %d: %v, want %v", b, out[b], want[b])
		}
	}
	if cpu.Len(0) != 2 {
		t.Errorf("CPU tier holds %d of backend 0's blocks, want the 2 evicted", cpu.Len(0))
	}
	// Without lower tiers, the GPU's match alone.
	MatchTiers(hashes, []*Index{gpu}, out[:2])
	if out[0] != (Tiers{2, 0, 0}) || out[1] != (Tiers{}) {
		t.Errorf("GPU only: %v %v", out[0], out[1])
	}
}

// The precise index keeps each block's tier from the events, as vLLM's
// OffloadingConnector reports it: stored on the GPU with its tokens, then
// on the CPU by hash alone; removed from the GPU while on the CPU, it is a
// CPU block; removed from both, it is gone. Disk blocks come last.
func TestPreciseTiers(t *testing.T) {
	p := toks(0, 16) // 4 blocks of 4
	cpu := func(k kvevents.Kind, medium string, hashes ...uint64) kvevents.Event {
		return kvevents.Event{Kind: k, BlockHashes: hashes, Medium: medium}
	}
	x := NewPrecise(PreciseConfig{BlockTokens: 4})
	x.Reset(0, true, pt0)
	keys := HashTokens(nil, p, 4, "")
	x.Apply(0, []kvevents.Event{stored(p, 0, 11, 12, 13, 14)}, pt0)
	if x.Tiered() {
		t.Fatal("tiered before any CPU event")
	}
	x.Apply(0, []kvevents.Event{
		cpu(kvevents.BlockStored, "CPU", 11, 12, 13, 99), // 99: never stored with tokens
		cpu(kvevents.BlockRemoved, "GPU", 12, 13),
		cpu(kvevents.BlockStored, "STORAGE", 14),
		cpu(kvevents.BlockRemoved, "GPU", 14),
	}, pt0)
	out, trusted := make([]int32, 1), make([]bool, 1)
	x.Match(keys, pt0, out, trusted)
	tiers := make([]Tiers, 1)
	x.MatchTiers(keys, pt0, trusted, tiers)
	if out[0] != 4 || tiers[0] != (Tiers{1, 2, 1}) {
		t.Errorf("match %d, tiers %v; want 4 as 1 GPU, 2 CPU, 1 disk", out[0], tiers[0])
	}
	if s := x.Stats(0, pt0); s.Orphans != 1 {
		t.Errorf("orphans %d, want 1 (a CPU block never stored with its tokens)", s.Orphans)
	}
	// Removed from the CPU too: the chain ends after the first block.
	x.Apply(0, []kvevents.Event{cpu(kvevents.BlockRemoved, "CPU", 12)}, pt0)
	x.Match(keys, pt0, out, trusted)
	x.MatchTiers(keys, pt0, trusted, tiers)
	if out[0] != 1 || tiers[0] != (Tiers{1, 0, 0}) {
		t.Errorf("after the CPU removal: match %d, tiers %v; want 1 on the GPU", out[0], tiers[0])
	}
	// A routed request's speculative blocks count on the GPU.
	x.Speculate(0, keys[:3], pt0)
	x.Match(keys, pt0, out, trusted)
	x.MatchTiers(keys, pt0, trusted, tiers)
	if out[0] != 3 || tiers[0] != (Tiers{3, 0, 0}) {
		t.Errorf("speculated: match %d, tiers %v; want 3 on the GPU", out[0], tiers[0])
	}
}
