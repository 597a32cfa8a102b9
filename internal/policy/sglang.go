// sglang-cache-aware: the cache-aware policy of SGLang's router (the "SGLang
// model gateway"), reimplemented from its public source:
// sgl-project/sglang, sgl-model-gateway/src/policies/cache_aware.rs and
// tree.rs (formerly sgl-router/src/policies/), and the gateway's command-line
// defaults in its main.rs.
//
// Algorithm, per request:
//   - loads are the router's own in-flight counts per worker;
//   - if max-min > balance_abs_threshold and max > balance_rel_threshold x min,
//     the fleet is imbalanced: route to the least-loaded worker;
//   - else walk one approximate radix tree over the prompt's characters; if
//     matched characters / prompt characters > cache_threshold route to the
//     worker holding the longest match, else to the least-loaded worker;
//   - whatever the branch, insert the prompt into the tree for the chosen
//     worker, stamping every node on its path with the time.
//
// Every eviction_interval a pass trims each worker whose characters in the
// tree exceed max_tree_size, removing that worker from its least recently
// used leaves first (tree.rs evict_tenant_by_size).
//
// Defaults (the gateway's CLI defaults, which is how it is deployed; the
// library's CacheAwareConfig::default differs and is not what users run):
// cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
// eviction_interval 120 s, max_tree_size 67,108,864 characters per worker.
//
// Choices where the description is open, following the code:
//   - on a weak match SGLang first routed to the worker with the smallest
//     tree; sglang PR #14650 (merged Dec 2025) changed that to the
//     least-loaded worker, which is what the current code does and what we do;
//   - the least-loaded worker is the first in candidate order among equals,
//     as Rust's min_by_key returns the first minimum;
//   - the match rate is in bytes, as the current code measures it;
//   - the eviction pass runs on the request path when the virtual or real
//     clock (Input.Now) has passed the next interval, instead of on a thread,
//     so that the simulator sees it at the same times as a live router;
//   - where several workers hold the deepest matched node, SGLang takes the
//     first in its DashMap's order (arbitrary); we take the most recently
//     stamped holder, and we only consider candidates (SGLang falls back to
//     the first healthy worker when its pick is unavailable).
//
// The tree is a compressed radix tree over bytes. Pick takes a read lock,
// Routed a write lock.
package policy

import (
	"container/heap"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// SGLang gateway defaults (CLI).
const (
	SGLangCacheThreshold      = 0.3
	SGLangBalanceAbsThreshold = 64
	SGLangBalanceRelThreshold = 1.5
	SGLangEvictionInterval    = 120 * time.Second
	SGLangMaxTreeSize         = 1 << 26 // characters per worker
)

func init() {
	register("sglang-cache-aware", func(Options) Policy { return NewSGLang(SGLangConfig{}) })
}

// SGLangConfig tunes SGLang; zero values mean the gateway's defaults.
type SGLangConfig struct {
	CacheThreshold      float64
	BalanceAbsThreshold int64
	BalanceRelThreshold float64
	EvictionInterval    time.Duration
	MaxTreeSize         int
}

// SGLang is SGLang's cache-aware policy with its approximate radix tree.
type SGLang struct {
	cfg SGLangConfig

	mu        sync.RWMutex
	root      sglNode
	size      []int // characters each worker holds in the tree, by backend ID
	nextEvict time.Time
}

// NewSGLang returns the policy with cfg's zero fields set to the defaults.
func NewSGLang(cfg SGLangConfig) *SGLang {
	if cfg.CacheThreshold == 0 {
		cfg.CacheThreshold = SGLangCacheThreshold
	}
	if cfg.BalanceAbsThreshold == 0 {
		cfg.BalanceAbsThreshold = SGLangBalanceAbsThreshold
	}
	if cfg.BalanceRelThreshold == 0 {
		cfg.BalanceRelThreshold = SGLangBalanceRelThreshold
	}
	if cfg.EvictionInterval == 0 {
		cfg.EvictionInterval = SGLangEvictionInterval
	}
	if cfg.MaxTreeSize == 0 {
		cfg.MaxTreeSize = SGLangMaxTreeSize
	}
	return &SGLang{cfg: cfg}
}

// Name implements Policy.
func (*SGLang) Name() string { return "sglang-cache-aware" }

// Pick implements Policy.
func (p *SGLang) Pick(in *Input) Decision {
	least, minLoad, maxLoad := 0, int64(-1), int64(0)
	for i, b := range in.Candidates {
		l := b.Load().InFlight
		if minLoad < 0 || l < minLoad {
			least, minLoad = i, l
		}
		maxLoad = max(maxLoad, l)
	}
	if maxLoad-minLoad > p.cfg.BalanceAbsThreshold && float64(maxLoad) > float64(minLoad)*p.cfg.BalanceRelThreshold {
		return Decision{Index: least, Note: "imbalanced"}
	}
	text := in.View.Prompt
	if len(text) == 0 {
		return Decision{Index: least, Note: "least-loaded"}
	}
	var set peerSet
	set.fill(in.Candidates)
	p.mu.RLock()
	matched, holder := p.root.match(text, &set)
	p.mu.RUnlock()
	if holder >= 0 && float64(matched)/float64(len(text)) > p.cfg.CacheThreshold {
		for i, b := range in.Candidates {
			if b.ID == holder {
				return Decision{Index: i, Note: "cache-match"}
			}
		}
	}
	return Decision{Index: least, Note: "least-loaded"}
}

// Routed implements Observer: the prompt now belongs to the chosen worker.
func (p *SGLang) Routed(in *Input, d Decision) {
	id := in.Candidates[d.Index].ID
	now := in.Now.UnixNano()
	p.mu.Lock()
	defer p.mu.Unlock()
	if id >= len(p.size) {
		p.size = append(p.size, make([]int, id+1-len(p.size))...)
	}
	p.size[id] += p.root.insert(in.View.Prompt, int32(id), now)
	if p.nextEvict.IsZero() {
		p.nextEvict = in.Now.Add(p.cfg.EvictionInterval)
	} else if !in.Now.Before(p.nextEvict) {
		p.nextEvict = in.Now.Add(p.cfg.EvictionInterval)
		for w, n := range p.size {
			if n > p.cfg.MaxTreeSize {
				p.size[w] -= p.root.evict(int32(w), n-p.cfg.MaxTreeSize)
			}
		}
	}
}

// TreeSize returns the characters worker id holds in the tree.
func (p *SGLang) TreeSize(id int) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if id < len(p.size) {
		return p.size[id]
	}
	return 0
}

