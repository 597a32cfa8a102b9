package engine

import "github.com/kvroute/kvroute/internal/kvevents"

// The engine's KV cache events, as vLLM's block pool emits them: a
// BlockStored when prompt blocks become findable in the prefix cache, a
// BlockRemoved when a cached block is evicted for new data, an
// AllBlocksCleared when the prefix cache is reset. Block hashes are the
// engine's own (prefix.Hash of the prompt text in blocks of BlockSize
// tokens), parents chain them in prompt order, token ids are TokenIDs of
// the block's text. The engine only records them; the driver takes them
// after each step and publishes or delivers them.

// mediumGPU is vLLM's medium for blocks in the GPU's KV cache.
const mediumGPU = "GPU"

// SetKVEvents turns the recording of KV cache events on or off. Off (the
// default), the engine records nothing and costs nothing extra; turning it
// off drops what was not taken yet.
func (e *Engine) SetKVEvents(on bool) {
	e.kvEvents = on
	if !on {
		clear(e.events)
		e.events = e.events[:0]
		clear(e.cpuEvents)
		e.cpuEvents = e.cpuEvents[:0]
	}
}

// TakeKVEvents appends the events recorded since the last call to dst, in
// the order they happened, and returns it. The events and their slices
// belong to the caller from then on (the engine never touches them again),
// so a driver may hold them, for instance to deliver them later in virtual
// time. A driver calls it after each Step (and after ResetPrefixCache).
//
// The CPU tier's events (cputier.go) follow the GPU's, as vLLM appends its
// KV connector's events to its block pool's in each batch.
func (e *Engine) TakeKVEvents(dst []kvevents.Event) []kvevents.Event {
	dst = append(dst, e.events...)
	clear(e.events)
	e.events = e.events[:0]
	dst = append(dst, e.cpuEvents...)
	clear(e.cpuEvents)
	e.cpuEvents = e.cpuEvents[:0]
	return dst
}

// ResetPrefixCache drops every block's hash from the prefix cache, as
// vLLM's reset_prefix_cache does, and records one AllBlocksCleared. Blocks
// held by running requests stay with them but are no longer shared. An
// engine restart is modelled by aborting every request, then
// ResetPrefixCache (a restarted vLLM also restarts its event sequence
// numbers, which is the publisher's business, not the engine's).
//
// The CPU tier is emptied too (a restarted engine's host memory is new);
// the one AllBlocksCleared, which names no medium, says so.
func (e *Engine) ResetPrefixCache() {
	e.kv.reset()
	if e.cpu != nil {
		e.cpu.reset()
		clear(e.cpuEvents)
		e.cpuEvents = e.cpuEvents[:0]
	}
	if e.kvEvents {
		e.events = append(e.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
}

// alloc takes a block for new data, recording the eviction of the cached
// block it reuses.
func (e *Engine) alloc() int32 {
	if e.kvEvents {
		if h, ok := e.kv.evictee(); ok {
			e.recordRemoved(h)
		}
	}
	return e.kv.alloc()
}

// recordRemoved records the eviction of h. Consecutive evictions share one
// BlockRemoved (vLLM sends one per block; the list form says the same).
func (e *Engine) recordRemoved(h uint64) {
	if n := len(e.events); n > 0 && e.events[n-1].Kind == kvevents.BlockRemoved {
		e.events[n-1].BlockHashes = append(e.events[n-1].BlockHashes, h)
		return
	}
	e.events = append(e.events, kvevents.Event{
		Kind:        kvevents.BlockRemoved,
		BlockHashes: []uint64{h},
		Medium:      mediumGPU,
	})
}

// registerRecorded registers r's prompt blocks r.registered..full-1 and
// records one BlockStored per run of blocks it made findable: a block
// another block already holds is not stored again, which ends the run.
func (e *Engine) registerRecorded(r *Request, full int) {
	const blockBytes = BlockSize * BytesPerToken
	ev := -1 // index of the open BlockStored in e.events
	for i := r.registered; i < full; i++ {
		if !e.kv.register(r.blocks[i], r.hashes[i]) {
			ev = -1
			continue
		}
		if e.cpu != nil {
			e.offload(r.hashes[i])
		}
		if ev < 0 {
			// vLLM names a block's adapter in lora_name.
			st := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: BlockSize, Medium: mediumGPU, LoraName: r.Adapter}
			if i > 0 {
				st.Parent, st.HasParent = r.hashes[i-1], true
			} else if r.CacheSalt != "" {
				// vLLM: the salt is an extra key of the first block.
				st.ExtraKeys = [][]byte{kvevents.CacheSaltKeys(r.CacheSalt)}
			}
			e.events = append(e.events, st)
			ev = len(e.events) - 1
		}
		st := &e.events[ev]
		if st.ExtraKeys != nil && len(st.ExtraKeys) == len(st.BlockHashes) {
			st.ExtraKeys = append(st.ExtraKeys, nil) // one entry a block
		}
		st.BlockHashes = append(st.BlockHashes, r.hashes[i])
		st.TokenIDs = TokenIDs(st.TokenIDs, r.Prompt[i*blockBytes:(i+1)*blockBytes])
	}
}
