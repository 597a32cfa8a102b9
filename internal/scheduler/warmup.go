package scheduler

import (
	"github.com/kvroute/kvroute/internal/prefix"

	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// Warm-up. A backend added to a serving fleet has WarmupWeight w < 1 for a
// while, and is a candidate for only a fraction w of requests. Which
// requests is decided by a hash of the request's key and the backend's ID,
// not by chance, so that:
//   - the decision is deterministic (the simulator replays it exactly);
//   - it is monotone in w: a conversation admitted to the newcomer at w
//     stays admitted as w grows, so warm-up does not bounce a session
//     between backends and scatter its cache;
//   - two newcomers admit independent sets of requests.
//
// The key is the session key when there is one, else the prompt's last
// block hash (which covers the whole prompt), else a pick counter.

// warmKey returns the key that decides which warming backends see v.
func (s *Scheduler) warmKey(v *request.View, session uint64, hashes []uint64) uint64 {
	switch {
	case v.SessionKey != "":
		return session
	case len(hashes) > 0:
		return hashes[len(hashes)-1]
	}
	return s.picks.Add(1)
}

// warmAdmits reports whether b is a candidate for the request with key at
// now: always once it is warm, else for a fraction WarmupWeight of keys.
func warmAdmits(b *fleet.Backend, key uint64, now time.Time) bool {
	w := b.WarmupWeight(now)
	if w >= 1 {
		return true
	}
	return unit(key, b.ID) < w
}

// unit maps (key, id) to [0, 1) uniformly.
func unit(key uint64, id int) float64 {
	z := prefix.Mix64(key ^ (uint64(id)+1)*prefix.Gamma - prefix.Gamma)
	return float64(z>>11) / (1 << 53)
}
