package scheduler

import (
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// Precise returns the precise index fed by the engines' KV cache events, or
// nil when Config.Precise was not set.
func (s *Scheduler) Precise() *prefix.Precise { return s.precise }

// TokenKeys returns the precise index's keys for a prompt of token ids
// (prefix.HashTokens in the index's block size, salted with salt: the LoRA
// adapter's name, or ""), nil without a precise index. The assignment keeps
// them for the speculative entry, so they get a slice of their own.
func (s *Scheduler) TokenKeys(tokens []uint32, salt string) []uint64 {
	if s.precise == nil {
		return nil
	}
	bt := s.precise.BlockTokens()
	return prefix.HashTokens(make([]uint64, 0, len(tokens)/bt), tokens, bt, salt)
}

// RoutePrecise is RouteHashed for a request whose token ids are known:
// keys are TokenKeys of them. For every candidate whose KV event stream is
// trusted, its prefix match comes from the precise index (what its engine
// reported, plus the requests routed there and not yet reported); for the
// others, from the approximate index, as in RouteHashed. keys may be nil
// (the tokens could not be had): every backend is then matched
// approximately. keys is kept after Route returns: the caller must not
// change it.
func (s *Scheduler) RoutePrecise(v *request.View, hashes, keys []uint64, exclude []int, now time.Time) (*Assignment, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.put(sc)
	return s.route(sc, v, hashes, keys, exclude, now)
}

// match sets sc.all[b] to the leading blocks of hashes backend b holds, in
// the approximate index's blocks of BlockChars: from the precise index,
// converted from token blocks, where b's stream is trusted, else from the
// approximate index. The approximate index is not consulted when every
// candidate is precise.
func (s *Scheduler) match(sc *scratch, hashes, keys []uint64, now time.Time) {
	n := len(sc.all)
	if s.precise == nil || keys == nil {
		clear(sc.trusted)
		s.index.Match(hashes, sc.all)
		return
	}
	if cap(sc.exact) < n {
		sc.exact, sc.trusted = make([]int32, n), make([]bool, n)
	}
	sc.exact, sc.trusted = sc.exact[:n], sc.trusted[:n]
	s.precise.Match(keys, now, sc.exact, sc.trusted)
	for _, b := range sc.cands {
		if !sc.trusted[b.ID] {
			s.index.Match(hashes, sc.all)
			break
		}
	}
	bt := int64(s.precise.BlockTokens())
	for _, b := range sc.cands {
		if sc.trusted[b.ID] {
			sc.all[b.ID] = int32(min(int64(len(hashes)), s.blocksOf(int64(sc.exact[b.ID])*bt)))
		}
	}
}

// speculate records keys as routed to backend (see prefix.Precise.Speculate).
func (s *Scheduler) speculate(backend int, keys []uint64, now time.Time) {
	if s.precise != nil && keys != nil {
		s.precise.Speculate(backend, keys, now)
	}
}

// matchNote says how the chosen backend's match was made, for the Reason:
// "" without a precise index.
func (s *Scheduler) matchNote(sc *scratch, backend int) string {
	switch {
	case s.precise == nil:
		return ""
	case backend < len(sc.trusted) && sc.trusted[backend]:
		return "precise"
	}
	return "approximate"
}