// sglNode is one edge of the radix tree: the label leading to it, its
// children by first byte, and the workers ("tenants") holding it with the
// time each last touched it. A child's tenants are always a subset of its
// parent's: inserts stamp whole paths and eviction removes leaves first.
type sglNode struct {
	label    string
	parent   *sglNode
	children map[byte]*sglNode
	tenants  []sglTenant
}

type sglTenant struct {
	id int32
	at int64 // unix nanoseconds of the last access
}

// match walks text down the tree and returns the length of the deepest
// match held by a worker in set, and that worker (-1 if none).
func (n *sglNode) match(text string, set *peerSet) (int, int) {
	pos, bestLen, best := 0, 0, -1
	for pos < len(text) {
		c := n.children[text[pos]]
		if c == nil {
			break
		}
		k := peerCommonPrefix(c.label, text[pos:])
		pos += k
		h, at := -1, int64(0)
		for _, t := range c.tenants {
			if set.has(int(t.id)) && (h < 0 || t.at > at) {
				h, at = int(t.id), t.at
			}
		}
		if h < 0 {
			break // deeper nodes hold a subset of these tenants
		}
		bestLen, best = pos, h
		if k < len(c.label) {
			break
		}
		n = c
	}
	return bestLen, best
}

// insert records that tenant holds text and returns how many characters
// were new to the tenant.
func (n *sglNode) insert(text string, tenant int32, now int64) int {
	added := 0
	pos := 0
	for pos < len(text) {
		c := n.children[text[pos]]
		if c == nil {
			leaf := &sglNode{label: sglClone(text[pos:]), parent: n, tenants: []sglTenant{{tenant, now}}}
			if n.children == nil {
				n.children = make(map[byte]*sglNode, 1)
			}
			n.children[text[pos]] = leaf
			return added + len(leaf.label)
		}
		k := peerCommonPrefix(c.label, text[pos:])
		if k < len(c.label) {
			c = c.split(k)
		}
		if c.stamp(tenant, now) {
			added += len(c.label)
		}
		pos += k
		n = c
	}
	return added
}

// split cuts n's label after k bytes, inserting a new parent that holds the
// first k bytes with n's tenants, and returns the new parent.
func (n *sglNode) split(k int) *sglNode {
	mid := &sglNode{
		label:    n.label[:k],
		parent:   n.parent,
		children: map[byte]*sglNode{n.label[k]: n},
		tenants:  append([]sglTenant(nil), n.tenants...),
	}
	n.parent.children[n.label[0]] = mid
	n.label = n.label[k:]
	n.parent = mid
	return mid
}

// stamp marks tenant's access to n and reports whether it is new to n.
func (n *sglNode) stamp(tenant int32, now int64) bool {
	for i := range n.tenants {
		if n.tenants[i].id == tenant {
			n.tenants[i].at = max(n.tenants[i].at, now)
			return false
		}
	}
	n.tenants = append(n.tenants, sglTenant{tenant, now})
	return true
}

