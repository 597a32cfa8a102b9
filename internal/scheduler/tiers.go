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

// SetCPUCapacity sets backend's CPU tier to cpuTokens tokens (0: none)
// and sizes the approximate index's model of it: an engine stores every
// block it computes to its CPU tier (vLLM's OffloadingConnector does), so
// the blocks it holds only there are the tier's less its GPU's
// (SetKVCapacity). The first positive one turns the approximate index's
// offload model on.
func (s *Scheduler) SetCPUCapacity(backend int, cpuTokens int64) {
	if backend < 0 {
		return
	}
	s.tierMu.Lock()
	defer s.tierMu.Unlock()
	if cpuTokens <= 0 && s.cpu.Load() == nil {
		return
	}
	s.caps.cpu = setAt(s.caps.cpu, backend, max(cpuTokens, 0))
	s.applyCPU(backend)
}

// tierCaps are each backend's GPU and CPU tier in tokens, by ID, as
// SetKVCapacity and SetCPUCapacity last gave them.
type tierCaps struct{ gpu, cpu []int64 }

// setAt is xs with xs[i] = v, grown as needed.
func setAt(xs []int64, i int, v int64) []int64 {
	for len(xs) <= i {
		xs = append(xs, 0)
	}
	xs[i] = v
	return xs
}

// noteGPU records backend's GPU tier for its CPU tier's size. It is
// SetKVCapacity's.
func (s *Scheduler) noteGPU(backend int, kvTokens int64) {
	if backend < 0 {
		return
	}
	s.tierMu.Lock()
	defer s.tierMu.Unlock()
	s.caps.gpu = setAt(s.caps.gpu, backend, max(kvTokens, 0))
	if s.cpu.Load() != nil {
		s.applyCPU(backend)
	}
}

// applyCPU sizes backend's CPU tier in the approximate index. s.tierMu is
// held.
func (s *Scheduler) applyCPU(backend int) {
	var gpu, cpu int64
	if backend < len(s.caps.gpu) {
		gpu = s.caps.gpu[backend]
	}
	if backend < len(s.caps.cpu) {
		cpu = s.caps.cpu[backend]
	}
	idx := s.cpu.Load()
	if idx == nil {
		if cpu <= 0 {
			return
		}
		idx = prefix.NewIndex(0)
		s.index.SetSpill(idx)
		s.cpu.Store(idx)
	}
	idx.SetCapacity(backend, int(s.blocksOf(max(cpu-gpu, 0))))
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
