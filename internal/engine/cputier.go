package engine

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// The CPU tier, after vLLM's OffloadingConnector with its CPU backend and
// LRU manager (vllm/distributed/kv_transfer/kv_connector/v1/offloading and
// vllm/v1/kv_offload):
//
//   - Every prompt block the engine makes findable in its GPU prefix cache
//     is also stored to the CPU tier (the connector stores each computed
//     block), which keeps the CPUBlocks most recently stored or touched
//     blocks, evicting its least recently used. A block evicted from the
//     GPU later is thus still on the CPU: the tier is where GPU evictions
//     land.
//   - A request admitted with its GPU prefix hits followed by blocks the
//     CPU tier holds loads those blocks (vLLM's get_num_new_matched_tokens
//     from the first block past the local hits, loaded asynchronously): it
//     allocates GPU blocks for them and waits, using none of the step's
//     token budget, HostLoadPerToken per loaded token; then it is
//     scheduled with them counted as computed, and the loaded blocks are
//     registered in the GPU prefix cache like computed ones (a BlockStored
//     on GPU). Its CachedTokens are its GPU hits plus the loaded tokens, as
//     vLLM's num_cached_tokens counts local and external hits alike; the
//     engine's PrefixHits count the GPU hits only (vLLM's
//     prefix_cache_hits), ExternalHits the loaded tokens (vLLM's
//     external_prefix_cache_hits).
//   - Events as the connector's take_events yields them, after the GPU
//     block pool's in each batch: a BlockStored of medium "CPU" carrying
//     the block hashes only (no parent, no token ids, block_size 0), a
//     BlockRemoved of medium "CPU" when the tier evicts.

// mediumCPU is vLLM's medium for blocks in the offloading connector's CPU
// tier (vllm/distributed/kv_events.py, MEDIUM_CPU).
const mediumCPU = "CPU"

// WithCPUTier returns p with a CPU tier of blocks blocks (0: none), as
// vLLM's OffloadingConnector's num_cpu_blocks sets it.
func (p Preset) WithCPUTier(blocks int) (Preset, error) {
	if blocks < 0 {
		return Preset{}, fmt.Errorf("cpu-kv-blocks must be at least 0, got %d", blocks)
	}
	p.CPUBlocks = blocks
	return p, nil
}

// cpuTier is an LRU set of block hashes of fixed capacity: slots in an
// array, an intrusive doubly linked list (head = least recently used) and
// a map from hash to slot.
type cpuTier struct {
	slot       map[uint64]int32
	hash       []uint64
	prev, next []int32 // index len(hash) is the sentinel
	used       int
}

func newCPUTier(n int) *cpuTier {
	t := &cpuTier{
		slot: make(map[uint64]int32),
		hash: make([]uint64, n),
		prev: make([]int32, n+1),
		next: make([]int32, n+1),
	}
	s := int32(n)
	t.prev[s], t.next[s] = s, s
	return t
}

func (t *cpuTier) sentinel() int32 { return int32(len(t.hash)) }

func (t *cpuTier) unlink(i int32) {
	p, n := t.prev[i], t.next[i]
	t.next[p], t.prev[n] = n, p
}

func (t *cpuTier) pushBack(i int32) {
	s := t.sentinel()
	last := t.prev[s]
	t.next[last], t.prev[i] = i, last
	t.next[i], t.prev[s] = s, i
}

// has reports whether the tier holds h.
func (t *cpuTier) has(h uint64) bool {
	_, ok := t.slot[h]
	return ok
}

// touch makes h, if held, the most recently used.
func (t *cpuTier) touch(h uint64) {
	if i, ok := t.slot[h]; ok {
		t.unlink(i)
		t.pushBack(i)
	}
}

// store adds h as the most recently used (a touch if it is held already);
// it returns the hash it evicted for room, if any, and whether h is new.
func (t *cpuTier) store(h uint64) (evicted uint64, didEvict, added bool) {
	if i, ok := t.slot[h]; ok {
		t.unlink(i)
		t.pushBack(i)
		return 0, false, false
	}
	var i int32
	if t.used < len(t.hash) {
		i = int32(t.used)
		t.used++
	} else {
		i = t.next[t.sentinel()]
		t.unlink(i)
		evicted, didEvict = t.hash[i], true
		delete(t.slot, evicted)
	}
	t.hash[i] = h
	t.slot[h] = i
	t.pushBack(i)
	return evicted, didEvict, true
}

// reset empties the tier.
func (t *cpuTier) reset() {
	clear(t.slot)
	s := t.sentinel()
	t.prev[s], t.next[s] = s, s
	t.used = 0
}

// offload stores h, just made findable on the GPU, in the CPU tier,
// recording the connector's events when they are on.
func (e *Engine) offload(h uint64) {
	ev, didEvict, added := e.cpu.store(h)
	if !e.kvEvents {
		return
	}
	if didEvict {
		e.recordCPU(kvevents.BlockRemoved, ev)
	}
	if added {
		e.recordCPU(kvevents.BlockStored, h)
	}
}

// recordCPU records one connector event of kind for h, joined to the last
// one when it is of the same kind.
func (e *Engine) recordCPU(kind kvevents.Kind, h uint64) {
	if n := len(e.cpuEvents); n > 0 && e.cpuEvents[n-1].Kind == kind {
		e.cpuEvents[n-1].BlockHashes = append(e.cpuEvents[n-1].BlockHashes, h)
		return
	}
	e.cpuEvents = append(e.cpuEvents, kvevents.Event{Kind: kind, BlockHashes: []uint64{h}, Medium: mediumCPU})
}

// cpuHits is how many blocks of r's chain from block from on, below
// maxHit, the CPU tier holds.
func (e *Engine) cpuHits(r *Request, from, maxHit int) int {
	if e.cpu == nil || r.RemotePrefill && !r.received {
		return 0
	}
	n := 0
	for i := from; i < maxHit && e.cpu.has(r.hashes[i]); i++ {
		n++
	}
	return n
}

// touchCPU marks the CPU copies of r's first n blocks as recently used, as
// the connector's lookup touches a request's blocks.
func (e *Engine) touchCPU(r *Request, n int) {
	for _, h := range r.hashes[:n] {
		e.cpu.touch(h)
	}
}

// startLoad parks r, admitted at now with its GPU hits and blocks for its
// loaded tokens allocated, until the CPU tier's blocks are on the GPU.
func (e *Engine) startLoad(r *Request, hitTokens, loadTokens int, now time.Duration) {
	r.state = stateRemote
	r.loadTo = hitTokens + loadTokens
	r.KVReadyAt = now + time.Duration(loadTokens)*e.p.HostLoadPerToken
	e.stats.HostLoadTime += r.KVReadyAt - now
	if !r.cachedSet {
		r.ScheduledAt = now
		e.stats.PrefixQueries += int64(r.PromptTokens)
		e.stats.PrefixHits += int64(hitTokens)
		e.stats.ExternalQueries += int64(r.PromptTokens - hitTokens)
		e.stats.ExternalHits += int64(loadTokens)
	}
	e.remote = append(e.remote, r)
}

// scheduleLoaded schedules r, whose CPU blocks are loaded, as a running
// request with them computed, and a chunk of the rest in this step.
func (e *Engine) scheduleLoaded(r *Request, now time.Duration) {
	r.computed = r.loadTo
	r.loadTo = 0
	if !r.cachedSet {
		r.cachedSet = true
		r.CachedTokens = r.computed
	}
	e.loraStart(r, now)
	r.state = stateRunning
	e.running = append(e.running, r)
	e.schedule(r, min(r.tokens()-r.computed, e.budget), false)
}
