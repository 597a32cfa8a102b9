package policy

import (
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
)

func init() { register("session-hash", func(o Options) Policy { return NewSessionHash(o) }) }

// DefaultLoadFactor is CHWBL's default bound on a backend's in-flight
// requests relative to the mean (Mirrokni, Thorup and Zadimoghaddam, 2018;
// the value Vimeo and HAProxy ship).
const DefaultLoadFactor = 1.25

// SessionVNodes is the number of points each backend owns on the session
// ring. 160 is ketama's choice: with n backends the share of keys each owns
// deviates from 1/n by a few percent, and a ring of 64 backends is 10,240
// points (160 KiB), rebuilt only when the candidate set changes.
const SessionVNodes = 160

// SessionHash sends requests with the same session key to the same backend
// by consistent hashing with bounded loads (CHWBL): walk the ring clockwise
// from the key's hash and take the first backend whose in-flight count,
// counting this request, stays within ceil(LoadFactor * (total+1) / n).
// Requests without a session key go to the least-loaded backend.
//
// A ring of three backends a, b, c with two points each might look like
//
//	      a0
//	  c1      b0        key k hashes between a0 and b0: it goes to b,
//	c0          b1      unless b is over the bound, then to c (c0 is the
//	      a1            next point clockwise that is not b's), and so on.
//
// Adding or removing a backend moves only the keys of its own points.
type SessionHash struct {
	loadFactor float64
	ring       atomic.Pointer[hashRing]
	rot        tieRotor
}

// NewSessionHash returns a session-hash policy; a LoadFactor of 0 means
// DefaultLoadFactor and one below 1 is raised to 1 (below 1 the bound can
// exclude every backend).
func NewSessionHash(o Options) *SessionHash {
	return &SessionHash{loadFactor: sessionLoadFactor(o)}
}

func sessionLoadFactor(o Options) float64 {
	switch {
	case o.LoadFactor == 0:
		return DefaultLoadFactor
	case o.LoadFactor < 1:
		return 1
	}
	return o.LoadFactor
}

// Name implements Policy.
func (*SessionHash) Name() string { return "session-hash" }

// Pick implements Policy.
func (p *SessionHash) Pick(in *Input) Decision {
	cands := in.Candidates
	if in.View == nil || in.View.SessionKey == "" {
		return Decision{Index: fewestInFlight(cands, p.rot.start(len(cands))), Note: "no-key"}
	}
	r := p.ringFor(cands)
	n := len(cands)
	var total int64
	for _, b := range cands {
		total += b.Load().InFlight
	}
	bound := boundedLoadCap(p.loadFactor, total, n)
	key := in.SessionHash
	pos, _ := slices.BinarySearch(r.points, key)
	// One lap always finds a backend within the bound (see boundedLoadCap);
	// the lap limit only guards against a bug turning into a hang.
	for k := range len(r.points) {
		j := pos + k
		if j >= len(r.points) {
			j -= len(r.points)
		}
		i := int(r.owner[j])
		if cands[i].Load().InFlight+1 <= bound {
			if k == 0 {
				return Decision{Index: i, Note: "hash"}
			}
			return Decision{Index: i, Note: "overflow"}
		}
	}
	return Decision{Index: fewestInFlight(cands, 0), Note: "least-loaded"}
}

// boundedLoadCap is CHWBL's capacity: the most requests in flight a backend may
// hold after taking this one, with total in flight over n backends. Since
// the least-loaded backend holds at most floor(total/n) and
// ceil(c*(total+1)/n) >= floor(total/n)+1 for c >= 1, some backend always
// fits.
func boundedLoadCap(c float64, total int64, n int) int64 {
	return int64(math.Ceil(c * float64(total+1) / float64(n)))
}

// hashRing is an immutable consistent-hash ring over one candidate list.
type hashRing struct {
	ids    []int    // the candidates' IDs, in candidate order
	points []uint64 // sorted point hashes
	owner  []int32  // owner[j] is the candidate index owning points[j]
}

// ringFor returns the ring for cands, building it if the candidate set
// changed since the last pick. A retry that excludes a backend rebuilds it
// once; the next pick over the full set rebuilds it back.
func (p *SessionHash) ringFor(cands []*fleet.Backend) *hashRing {
	if r := p.ring.Load(); r != nil && sameIDs(r.ids, cands) {
		return r
	}
	r := buildRing(cands, SessionVNodes)
	p.ring.Store(r)
	return r
}

func sameIDs(ids []int, cands []*fleet.Backend) bool {
	if len(ids) != len(cands) {
		return false
	}
	for i, b := range cands {
		if ids[i] != b.ID {
			return false
		}
	}
	return true
}

// buildRing places vnodes points per candidate at xxhash(name#v). Points
// derive from the backend's name (its ID when unnamed), not its position
// in the list, so two routers in front of the same fleet agree.
func buildRing(cands []*fleet.Backend, vnodes int) *hashRing {
	type pt struct {
		h uint64
		o int32
	}
	pts := make([]pt, 0, len(cands)*vnodes)
	ids := make([]int, len(cands))
	var buf []byte
	for i, b := range cands {
		ids[i] = b.ID
		name := b.Name
		if name == "" {
			name = "#" + strconv.Itoa(b.ID)
		}
		for v := range vnodes {
			buf = append(buf[:0], name...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(v), 10)
			pts = append(pts, pt{xxhash.Sum64(buf), int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return int(a.o - b.o)
	})
	r := &hashRing{ids: ids, points: make([]uint64, len(pts)), owner: make([]int32, len(pts))}
	for j, x := range pts {
		r.points[j], r.owner[j] = x.h, x.o
	}
	return r
}

var _ Policy = (*SessionHash)(nil)
