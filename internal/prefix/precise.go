package prefix

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// Defaults of PreciseConfig.
const (
	// DefaultBlockTokens is vLLM's default KV block size in tokens.
	DefaultBlockTokens = 16
	// DefaultPreciseBlocks bounds the blocks kept per backend: about a
	// 1M-token cache per backend at 16-token blocks, several times what
	// one GPU holds.
	DefaultPreciseBlocks = 1 << 16
	// DefaultSpeculativeTTL is how long a routed request's blocks count as
	// held before the engine reports them (llm-d's figure).
	DefaultSpeculativeTTL = 2 * time.Second
	// DefaultStaleAfter is how long a backend may have requests routed to
	// it without a single event before its stream is no longer trusted.
	DefaultStaleAfter = 10 * time.Second
	// DefaultRetrust is how long a stream whose picture was lost (a gap,
	// or a first message from an engine that was already running) must
	// flow before it is trusted again: long enough for the blocks the
	// index never saw to be evicted or stored again.
	DefaultRetrust = 30 * time.Second
	// maxSpeculative bounds the speculative records kept per backend; the
	// oldest go first.
	maxSpeculative = 1024
	// maxLoras bounds the adapter names Salt remembers.
	maxLoras = 4096
)

// PreciseConfig tunes a Precise index; zero values are the defaults above.
type PreciseConfig struct {
	// BlockTokens is the block size, in tokens, of the router's keys. Events
	// of another block size are counted (Mismatched) and skipped.
	BlockTokens int
	// MaxBlocks bounds each backend's blocks; the least recently stored
	// are dropped (counted in Evicted).
	MaxBlocks      int
	SpeculativeTTL time.Duration
	StaleAfter     time.Duration
	Retrust        time.Duration
}

func (c PreciseConfig) withDefaults() PreciseConfig {
	if c.BlockTokens <= 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.MaxBlocks <= 0 {
		c.MaxBlocks = DefaultPreciseBlocks
	}
	if c.SpeculativeTTL <= 0 {
		c.SpeculativeTTL = DefaultSpeculativeTTL
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.Retrust <= 0 {
		c.Retrust = DefaultRetrust
	}
	return c
}

// HashTokens appends to dst the router's keys of the full blocks of
// blockTokens token ids and returns the extended slice: key i is a chained
// hash of key i-1 and block i's ids, the chain seeded by salt (the LoRA
// adapter's name, or a cache salt; "" for neither), so that equal keys at
// position i mean equal token prefixes through block i under the same
// salt. A trailing partial block is not hashed: engines cache full blocks
// only. Engines' own block hashes depend on their hash function and seed;
// these keys are the router's own, computed alike for a request's tokens
// and an event's.
func HashTokens(dst []uint64, tokens []uint32, blockTokens int, salt string) []uint64 {
	return chainTokens(dst, seedKey(salt), tokens, blockTokens)
}

// JoinSalt is the salt of a chain under a LoRA adapter (lora) and a
// cache salt (vLLM's cache_salt, or the router's per-key salt): each
// alone is itself, both are joined so that no other pair gives the same.
func JoinSalt(lora, cacheSalt string) string {
	switch {
	case cacheSalt == "":
		return lora
	case lora == "":
		return "\x00" + cacheSalt
	}
	return lora + "\x00" + cacheSalt
}

// seedKey is the parent key of a chain's first block, and the seed of
// the approximate index's digest.
func seedKey(salt string) uint64 {
	if salt == "" {
		return 0
	}
	return xxhash.Sum64String(salt)
}

// chainTokens appends the keys of tokens' full blocks, the first a child of
// parent.
func chainTokens(dst []uint64, parent uint64, tokens []uint32, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return dst
	}
	// One block's bytes: the parent key, then the ids, little-endian. A
	// block of up to 64 tokens is hashed from the stack in one call.
	var stack [8 + 4*64]byte
	buf := stack[:]
	if n := 8 + 4*blockTokens; n > len(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:8+4*blockTokens]
	for off := 0; off+blockTokens <= len(tokens); off += blockTokens {
		binary.LittleEndian.PutUint64(buf, parent)
		for i, t := range tokens[off : off+blockTokens] {
			binary.LittleEndian.PutUint32(buf[8+4*i:], t)
		}
		parent = xxhash.Sum64(buf)
		dst = append(dst, parent)
	}
	return dst
}

