package scheduler

import (
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// Cache tiers. An engine with a CPU tier (vLLM's OffloadingConnector,
// SGLang's hierarchical cache) keeps the blocks its GPU evicts in host
// memory and loads them back for a request that needs them: a hit there
// costs the load, not a recompute. The scheduler sees where each
// candidate's matched blocks are, from the engines' events where the
// precise index has them (prefix.Precise.MatchTiers), else from the
// approximate index's model of the offload (SetCPUCapacity: the blocks it
// evicts for a backend's GPU capacity move to a CPU tier of the engine's
// size instead of vanishing), and prices the lower tiers' tokens at each
// backend's load time (costmodel.Model.LoadPerToken) in policy.Input.Load
// (tokens.go converts).

// SetCPUCapacity sizes backend's CPU tier in the approximate index from its
// engine's, kvTokens tokens (0: none). The first positive one turns the
// approximate index's offload model on.
func (s *Scheduler) SetCPUCapacity(backend int, kvTokens int64) {
	cpu := s.cpu.Load()
	if cpu == nil {
		if kvTokens <= 0 {
			return
		}
		s.tierMu.Lock()
		if cpu = s.cpu.Load(); cpu == nil {
			cpu = prefix.NewIndex(0)
			s.index.SetSpill(cpu)
			s.cpu.Store(cpu)
		}
		s.tierMu.Unlock()
	}
	cpu.SetCapacity(backend, int(s.blocksOf(max(kvTokens, 0))))
}

// matchTiers sets sc.ktiers[b], for every backend b when some backend has a
// lower tier (sc.tiered), to how its match in sc.all spreads over its
// tiers, in the approximate index's blocks; sc.all[b] becomes the match on
// every tier. Without tiers it does nothing: every match is on the GPU.
func (s *Scheduler) matchTiers(sc *scratch, hashes, keys []uint64, now time.Time) {
	cpu := s.cpu.Load()
	precise := s.precise != nil && keys != nil && s.precise.Tiered()
	sc.tiered = cpu != nil || precise
	if !sc.tiered {
		return
	}
	n := len(sc.all)
	if cap(sc.ktiers) < n {
		sc.ktiers = make([]prefix.Tiers, n)
	}
	sc.ktiers = sc.ktiers[:n]
	if cpu != nil {
		prefix.MatchTiers(hashes, []*prefix.Index{s.index, cpu}, sc.ktiers)
	} else {
		for b, m := range sc.all {
			sc.ktiers[b] = prefix.Tiers{m}
		}
	}
	for _, b := range sc.cands {
		if b.ID < len(sc.trusted) && sc.trusted[b.ID] {
			continue
		}
		sc.all[b.ID] = sc.ktiers[b.ID].Total()
	}
	if !precise {
		return
	}
	if cap(sc.ptiers) < n {
		sc.ptiers = make([]prefix.Tiers, n)
	}
	sc.ptiers = sc.ptiers[:n]
	s.precise.MatchTiers(keys, now, sc.trusted, sc.ptiers)
	bt := int64(s.precise.BlockTokens())
	for _, b := range sc.cands {
		if !sc.trusted[b.ID] {
			continue
		}
		// Token blocks to the router's, depth by depth, each within the
		// match Match made (sc.all).
		t, total := sc.ptiers[b.ID], sc.all[b.ID]
		g := min(total, int32(s.blocksOf(int64(t[prefix.TierGPU])*bt)))
		c := min(total, int32(s.blocksOf(int64(t[prefix.TierGPU]+t[prefix.TierCPU])*bt)))
		sc.ktiers[b.ID] = prefix.Tiers{g, c - g, total - c}
	}
}

// tierLoad is match t of a prompt of prompt tokens in tokens per tier
// (converted depth by depth, as split converts the whole match, so that
// they sum to its cached tokens), and the seconds the backend whose cost
// model is cost takes to load the lower tiers' into GPU memory.
func (s *Scheduler) tierLoad(cost *costmodel.Model, prompt int64, t prefix.Tiers) (policy.TierTokens, float64) {
	g := min(prompt, s.tokensOf(int64(t[prefix.TierGPU])))
	c := min(prompt, s.tokensOf(int64(t[prefix.TierGPU]+t[prefix.TierCPU])))
	d := min(prompt, s.tokensOf(int64(t.Total())))
	seconds := float64(c-g)*cost.LoadPerToken(costmodel.TierHost) + float64(d-c)*cost.LoadPerToken(costmodel.TierDisk)
	return policy.TierTokens{g, c - g, d - c}, seconds
}
