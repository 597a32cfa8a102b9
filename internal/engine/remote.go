package engine

import (
	"cmp"
	"time"
)

// Remote prefill, after vLLM v1 with a KV connector such as NixlConnector
// (vllm/v1/core/sched/scheduler.py and the connector's scheduler side):
//
//   - A decode engine admits a RemotePrefill request like any other, taking
//     its own cached prefix blocks (which need no transfer), but then
//     allocates blocks for the whole prompt, uses none of the step's token
//     budget, and parks the request "waiting for remote KVs" with those
//     blocks (vLLM's WAITING_FOR_REMOTE_KVS; the connector asks for the
//     prompt less the local hits: get_num_new_matched_tokens).
//   - The transfer of TransferredTokens tokens takes KVTransferLatency +
//     KVTransferPerToken x TransferredTokens from the step that admitted
//     the request. At the first step that starts once it is done, the
//     request's prompt counts as computed but for its last token (vLLM's
//     _update_waiting_for_remote_kv: num_computed_tokens is the prompt less
//     one, so that the decode engine has logits to sample its own first
//     token from), its full blocks are registered in the prefix cache (a
//     BlockStored; later requests hit them), and it is scheduled ahead of
//     the waiting queue with that one token: it produces its first token at
//     the end of that step and decodes from there. Its CachedTokens are the
//     prompt less one, as vLLM reports them (num_cached_tokens is the
//     computed tokens at its first schedule).
//   - A waiting-for-KV request is counted in Stats.Waiting (vLLM keeps it in
//     its waiting queue), not against MaxNumSeqs. Should it be preempted
//     later, it is recomputed locally like any other (the connector does
//     not load a request twice).
//   - A HoldKV request (a prefill engine's do_remote_decode request) keeps
//     its blocks when it finishes, registered and referenced, until the
//     driver calls ReleaseKV (the decode engine read them) or its
//     HoldTimeout passes (KVHoldTimeout by default: vLLM's
//     VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
//
// An engine waiting only for transfers or holds has nothing to step:
// Step returns 0, and Wake says when to step it next.

// KVHoldTimeout is how long a prefill engine keeps a finished HoldKV
// request's blocks for a decode engine that never reads them: vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT default, 480 s.
const KVHoldTimeout = 480 * time.Second

// startTransfer parks r, admitted at now with hitTokens of its prompt
// found in the prefix cache and blocks for the rest allocated, until its
// remote KV cache arrives.
func (e *Engine) startTransfer(r *Request, hitTokens int, now time.Duration) {
	r.state = stateRemote
	r.TransferredTokens = r.PromptTokens - hitTokens
	r.KVReadyAt = now + e.p.KVTransferLatency + time.Duration(r.TransferredTokens)*e.p.KVTransferPerToken
	if !r.cachedSet {
		r.cachedSet = true
		e.stats.PrefixQueries += int64(r.PromptTokens)
		e.stats.PrefixHits += int64(hitTokens)
	}
	e.remote = append(e.remote, r)
}

// scheduleReceived schedules, in admission order, the requests whose remote
// KV cache has arrived by now while MaxNumSeqs and the budget allow (one
// token each); a request whose adapter would be one too many waits.
func (e *Engine) scheduleReceived(now time.Duration) {
	kept := e.remote[:0]
	for i, r := range e.remote {
		if r.KVReadyAt > now || !e.loraAdmits(r) {
			kept = append(kept, r)
			continue
		}
		if len(e.running) >= e.p.MaxNumSeqs || e.budget < 1 {
			kept = append(kept, e.remote[i:]...)
			break
		}
		if r.loadTo > 0 {
			// Loaded from the CPU tier, not a remote prefill (cputier.go).
			e.scheduleLoaded(r, now)
			continue
		}
		r.received = true
		r.computed = r.PromptTokens - 1
		r.CachedTokens = r.computed
		r.ScheduledAt = now
		e.stats.KVTransferTokens += int64(r.TransferredTokens)
		e.loraStart(r, now)
		r.state = stateRunning
		e.running = append(e.running, r)
		e.commit(r, 1, false)
	}
	clear(e.remote[len(kept):])
	e.remote = kept
}

// hold keeps finished request r's blocks for a decode engine to read.
func (e *Engine) hold(r *Request, at time.Duration) {
	e.loraStop(r)
	r.state = stateHeld
	r.holdUntil = at + cmp.Or(r.HoldTimeout, KVHoldTimeout)
	e.held = append(e.held, r)
}

// ReleaseKV frees the blocks a finished HoldKV request kept (the decode
// engine has read them); nothing for a request that holds none. Freed
// blocks may let a waiting request in: the driver steps the engine again.
func (e *Engine) ReleaseKV(r *Request) {
	if r.state != stateHeld {
		return
	}
	e.held = removeReq(e.held, r)
	e.retire(r)
}

// expireHolds releases the holds that timed out by now.
func (e *Engine) expireHolds(now time.Duration) {
	if len(e.held) == 0 {
		return
	}
	kept := e.held[:0]
	for _, r := range e.held {
		if r.holdUntil > now {
			kept = append(kept, r)
			continue
		}
		e.retire(r)
	}
	clear(e.held[len(kept):])
	e.held = kept
}

// Wake returns the earliest instant at which the engine changes by itself:
// a remote KV transfer completes or a hold times out; false when none is
// pending. A driver whose Step returned 0 steps the engine again then (or
// at the next Add, whichever is first). After a Step at now that returned
// 0, Wake is later than now.
func (e *Engine) Wake() (time.Duration, bool) {
	var at time.Duration
	ok := false
	for _, r := range e.remote {
		if !ok || r.KVReadyAt < at {
			at, ok = r.KVReadyAt, true
		}
	}
	for _, r := range e.held {
		if !ok || r.holdUntil < at {
			at, ok = r.holdUntil, true
		}
	}
	return at, ok
}

// BlockIDs appends the ids of the KV cache blocks r holds, in prompt
// order, to dst: after a HoldKV request finished, the blocks a decode
// engine reads (vLLM's remote_block_ids); none once they are released.
func (r *Request) BlockIDs(dst []int) []int {
	for _, b := range r.blocks {
		dst = append(dst, int(b))
	}
	return dst
}

// removeReq deletes r from list, keeping the order of the others.
func removeReq(list []*Request, r *Request) []*Request {
	for i, x := range list {
		if x == r {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}