// Precise is the router's exact picture of the backends' KV caches, built
// from the engines' own KV cache events (package kvevents) rather than from
// the router's routing history. Blocks are keyed by the router's chained
// hash over their token ids (HashTokens), and each backend keeps a map from
// its engine's block hash to that key, to apply BlockRemoved and to chain a
// stored block to its parent. Each backend holds at most MaxBlocks blocks,
// the least recently stored dropped first.
//
// Between the routing of a request and its engine's report of the blocks
// it stored, the request's blocks count as held by the backend it was
// routed to (speculative entries, SpeculativeTTL long), so that a burst of
// requests sharing a prefix lands together before the first one's events
// arrive.
//
// A backend's picture is trusted, and Match reports it, only while its
// stream is known to be whole: from its first event after Reset(empty)
// (the engine started with an empty cache), or after Retrust of events
// when the index joined a running engine or lost messages (Reset(false)),
// and as long as requests routed to it are followed by events within
// StaleAfter. Untrusted backends are matched on the approximate Index by
// the caller.
//
// Match, the routing hot path, takes two read locks and does not allocate.
type Precise struct {
	cfg PreciseConfig
	// blocks holds the confirmed blocks: engine-reported, keyed by the
	// router's keys, with its per-backend capacity as the bound.
	blocks *Index
	// gpu and fast hold, of blocks, those on a backend's GPU and those on
	// its GPU or in its host memory: kept from the first event of a lower
	// tier on (tiered), for MatchTiers.
	gpu, fast *Index
	tiered    atomic.Bool

	mu      sync.RWMutex
	streams []stream
	// loras are the LoRA adapter names events have carried (see Salt).
	loras map[string]struct{}
}

// stream is one backend's event stream and what it said.
type stream struct {
	// eng maps the engine's block hash to the block's key and the number
	// of media (GPU, CPU, ...) it is stored in.
	eng map[uint64]engBlock
	// started: a Reset or event was seen since the index began or the
	// backend was forgotten.
	started bool
	// trustAt is when the picture becomes trustworthy (zero: once the
	// first event arrives after Reset(empty)).
	trustAt time.Time
	// flowing: an event arrived since trustAt was set.
	flowing bool
	// pending is when the first request routed since the last event was
	// routed (zero when none is waiting for events).
	pending time.Time
	spec    []specRecord // oldest first
	stats   PreciseStats
}

// engBlock is one engine block: its key and the tiers holding it, one bit
// per Tier.
type engBlock struct {
	key   uint64
	media uint8
}

// on reports whether b is held on tier t.
func (b engBlock) on(t Tier) bool { return b.media&(1<<t) != 0 }

// specRecord is one routed request's blocks, held until until.
type specRecord struct {
	keys  []uint64
	until time.Time
}

// PreciseStats counts what one backend's events did.
type PreciseStats struct {
	Stored, Removed, Cleared uint64 // events applied, by kind
	// Orphans are stored blocks whose parent the index does not know
	// (stored before the index joined, or dropped); they are skipped, as
	// no request's chain can reach them.
	Orphans uint64
	// Mismatched are BlockStored events of another block size.
	Mismatched uint64
	// UnknownRemoved are removed hashes the index never saw stored.
	UnknownRemoved uint64
	// Resets are pictures dropped by Reset (gaps, restarts).
	Resets uint64
	// Evicted are blocks dropped for MaxBlocks.
	Evicted uint64
	// Blocks is the number of blocks held now.
	Blocks int
	// Trusted says whether Match reports this backend (at the time given
	// to Stats).
	Trusted bool
}

// NewPrecise returns an empty precise index.
func NewPrecise(cfg PreciseConfig) *Precise {
	cfg = cfg.withDefaults()
	return &Precise{cfg: cfg, blocks: NewIndex(cfg.MaxBlocks)}
}

// BlockTokens is the block size in tokens that request keys must be
// hashed with (HashTokens).
func (p *Precise) BlockTokens() int { return p.cfg.BlockTokens }

// stream returns backend's stream, growing the table. p.mu is held for
// writing.
func (p *Precise) stream(backend int) *stream {
	for len(p.streams) <= backend {
		p.streams = append(p.streams, stream{})
	}
	st := &p.streams[backend]
	if st.eng == nil {
		st.eng = make(map[uint64]engBlock)
	}
	return st
}

