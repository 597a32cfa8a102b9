// kubeai-chwbl: KubeAI's PrefixHash load balancing, consistent hashing with
// bounded loads (CHWBL), reimplemented from the public source:
// substratusai/kubeai, internal/loadbalancer/balance_chwbl.go and group.go,
// with the defaults of api/v1 (Model.spec.loadBalancing.prefixHash).
//
// The key is the first 100 characters of the first user message (for a
// completion, of the prompt), hashed with xxhash. Each endpoint sits on the
// ring 256 times, at xxhash(name + replica number). The pick walks clockwise
// from the first ring point at or after the key's hash and takes the first
// endpoint whose load passes the bound
//
//	load + 1 <= mean_load_factor x (total load + 1) / endpoints
//
// (any endpoint passes while the total load is 0); if none passes, the first
// endpoint met. Load is the router's in-flight count.
//
// Defaults: prefixCharLength 100, replication 256, meanLoadFactor 1.25
// (Options.LoadFactor overrides it).
//
// Our choices: endpoints are named by fleet Backend.Name (KubeAI uses the
// pod's namespace/name); the ring holds every backend seen so far and the
// walk skips the ones that are not candidates, as KubeAI skips endpoints
// without the requested adapter, so that a retry that excludes a backend
// does not reshuffle the ring; "endpoints" in the bound is the candidate
// count. Characters are counted as Unicode code points. A chat request
// without a user message keys on its prompt.
package policy

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// KubeAI PrefixHash defaults.
const (
	KubeAIPrefixChars = 100
	KubeAIReplication = 256
	KubeAILoadFactor  = 1.25
)

func init() {
	register("kubeai-chwbl", func(o Options) Policy { return NewKubeAI(o) })
}

// KubeAI is KubeAI's CHWBL prefix hash.
type KubeAI struct {
	factor float64
	ring   atomic.Pointer[kubeAIRing]
	mu     sync.Mutex // serialises ring rebuilds
}

// kubeAIRing is an immutable ring: sorted point hashes, the backend ID at
// each point, and the backends it was built from (sorted IDs, their names).
type kubeAIRing struct {
	points []uint64
	owner  []int32
	ids    []int
	names  map[int]string
}

// NewKubeAI returns the balancer; o.LoadFactor overrides the bound.
func NewKubeAI(o Options) *KubeAI {
	f := o.LoadFactor
	if f <= 0 {
		f = KubeAILoadFactor
	}
	p := &KubeAI{factor: f}
	p.ring.Store(&kubeAIRing{})
	return p
}

// Name implements Policy.
func (*KubeAI) Name() string { return "kubeai-chwbl" }

// KubeAIKey returns the text KubeAI hashes for v.
func KubeAIKey(v *request.View) string {
	s := v.Prompt
	if v.Kind == request.Chat && v.FirstUser != "" {
		s = v.FirstUser
	}
	n, i := 0, 0
	for i < len(s) && n < KubeAIPrefixChars {
		_, w := utf8.DecodeRuneInString(s[i:])
		i += w
		n++
	}
	return s[:i]
}

// ringFor returns a ring holding every candidate, rebuilding it (rarely:
// when a backend is seen for the first time) under the lock.
func (p *KubeAI) ringFor(cands []*fleet.Backend) *kubeAIRing {
	r := p.ring.Load()
	if r.covers(cands) {
		return r
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r = p.ring.Load()
	if r.covers(cands) {
		return r
	}
	nr := &kubeAIRing{names: maps.Clone(r.names)}
	if nr.names == nil {
		nr.names = map[int]string{}
	}
	for _, b := range cands {
		if _, ok := nr.names[b.ID]; !ok {
			nr.names[b.ID] = b.Name
		}
	}
	nr.ids = slices.Sorted(maps.Keys(nr.names))
	type point struct {
		h  uint64
		id int32
	}
	pts := make([]point, 0, len(nr.ids)*KubeAIReplication)
	for _, id := range nr.ids {
		for rep := range KubeAIReplication {
			pts = append(pts, point{xxhash.Sum64String(nr.names[id] + strconv.Itoa(rep)), int32(id)})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	nr.points = make([]uint64, len(pts))
	nr.owner = make([]int32, len(pts))
	for i, pt := range pts {
		nr.points[i], nr.owner[i] = pt.h, pt.id
	}
	p.ring.Store(nr)
	return nr
}

// kubeAIHash is KubeAI's key hash (xxhash64).
func kubeAIHash(key string) uint64 { return xxhash.Sum64String(key) }

func (r *kubeAIRing) covers(cands []*fleet.Backend) bool {
	for _, b := range cands {
		if _, ok := slices.BinarySearch(r.ids, b.ID); !ok {
			return false
		}
	}
	return true
}

// Pick implements Policy.
func (p *KubeAI) Pick(in *Input) Decision {
	r := p.ringFor(in.Candidates)
	var set peerSet
	set.fill(in.Candidates)
	// index maps a backend ID to its candidate index; only entries of IDs in
	// set are written or read.
	var small [1024]int16
	index := func(id int) int {
		if id < len(small) && len(in.Candidates) < 1<<15 {
			return int(small[id])
		}
		for i, b := range in.Candidates {
			if b.ID == id {
				return i
			}
		}
		return 0
	}
	var total int64
	for i, b := range in.Candidates {
		if b.ID < len(small) {
			small[b.ID] = int16(i)
		}
		total += b.Load().InFlight
	}
	h := kubeAIHash(KubeAIKey(in.View))
	start, _ := slices.BinarySearch(r.points, h)
	if start == len(r.points) {
		start = 0
	}
	first := -1
	bound := p.factor * float64(total+1) / float64(len(in.Candidates))
	for n, i := 0, start; n < len(r.points); n++ {
		if id := int(r.owner[i]); set.has(id) {
			c := index(id)
			if first < 0 {
				first = c
			}
			if total == 0 || float64(in.Candidates[c].Load().InFlight+1) <= bound {
				return Decision{Index: c, Note: "ring"}
			}
		}
		if i++; i == len(r.points) {
			i = 0
		}
	}
	return Decision{Index: max(first, 0), Note: "ring-overloaded"}
}

var _ Policy = (*KubeAI)(nil)