func (n *sglNode) tenantAt(tenant int32) (int64, bool) {
	for _, t := range n.tenants {
		if t.id == tenant {
			return t.at, true
		}
	}
	return 0, false
}

// leafOf reports whether n is one of tenant's leaves: tenant holds n and
// none of its children.
func (n *sglNode) leafOf(tenant int32) bool {
	if _, ok := n.tenantAt(tenant); !ok {
		return false
	}
	for _, c := range n.children {
		if _, ok := c.tenantAt(tenant); ok {
			return false
		}
	}
	return true
}

// evict removes tenant from its least recently used leaves until at least
// want characters are gone, as SGLang's evict_tenant_by_size does, and
// returns the characters removed. Nodes left with no tenant are unlinked.
func (n *sglNode) evict(tenant int32, want int) int {
	h := &sglLRU{tenant: tenant}
	var collect func(*sglNode)
	collect = func(x *sglNode) {
		for _, c := range x.children {
			collect(c)
		}
		if x.parent != nil && x.leafOf(tenant) {
			h.nodes = append(h.nodes, x)
		}
	}
	collect(n)
	heap.Init(h)
	removed := 0
	for removed < want && h.Len() > 0 {
		x := heap.Pop(h).(*sglNode)
		for i, t := range x.tenants {
			if t.id == tenant {
				x.tenants = append(x.tenants[:i], x.tenants[i+1:]...)
				break
			}
		}
		removed += len(x.label)
		par := x.parent
		if len(x.tenants) == 0 {
			delete(par.children, x.label[0])
		}
		if par.parent != nil && par.leafOf(tenant) {
			heap.Push(h, par)
		}
	}
	return removed
}

// sglLRU is a min-heap of a tenant's leaves by the tenant's access time.
type sglLRU struct {
	tenant int32
	nodes  []*sglNode
}

func (h *sglLRU) Len() int { return len(h.nodes) }
func (h *sglLRU) Less(i, j int) bool {
	a, _ := h.nodes[i].tenantAt(h.tenant)
	b, _ := h.nodes[j].tenantAt(h.tenant)
	return a < b
}
func (h *sglLRU) Swap(i, j int) { h.nodes[i], h.nodes[j] = h.nodes[j], h.nodes[i] }
func (h *sglLRU) Push(x any)    { h.nodes = append(h.nodes, x.(*sglNode)) }
func (h *sglLRU) Pop() any {
	x := h.nodes[len(h.nodes)-1]
	h.nodes = h.nodes[:len(h.nodes)-1]
	return x
}

// peerCommonPrefix returns the length of the common prefix of a and b,
// comparing 64-byte chunks with the runtime's vectorised string equality
// before falling back to bytes.
func peerCommonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i+64 <= n && a[i:i+64] == b[i:i+64] {
		i += 64
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// sglClone copies s so that a tree node does not pin the whole prompt it was
// cut from.
func sglClone(s string) string { return string([]byte(s)) }

// The helpers below are shared by the peer policies (sglang.go, llmd.go,
// dynamo.go, kubeai.go, preble.go).

// peerSet is a set of backend IDs that lives on the stack for fleets of up
// to 1,024 backends and spills to the heap beyond.
type peerSet struct {
	small [16]uint64
	big   []uint64
}

func (s *peerSet) fill(cands []*fleet.Backend) {
	for _, b := range cands {
		w := b.ID >> 6
		if s.big == nil && w >= len(s.small) {
			s.big = make([]uint64, w+1)
			copy(s.big, s.small[:])
		} else if s.big != nil && w >= len(s.big) {
			s.big = append(s.big, make([]uint64, w+1-len(s.big))...)
		}
		if s.big != nil {
			s.big[w] |= 1 << (b.ID & 63)
		} else {
			s.small[w] |= 1 << (b.ID & 63)
		}
	}
}

func (s *peerSet) has(id int) bool {
	w := id >> 6
	if s.big != nil {
		return w < len(s.big) && s.big[w]&(1<<(id&63)) != 0
	}
	return w < len(s.small) && s.small[w]&(1<<(id&63)) != 0
}

// peerRand is a seeded generator safe for concurrent use, for tie-breaks.
type peerRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newPeerRand(seed int64) *peerRand {
	return &peerRand{r: rand.New(rand.NewPCG(uint64(seed), 0x6b7672))}
}

// intn returns a uniform integer in [0, n).
func (p *peerRand) intn(n int) int {
	if n <= 1 {
		return 0
	}
	p.mu.Lock()
	v := p.r.IntN(n)
	p.mu.Unlock()
	return v
}

var (
	_ Policy   = (*SGLang)(nil)
	_ Observer = (*SGLang)(nil)
)