// Reset drops everything backend's events said, as after a gap in its
// stream or an engine restart. empty says that the engine's cache is empty
// now (it restarted, or its stream begins at its start): the picture is
// then trusted from the next event on. Otherwise the engine holds blocks
// the index will never hear of, and the backend is matched approximately
// until its events have flowed for Retrust.
func (p *Precise) Reset(backend int, empty bool, now time.Time) {
	if backend < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stream(backend)
	if st.started {
		st.stats.Resets++
	}
	p.drop(backend, st)
	st.started = true
	st.flowing = false
	st.pending = time.Time{}
	if empty {
		st.trustAt = time.Time{}
	} else {
		st.trustAt = now.Add(p.cfg.Retrust)
	}
}

// Silent marks backend's stream as silent (its subscriber heard nothing
// for its timeout, or lost its connection): the backend is matched
// approximately until its next event. Its entries are kept: nothing says
// they are wrong.
func (p *Precise) Silent(backend int) {
	if backend < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if backend < len(p.streams) {
		p.streams[backend].flowing = false
	}
}

// Forget drops backend entirely (it was removed from the fleet): it is
// untrusted until it is Reset or sends events again.
func (p *Precise) Forget(backend int) {
	if backend < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if backend >= len(p.streams) {
		return
	}
	st := &p.streams[backend]
	p.drop(backend, st)
	*st = stream{stats: PreciseStats{Resets: st.stats.Resets}}
}

// drop forgets backend's blocks and speculative records. p.mu is held.
func (p *Precise) drop(backend int, st *stream) {
	p.blocks.RemoveBackend(backend)
	if p.gpu != nil {
		p.gpu.RemoveBackend(backend)
		p.fast.RemoveBackend(backend)
	}
	clear(st.eng)
	clear(st.spec)
	st.spec = st.spec[:0]
}

// Apply applies one message's events from backend's stream, received at
// now. The stream counts as flowing from then on.
func (p *Precise) Apply(backend int, events []kvevents.Event, now time.Time) {
	if backend < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stream(backend)
	if !st.started {
		// The first word from an engine that may have been running for
		// a while: its older blocks are unknown.
		st.started = true
		st.trustAt = now.Add(p.cfg.Retrust)
	}
	st.flowing = true
	st.pending = time.Time{}
	var keys []uint64
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			keys = p.store(backend, st, ev, keys[:0])
		case kvevents.BlockRemoved:
			st.stats.Removed++
			p.remove(backend, st, ev.BlockHashes, ev.Medium)
		case kvevents.AllBlocksCleared:
			st.stats.Cleared++
			p.drop(backend, st)
		}
	}
	if len(st.eng) > 2*p.cfg.MaxBlocks {
		p.prune(backend, st)
	}
}

// store applies one BlockStored; keys is scratch. A BlockStored without
// token ids (vLLM's OffloadingConnector, SGLang's hierarchical cache:
// blocks copied to another tier) says where blocks already reported are
// now held too; its block size is not the blocks' (vLLM sends 0).
func (p *Precise) store(backend int, st *stream, ev *kvevents.Event, keys []uint64) []uint64 {
	tier := TierOf(ev.Medium)
	if tier != TierGPU && !p.tiered.Load() {
		p.startTiers()
	}
	if len(ev.TokenIDs) == 0 {
		st.stats.Stored++
		for _, h := range ev.BlockHashes {
			b, ok := st.eng[h]
			if !ok {
				st.stats.Orphans++
				continue
			}
			b.media |= 1 << tier
			st.eng[h] = b
			p.placed(backend, b)
		}
		return keys
	}
	bs := p.cfg.BlockTokens
	if ev.BlockSize != bs {
		st.stats.Mismatched++
		return keys
	}
	st.stats.Stored++
	if ev.LoraName != "" {
		if p.loras == nil {
			p.loras = make(map[string]struct{})
		}
		if len(p.loras) < maxLoras {
			p.loras[ev.LoraName] = struct{}{}
		}
	}
	parent := rootKey(ev)
	if ev.HasParent {
		pb, ok := st.eng[ev.Parent]
		if !ok {
			st.stats.Orphans += uint64(len(ev.BlockHashes))
			return keys
		}
		parent = pb.key
	}
	keys = chainTokens(keys, parent, ev.TokenIDs, bs)
	n := min(len(keys), len(ev.BlockHashes))
	before := p.blocks.Evicted(backend)
	for i, h := range ev.BlockHashes[:n] {
		b := st.eng[h]
		if b.media != 0 && b.key != keys[i] {
			// The engine reused a hash for other tokens: the old block
			// is gone from its cache.
			p.forget(backend, b.key)
			b.media = 0
		}
		b.key = keys[i]
		b.media |= 1 << tier
		st.eng[h] = b
	}
	p.blocks.Insert(backend, keys[:n])
	if p.tiered.Load() {
		for _, h := range ev.BlockHashes[:n] {
			p.placed(backend, st.eng[h])
		}
	}
	st.stats.Evicted += p.blocks.Evicted(backend) - before
	return keys
}

