package costmodel

import "math"

// A prompt's blocks found on a lower tier of an engine's KV cache (its CPU
// tier, its disk) are loaded into GPU memory rather than computed: their
// price is the load's time per token, the link's bandwidth over the
// model's KV bytes per token. Where the engine reports its loads, the
// model learns that time (ObserveLoad); else it answers its prior's
// figure (the preset's, or the configuration's), else the defaults below.

// Lower tiers, for LoadPerToken and ObserveLoad.
const (
	TierHost = 0 // host memory: a CPU tier
	TierDisk = 1 // local disk or a remote store
)

// Default load times per token when neither the engine nor its prior says:
// Llama-3.1-8B's 128 KiB of KV cache a token over PCIe 4.0 x16 at 80%
// (25.6 GB/s) and over a 4 GB/s NVMe drive's reads.
const (
	DefaultHostLoad = 131072 / 25.6e9
	DefaultDiskLoad = 131072 / 4e9
)

// loadAlpha is the weight of one reading in the learned load time.
const loadAlpha = 0.2

// LoadPerToken is the seconds one prompt token's KV cache takes to load
// from tier (TierHost or TierDisk) into GPU memory: learned from the
// engine's reports when it made any, else the prior's figure, else the
// default.
func (m *Model) LoadPerToken(tier int) float64 {
	if tier < 0 || tier > TierDisk {
		return 0
	}
	if v := math.Float64frombits(m.load[tier].Load()); v > 0 {
		return v
	}
	prior, def := m.prior.HostLoad, DefaultHostLoad
	if tier == TierDisk {
		prior, def = m.prior.DiskLoad, DefaultDiskLoad
	}
	if prior > 0 {
		return prior
	}
	return def
}

// ObserveLoad teaches the model one engine report of its loads from tier:
// tokens loaded in seconds. A moving mean; a frozen model learns nothing.
func (m *Model) ObserveLoad(tier int, tokens, seconds float64) {
	if m.frozen || tier < 0 || tier > TierDisk || !(tokens >= 1) || !(seconds > 0) || math.IsInf(seconds, 0) {
		return
	}
	x := seconds / tokens
	for {
		old := m.load[tier].Load()
		v := math.Float64frombits(old)
		next := x
		if v > 0 {
			next = v + loadAlpha*(x-v)
		}
		if m.load[tier].CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}
