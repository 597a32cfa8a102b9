package scheduler

import (
	"time"

	"github.com/cespare/xxhash/v2"

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
func (s *Scheduler) warmKey(v *request.View, hashes []uint64) uint64 {
	switch {
	case v.SessionKey != "":
		return xxhash.Sum64String(v.SessionKey)
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

// unit maps (key, id) to [0, 1) uniformly (splitmix64's finaliser).
func unit(key uint64, id int) float64 {
	z := key ^ (uint64(id)+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}