// startTiers begins keeping the gpu and fast indexes, from the blocks every
// stream holds now. p.mu is held for writing.
func (p *Precise) startTiers() {
	p.gpu, p.fast = NewIndex(p.cfg.MaxBlocks), NewIndex(p.cfg.MaxBlocks)
	for backend := range p.streams {
		for _, b := range p.streams[backend].eng {
			p.placed(backend, b)
		}
	}
	p.tiered.Store(true)
}

// placed records in the gpu and fast indexes where b is held now. p.mu is
// held for writing.
func (p *Precise) placed(backend int, b engBlock) {
	if p.gpu == nil {
		return
	}
	if b.on(TierGPU) {
		p.gpu.Insert(backend, []uint64{b.key})
	} else {
		p.gpu.Remove(backend, b.key)
	}
	if b.on(TierGPU) || b.on(TierCPU) {
		p.fast.Insert(backend, []uint64{b.key})
	} else {
		p.fast.Remove(backend, b.key)
	}
}

// forget drops key from every index of backend. p.mu is held for writing.
func (p *Precise) forget(backend int, key uint64) {
	p.blocks.Remove(backend, key)
	if p.gpu != nil {
		p.gpu.Remove(backend, key)
		p.fast.Remove(backend, key)
	}
}

// rootKey is the parent key of the chain of a BlockStored without a
// parent: the first block of a request's chain, seeded by its LoRA
// adapter and, as vLLM salts it, by the request's cache_salt, which its
// extra_keys carry.
func rootKey(ev *kvevents.Event) uint64 {
	if len(ev.ExtraKeys) > 0 {
		return seedKey(JoinSalt(ev.LoraName, kvevents.CacheSalt(ev.ExtraKeys[0], ev.LoraName)))
	}
	return seedKey(ev.LoraName)
}

// remove applies one BlockRemoved from medium: a block removed from its
// GPU while held in host memory is a CPU block, and so on; one removed
// from every tier is gone.
func (p *Precise) remove(backend int, st *stream, hashes []uint64, medium string) {
	tier := TierOf(medium)
	for _, h := range hashes {
		b, ok := st.eng[h]
		if !ok {
			st.stats.UnknownRemoved++
			continue
		}
		if b.media &^= 1 << tier; b.media != 0 {
			// Still held on another tier (e.g. offloaded to CPU).
			st.eng[h] = b
			p.placed(backend, b)
			continue
		}
		delete(st.eng, h)
		p.forget(backend, b.key)
	}
}

// prune drops the engine hashes whose blocks were evicted for MaxBlocks,
// so that the map stays bounded like the blocks.
func (p *Precise) prune(backend int, st *stream) {
	for h, b := range st.eng {
		if !p.blocks.Holds(backend, b.key) {
			delete(st.eng, h)
			if p.gpu != nil {
				p.gpu.Remove(backend, b.key)
				p.fast.Remove(backend, b.key)
			}
		}
	}
}

// Speculate records that a request with keys was routed to backend at now:
// its blocks count as held there for SpeculativeTTL, or until its events
// arrive. keys is kept: the caller must not modify it afterwards.
func (p *Precise) Speculate(backend int, keys []uint64, now time.Time) {
	if backend < 0 || len(keys) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stream(backend)
	if st.pending.IsZero() {
		st.pending = now
	}
	// Keep the live records that the new one does not cover (a record
	// whose keys are a prefix of the new keys says nothing more, and its
	// time is up first), and at most maxSpeculative-1 of them, the oldest
	// dropped: Match reads every record, and a burst of one prompt is then
	// one record.
	kept := st.spec[:0]
	for i, r := range st.spec {
		if r.until.After(now) && len(st.spec)-i < maxSpeculative && commonPrefix(keys, r.keys, 0) < len(r.keys) {
			kept = append(kept, r)
		}
	}
	clear(st.spec[len(kept):])
	st.spec = append(kept, specRecord{keys: keys, until: now.Add(p.cfg.SpeculativeTTL)})
}

// trusted reports whether st's picture is trustworthy at now. p.mu is held.
func (p *Precise) trusted(st *stream, now time.Time) bool {
	if !st.started || !st.flowing || now.Before(st.trustAt) {
		return false
	}
	return st.pending.IsZero() || now.Sub(st.pending) <= p.cfg.StaleAfter
}

// Match sets, for every backend b < len(out), trusted[b] to whether its
// picture is trusted at now and, when it is, out[b] to the number of
// leading blocks of keys (HashTokens) it holds or, speculatively, is about
// to hold. out[b] is 0 for untrusted backends. len(trusted) must be at
// least len(out). It does not allocate.
func (p *Precise) Match(keys []uint64, now time.Time, out []int32, trusted []bool) {
	p.blocks.Match(keys, out)
	p.mu.RLock()
	defer p.mu.RUnlock()
	for b := range out {
		if b >= len(p.streams) || !p.trusted(&p.streams[b], now) {
			trusted[b] = false
			out[b] = 0
			continue
		}
		trusted[b] = true
		for _, r := range p.streams[b].spec {
			if r.until.After(now) {
				out[b] = max(out[b], int32(commonPrefix(keys, r.keys, int(out[b]))))
			}
		}
	}
}

// Tiered reports whether any engine has reported a block on a tier other
// than its GPU: until then every match is on the GPU, and MatchTiers need
// not be asked.
func (p *Precise) Tiered() bool { return p.tiered.Load() }

// MatchTiers sets out[b], for every trusted backend b (trusted as Match
// set it), to how many of the leading blocks of keys Match counted are on
// each tier (prefix.MatchTiers): a backend's speculative blocks count on
// its GPU, where the request routed there puts them. It does not allocate
// for fleets of up to 2,048 backends.
func (p *Precise) MatchTiers(keys []uint64, now time.Time, trusted []bool, out []Tiers) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	MatchTiers(keys, []*Index{p.gpu, p.fast, p.blocks}, out)
	for b := range out {
		if b >= len(p.streams) || !trusted[b] {
			out[b] = Tiers{}
			continue
		}
		spec := int32(0)
		for _, r := range p.streams[b].spec {
			if r.until.After(now) {
				spec = max(spec, int32(commonPrefix(keys, r.keys, 0)))
			}
		}
		if spec > out[b][TierGPU] {
			// Speculation covers the first spec blocks: on the GPU.
			t := out[b]
			rest := max(t.Total(), spec) - spec
			out[b] = Tiers{spec, 0, 0}
			lower := t[TierCPU] + t[TierGPU] - spec
			out[b][TierCPU] = min(max(lower, 0), rest)
			out[b][TierDisk] = rest - out[b][TierCPU]
		}
	}
}

// commonPrefix returns the number of leading keys a and b share, or from
// if that is more. Keys are chained, so a[i] == b[i] implies they share
// every earlier key: a binary search finds the last equal one.
func commonPrefix(a, b []uint64, from int) int {
	lo, hi := from, min(len(a), len(b)) // a[:lo] == b[:lo]; a[hi:] differs
	if lo >= hi || a[lo] != b[lo] {
		return lo
	}
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1) // a[mid-1] == b[mid-1]?
		if a[mid-1] == b[mid-1] {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// Salt returns the salt of a request for model: model itself when the
// engines' events have named it as a LoRA adapter (vLLM serves an adapter
// under its name, and salts its blocks with it), else "" (a base model).
func (p *Precise) Salt(model string) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if _, ok := p.loras[model]; ok {
		return model
	}
	return ""
}

// Stats returns backend's counters at now.
func (p *Precise) Stats(backend int, now time.Time) PreciseStats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if backend < 0 || backend >= len(p.streams) {
		return PreciseStats{}
	}
	st := &p.streams[backend]
	s := st.stats
	s.Blocks = p.blocks.Len(backend)
	s.Trusted = p.trusted(st, now)
	return s
}
