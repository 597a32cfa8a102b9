// Package engine is the model of an LLM inference engine in the manner of
// vLLM v1: continuous batching with caps on running sequences and on tokens
// per step (chunked prefill), a FIFO waiting queue, a paged KV cache of
// 16-token blocks with automatic prefix caching (blocks identified by a hash
// chain, unreferenced blocks kept until evicted LRU), preemption by
// recomputation, and a per-step timing model.
//
// It is a pure state machine over a clock it is given: Step(now) runs one
// scheduler iteration and says how long it takes. The HTTP emulator
// (package emulator) drives it in real time and the simulator (package sim)
// in virtual time; there is no other copy of the engine model. It does no
// I/O, never sleeps, starts no goroutine, and is not safe for concurrent use.
package engine

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// BlockSize is the KV cache block size in tokens.
const BlockSize = 16

// BytesPerToken is the deterministic tokenizer's token size: a prompt of n
// bytes is ceil(n/4) tokens, each the next 4 bytes, so two prompts that share
// a text prefix share a token prefix. It is the router's estimate
// (request.BytesPerToken), which is therefore exact for this engine.
const BytesPerToken = request.BytesPerToken

// Preset is a named hardware and model setup with its timing model.
type Preset struct {
	Name  string
	Model string // served model name
	// KVBlocks is the KV cache capacity in blocks of BlockSize tokens.
	KVBlocks int
	// MaxNumSeqs caps running sequences; MaxBatchedTokens caps tokens per
	// step; MaxModelLen is the context length.
	MaxNumSeqs, MaxBatchedTokens, MaxModelLen int
	// Step time = StepOverhead + PerPrefillToken*prefill tokens +
	// PerDecodeSeq*decoding sequences + PerContextToken*context tokens read
	// by attention.
	StepOverhead, PerPrefillToken, PerDecodeSeq, PerContextToken time.Duration
	// MaxLoras is vLLM's --max-loras: the cap on distinct LoRA adapters in
	// a batch, and the adapters resident at once; 0 serves no adapters
	// (lora.go). LoRALoad is the time one adapter's load adds to a step.
	MaxLoras int
	LoRALoad time.Duration
	// A prompt's KV cache received from a prefill engine (remote.go)
	// arrives KVTransferLatency + KVTransferPerToken x its transferred
	// tokens after the transfer starts.
	KVTransferLatency, KVTransferPerToken time.Duration
	// CPUBlocks is the capacity, in blocks of BlockSize tokens, of the
	// CPU tier GPU blocks are offloaded to (cputier.go); 0 for none, as
	// vLLM without an offloading connector. HostLoadPerToken is the time
	// to load one token's KV cache from it to the GPU (the host-to-device
	// link's bandwidth).
	CPUBlocks        int
	HostLoadPerToken time.Duration
}

// Request is one request inside the engine. The driver fills the inputs;
// the engine fills the outputs.
type Request struct {
	// Inputs.
	ID     uint64
	Prompt string // rendered prompt text
	// OutputTokens is how many tokens to generate before finishing.
	OutputTokens int
	// MaxTokens is the client's max_tokens, 0 when unset. Like vLLM, the
	// engine rejects a request whose prompt plus max_tokens exceeds the
	// context length, even if it would stop earlier.
	MaxTokens int
	// Tag is the driver's handle; the engine never looks at it.
	Tag any
	// PromptHashes optionally carries prefix.HashSalted(nil, Prompt,
	// BlockSize*BytesPerToken, CacheSalt), for a driver that already
	// computed it for routing; the engine then does not hash the prompt
	// again. The engine reads it and never modifies it. Nil means the
	// engine hashes.
	PromptHashes []uint64
	// CacheSalt is vLLM's cache_salt: the prompt's blocks are shared only
	// with requests under the same salt, and the first block's BlockStored
	// names it in its extra keys, as vLLM's does. "" for none.
	CacheSalt string
	// Adapter is the LoRA adapter the request runs under, "" for the base
	// model (lora.go). Its blocks are salted with it: PromptHashes, when
	// given, are under prefix.AdapterSalt(Adapter, CacheSalt).
	Adapter string
	// RemotePrefill says the prompt's KV cache comes from a prefill engine
	// (vLLM's do_remote_prefill): the engine allocates the prompt's
	// blocks, waits for the transfer instead of computing them, and
	// decodes from there (remote.go).
	RemotePrefill bool
	// HoldKV keeps the request's blocks referenced after it finishes,
	// until ReleaseKV or HoldTimeout (KVHoldTimeout when 0), as a vLLM
	// prefill engine keeps a do_remote_decode request's blocks for the
	// decode engine to read.
	HoldKV      bool
	HoldTimeout time.Duration

	// Outputs.
	PromptTokens int
	CachedTokens int // prompt tokens found in the prefix cache at first schedule
	Generated    int
	Arrival      time.Duration
	// ScheduledAt is the start of the step that first admitted it from the
	// waiting queue, as vLLM's scheduled timestamp: its queue time is
	// ScheduledAt - Arrival, its prefill time FirstTokenAt - ScheduledAt.
	ScheduledAt  time.Duration
	FirstTokenAt time.Duration // 0 until the first token
	FinishedAt   time.Duration
	// TransferredTokens is how many prompt tokens' KV a RemotePrefill
	// request received from the prefill engine: the prompt less the
	// engine's own prefix-cache hits. KVReadyAt is when they arrived; the
	// transfer started at the step that admitted the request (remote.go).
	TransferredTokens int
	KVReadyAt         time.Duration

	// Engine state, owned by the engine between Add and Finished or Abort.
	state      uint8
	decode     bool     // scheduled this step as a decode (one token after the first)
	cachedSet  bool     // CachedTokens was set at the first admission
	ownHashes  bool     // hashes came from the engine's pool
	computed   int      // tokens whose KV is computed (before this step's chunk)
	sched      int      // tokens scheduled in the current step
	registered int      // leading blocks registered in the prefix cache
	blocks     []int32  // block table
	hashes     []uint64 // chain hashes of the prompt's full blocks
	loraHeld   bool     // counted among its adapter's running requests
	loadTo     int      // while loading from the CPU tier: tokens computed once loaded
	received   bool     // its remote KV arrived; a preemption recomputes it
	holdUntil  time.Duration
}

// Request states.
const (
	stateNew uint8 = iota
	stateWaiting
	stateRunning
	stateDone
	stateRemote // waiting for its remote KV, holding its blocks (remote.go)
	stateHeld   // finished, its blocks kept for a decode engine (remote.go)
)

// tokens is the request's current length: prompt plus generated tokens.
// After a preemption all of it is recomputed like a prompt.
func (r *Request) tokens() int { return r.PromptTokens + r.Generated }

// Sink receives the events of a step, stamped at the step's end.
type Sink interface {
	// Token is called for every generated token; the first token of a
	// request is when its Generated becomes 1.
	Token(r *Request, at time.Duration)
	// Finished is called once when r has generated OutputTokens tokens, in
	// the same step as its last Token. Abort does not call it.
	Finished(r *Request, at time.Duration)
}

// Stats are the engine's counters and gauges, as vLLM exports them.
type Stats struct {
	Running, Waiting               int
	KVUsage                        float64 // 0..1
	PrefixQueries, PrefixHits      int64   // tokens
	Preemptions                    int64
	PromptTokens, GenerationTokens int64
	BusyTime                       time.Duration // total step time
	PrefillTokensComputed          int64
	// LoRALoads counts adapter loads (lora.go).
	LoRALoads int64
	// RemoteWaiting is the requests waiting for their remote KV cache
	// (also counted in Waiting), HeldRequests the finished ones whose
	// blocks are held for a decode engine, KVTransferTokens the prompt
	// tokens received from prefill engines (remote.go).
	RemoteWaiting, HeldRequests int
	KVTransferTokens            int64
	// ExternalQueries and ExternalHits are the prompt tokens looked up in
	// the CPU tier (past the GPU hits) and found there, as vLLM's
	// external_prefix_cache_queries and _hits (cputier.go).
	ExternalQueries, ExternalHits int64
	// HostLoadTime is the time the CPU tier's loads took, summed (vLLM's
	// kv_offload_total_time{transfer_type="CPU_to_GPU"}).
	HostLoadTime time.Duration
}

// Engine is one engine's state.
type Engine struct {
	p       Preset
	kv      *kvCache
	waiting queue
	running []*Request // in admission order; the last is preempted first
	stats   Stats

	// Per-step scratch, kept here so that Step allocates nothing.
	budget                   int
	stepPrefill, stepDecodes int
	stepCtx                  int
	preempted                bool
	inStep                   bool
	abortedInStep            bool
	hitScratch               []int32

	// Pools of block tables and hash slices of finished requests: a
	// request's tables come from here, so a steady state allocates nothing.
	blockPool [][]int32
	hashPool  [][]uint64

	// KV cache events since the last TakeKVEvents, recorded only while
	// kvEvents is on (SetKVEvents).
	kvEvents bool
	events   []kvevents.Event

	// cpu is the CPU tier, nil without one; cpuEvents its connector's
	// events since the last TakeKVEvents (cputier.go).
	cpu       *cpuTier
	cpuEvents []kvevents.Event

	// loras are the resident adapters; stepLoads counts this step's loads
	// (lora.go).
	loras     []loraSlot
	stepLoads int

	// remote are the requests waiting for their KV cache from a prefill
	// engine, in admission order; held the finished requests whose blocks
	// a decode engine has yet to read (remote.go).
	remote []*Request
	held   []*Request
}

// New returns an idle engine for p; kvBlocks > 0 overrides p.KVBlocks.
// MaxModelLen is lowered to what the KV cache holds if it is larger, as
// vLLM refuses to start otherwise; one request of MaxModelLen tokens can
// then always run, so the engine can never wedge.
func New(p Preset, kvBlocks int) *Engine {
	if kvBlocks > 0 {
		p.KVBlocks = kvBlocks
	}
	if p.KVBlocks < 1 {
		p.KVBlocks = 1
	}
	if p.MaxNumSeqs < 1 {
		p.MaxNumSeqs = 1
	}
	if p.MaxBatchedTokens < 1 {
		p.MaxBatchedTokens = 1
	}
	if p.MaxModelLen < 1 || p.MaxModelLen > p.KVBlocks*BlockSize {
		p.MaxModelLen = p.KVBlocks * BlockSize
	}
	e := &Engine{p: p, kv: newKVCache(p.KVBlocks)}
	if p.CPUBlocks > 0 {
		e.cpu = newCPUTier(p.CPUBlocks)
	}
	return e
}

// ContextError is returned by Add for a request over the context length;
// its message is vLLM's.
type ContextError struct{ Message string }

func (e *ContextError) Error() string { return e.Message }

// Tokens returns the prompt token count the engine's tokenizer gives text.
func Tokens(text string) int { return request.EstimateTokens(text) }

// blocksFor is the number of blocks that hold n tokens.
func blocksFor(n int) int { return (n + BlockSize - 1) / BlockSize }

// Add queues r at time now. It returns a *ContextError if the prompt plus
// output exceeds the context length. OutputTokens below 1 counts as 1 (an
// engine always samples at least one token). Adding a request that is
// already queued or running is an error.
func (e *Engine) Add(r *Request, now time.Duration) error {
	if r.state == stateWaiting || r.state == stateRunning || r.state == stateRemote || r.state == stateHeld {
		return fmt.Errorf("engine: add request %d: already in the engine", r.ID)
	}
	if r.OutputTokens < 1 {
		r.OutputTokens = 1
	}
	r.PromptTokens = Tokens(r.Prompt)
	if r.PromptTokens == 0 {
		return fmt.Errorf("engine: add request %d: empty prompt", r.ID)
	}
	if r.Adapter != "" && e.p.MaxLoras == 0 {
		return fmt.Errorf("engine: add request %d: adapter %q on an engine without LoRA", r.ID, r.Adapter)
	}
	// The client's max_tokens may be anything up to 2^63-1: compared
	// with what the prompt leaves, and added only without wrapping.
	completion := max(r.OutputTokens, r.MaxTokens)
	if completion > e.p.MaxModelLen-r.PromptTokens {
		return &ContextError{Message: fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			e.p.MaxModelLen, request.AddTokens(r.PromptTokens, completion), r.PromptTokens, completion)}
	}
	r.CachedTokens, r.Generated = 0, 0
	r.Arrival, r.ScheduledAt, r.FirstTokenAt, r.FinishedAt = now, 0, 0, 0
	r.cachedSet, r.decode, r.received = false, false, false
	r.computed, r.sched, r.registered, r.loadTo = 0, 0, 0, 0
	r.TransferredTokens, r.KVReadyAt = 0, 0
	r.blocks = e.takeBlocks()
	full := len(r.Prompt) / (BlockSize * BytesPerToken)
	if r.PromptHashes != nil && len(r.PromptHashes) == full {
		r.hashes, r.ownHashes = r.PromptHashes, false
	} else {
		r.hashes = prefix.HashSalted(e.takeHashes(), r.Prompt, BlockSize*BytesPerToken, prefix.AdapterSalt(r.Adapter, r.CacheSalt))
		r.ownHashes = true
	}
	r.state = stateWaiting
	e.waiting.pushBack(r)
	return nil
}

func (e *Engine) takeBlocks() []int32 {
	if n := len(e.blockPool); n > 0 {
		b := e.blockPool[n-1]
		e.blockPool = e.blockPool[:n-1]
		return b
	}
	return nil
}

func (e *Engine) takeHashes() []uint64 {
	if n := len(e.hashPool); n > 0 {
		h := e.hashPool[n-1]
		e.hashPool = e.hashPool[:n-1]
		return h
	}
	return nil
}

// retire releases r's blocks and returns its tables to the pools.
func (e *Engine) retire(r *Request) {
	e.loraStop(r)
	e.kv.release(r.blocks)
	if cap(r.blocks) > 0 {
		e.blockPool = append(e.blockPool, r.blocks[:0])
	}
	if r.ownHashes && cap(r.hashes) > 0 {
		e.hashPool = append(e.hashPool, r.hashes[:0])
	}
	r.blocks, r.hashes, r.ownHashes = nil, nil, false
	r.state = stateDone
}

// Abort removes r (the client left), freeing its blocks; Finished is not
// called. Aborting a request that is not in the engine does nothing. It may
// be called from a Sink callback.
func (e *Engine) Abort(r *Request) {
	switch r.state {
	case stateWaiting:
		e.waiting.remove(r)
		e.retire(r)
	case stateRemote:
		e.remote = removeReq(e.remote, r)
		e.retire(r)
	case stateHeld:
		e.ReleaseKV(r)
	case stateRunning:
		e.retire(r)
		if e.inStep {
			// Step is walking e.running; it drops r when it sees stateDone.
			e.abortedInStep = true
			return
		}
		e.dropDone()
	}
}

// dropDone removes requests no longer running from e.running, in order.
func (e *Engine) dropDone() {
	kept := e.running[:0]
	for _, r := range e.running {
		if r.state == stateRunning {
			kept = append(kept, r)
		}
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// Requests appends to dst the requests in the engine (running in
// admission order, then waiting in queue order, then those waiting for
// their remote KV cache) and returns it: what a driver loses when the
// engine dies or hangs. Held requests (finished) are not among them.
func (e *Engine) Requests(dst []*Request) []*Request {
	dst = append(dst, e.running...)
	for i := range e.waiting.len() {
		dst = append(dst, e.waiting.at(i))
	}
	return append(dst, e.remote...)
}

// Idle reports whether nothing is running or waiting (for a queue slot or
// for its remote KV cache). Blocks held for a decode engine (HoldKV) do not
// make an engine busy.
func (e *Engine) Idle() bool {
	return len(e.running) == 0 && e.waiting.len() == 0 && len(e.remote) == 0
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	// vLLM counts requests waiting for remote KV among the waiting.
	s.Running, s.Waiting = len(e.running), e.waiting.len()+len(e.remote)
	s.RemoteWaiting, s.HeldRequests = len(e.remote), len(e.held)
	s.KVUsage = float64(e.kv.used()) / float64(e.p.KVBlocks)
	return s
}

// Preset returns the engine's preset (with KVBlocks as overridden and
// MaxModelLen as lowered by New).
func (e *Engine) Preset() Preset { return e.p }

// Step runs one scheduler iteration starting at now, reports its events to
// s stamped at now+d, and returns d; 0 when there was nothing to do.
//
// The iteration follows vLLM v1's scheduler with one ordering choice made
// explicit: first every running request that is decoding gets its one
// token, then running requests still in prefill (or recomputing after a
// preemption) get chunks from the remaining token budget, then waiting
// requests are admitted in FIFO order while budget, MaxNumSeqs and free
// blocks allow. A request that cannot get a block preempts the most
// recently admitted running request; no new request is admitted in a step
// that preempted. A request whose scheduled tokens reach its current length
// samples a token at the end of the step.
func (e *Engine) Step(now time.Duration, s Sink) time.Duration {
	e.expireHolds(now)
	if e.Idle() {
		return 0
	}
	e.budget = e.p.MaxBatchedTokens
	e.stepPrefill, e.stepDecodes, e.stepCtx = 0, 0, 0
	e.stepLoads = 0
	e.preempted = false

	// Decodes: one token each.
	for i := 0; i < len(e.running) && e.budget > 0; i++ {
		r := e.running[i]
		if r.Generated == 0 || r.tokens()-r.computed != 1 {
			continue
		}
		if !e.schedule(r, 1, true) {
			break
		}
	}
	// Prefill chunks of running requests, in admission order.
	if !e.preempted {
		for i := 0; i < len(e.running) && e.budget > 0; i++ {
			r := e.running[i]
			if r.sched > 0 {
				continue
			}
			if !e.schedule(r, min(r.tokens()-r.computed, e.budget), false) {
				break
			}
		}
	}
	// Requests whose remote KV cache arrived, ahead of the waiting queue
	// (vLLM keeps them at its head).
	if !e.preempted && len(e.remote) > 0 {
		e.scheduleReceived(now)
	}
	// Admissions from the waiting queue, in order; a request whose LoRA
	// adapter would be one too many in the batch is passed over.
	for i := 0; !e.preempted && e.budget > 0 && i < e.waiting.len() && len(e.running) < e.p.MaxNumSeqs; {
		r := e.waiting.at(i)
		if !e.loraAdmits(r) {
			i++
			continue
		}
		if !e.admit(r, i, now) {
			break
		}
	}

	if e.stepPrefill == 0 && e.stepDecodes == 0 {
		// Nothing could run: every request left waits for a transfer, or
		// for blocks that a transfer or a held request occupies (Wake).
		return 0
	}
	p := &e.p
	d := p.StepOverhead +
		time.Duration(e.stepPrefill)*p.PerPrefillToken +
		time.Duration(e.stepDecodes)*p.PerDecodeSeq +
		time.Duration(e.stepCtx)*p.PerContextToken +
		time.Duration(e.stepLoads)*p.LoRALoad
	if d <= 0 {
		// A preset with all-zero coefficients would make virtual time stand
		// still; a step always takes some time.
		d = time.Nanosecond
	}
	at := now + d
	e.stats.BusyTime += d
	e.stats.PrefillTokensComputed += int64(e.stepPrefill)

	// Commit the step and report its tokens. Callbacks may Add or Abort;
	// Abort marks the request done and dropDone removes it afterwards.
	e.inStep = true
	kept := e.running[:0]
	for i := 0; i < len(e.running); i++ {
		r := e.running[i]
		if r.state != stateRunning {
			continue
		}
		if r.sched == 0 {
			kept = append(kept, r)
			continue
		}
		r.computed += r.sched
		r.sched = 0
		if r.computed < r.tokens() {
			kept = append(kept, r)
			continue
		}
		r.Generated++
		e.stats.GenerationTokens++
		if r.Generated == 1 {
			r.FirstTokenAt = at
			e.stats.PromptTokens += int64(r.PromptTokens)
		}
		if r.Generated >= r.OutputTokens {
			r.FinishedAt = at
			if r.HoldKV {
				e.hold(r, at)
			} else {
				e.retire(r)
			}
			s.Token(r, at)
			s.Finished(r, at)
			continue
		}
		kept = append(kept, r)
		s.Token(r, at)
	}
	clear(e.running[len(kept):])
	e.running = kept
	e.inStep = false
	if e.abortedInStep {
		e.abortedInStep = false
		e.dropDone()
	}
	return d
}

// schedule gives running request r n more tokens in this step, allocating
// the blocks they need and preempting from the end of the running list
// until they fit. It reports false when r itself had to be preempted.
func (e *Engine) schedule(r *Request, n int, decode bool) bool {
	need := blocksFor(r.computed+n) - len(r.blocks)
	for need > e.kv.free {
		victim := e.running[len(e.running)-1]
		e.preempt(victim)
		if victim == r {
			return false
		}
	}
	for range need {
		r.blocks = append(r.blocks, e.alloc())
	}
	e.commit(r, n, decode)
	return true
}

// commit records n tokens of r in the step's batch and registers the prompt
// blocks they complete, so that a request admitted later in the same step
// already finds them (vLLM caches blocks when it schedules them).
func (e *Engine) commit(r *Request, n int, decode bool) {
	r.sched, r.decode = n, decode
	e.budget -= n
	if decode {
		e.stepDecodes++
	} else {
		e.stepPrefill += n
	}
	e.stepCtx += r.computed + n
	full := min((r.computed+n)/BlockSize, len(r.hashes))
	switch {
	case e.kvEvents:
		e.registerRecorded(r, full)
	case e.cpu != nil:
		for i := r.registered; i < full; i++ {
			if e.kv.register(r.blocks[i], r.hashes[i]) {
				e.offload(r.hashes[i])
			}
		}
	default:
		for i := r.registered; i < full; i++ {
			e.kv.register(r.blocks[i], r.hashes[i])
		}
	}
	r.registered = max(r.registered, full)
}

// preempt evicts victim, the last running request, by recomputation: its
// blocks are freed (their cached prefixes stay findable until evicted) and
// it goes back to the front of the waiting queue.
//
// The victim is never already in this step's batch: schedule walks the
// running list from the front and the victim comes from the back, and a
// request still in prefill is always the last admitted (a request is only
// admitted when the budget outlasts every earlier prefill, which then
// completes in that step), so no decode scheduled earlier in the step sits
// behind a prefill that needs blocks.
func (e *Engine) preempt(victim *Request) {
	if victim.sched != 0 {
		panic("engine: preempting a request already in the step's batch")
	}
	e.running = e.running[:len(e.running)-1]
	e.loraStop(victim)
	e.kv.release(victim.blocks)
	victim.blocks = victim.blocks[:0]
	victim.computed, victim.registered = 0, 0
	victim.state = stateWaiting
	e.waiting.pushFront(victim)
	e.stats.Preemptions++
	e.preempted = true
}

// admit moves r, the pos-th of the waiting queue, to the running list in the
// step that starts at now if the blocks for its first chunk are free: it
// takes the longest chain of cached full blocks (never the whole sequence:
// the last token is always computed, so that there is something to sample
// from), then allocates blocks for a chunk of the rest within the token
// budget.
func (e *Engine) admit(r *Request, pos int, now time.Duration) bool {
	total := r.tokens()
	maxHit := min((total-1)/BlockSize, len(r.hashes))
	hits := e.hitScratch[:0]
	hitFree := 0
	for i := 0; i < maxHit; i++ {
		b, ok := e.kv.lookup(r.hashes[i])
		if !ok {
			break
		}
		if e.kv.ref[b] == 0 {
			hitFree++
		}
		hits = append(hits, b)
	}
	e.hitScratch = hits
	hitTokens := len(hits) * BlockSize
	n := min(total-hitTokens, e.budget)
	remote := r.RemotePrefill && !r.received
	if remote {
		// The whole prompt's blocks, for the transfer to fill; no token of
		// this step's budget.
		n = total - hitTokens
	}
	loaded := e.cpuHits(r, len(hits), maxHit) * BlockSize
	if loaded > 0 {
		// Blocks for the loaded tokens only; the rest is computed once
		// they are on the GPU.
		n = loaded
	}
	need := blocksFor(hitTokens+n) - len(hits)
	if need+hitFree > e.kv.free {
		return false
	}
	if pos == 0 {
		e.waiting.popFront()
	} else {
		e.waiting.removeAt(pos)
	}
	for _, b := range hits {
		e.kv.acquire(b)
	}
	r.blocks = append(r.blocks[:0], hits...)
	for range need {
		r.blocks = append(r.blocks, e.alloc())
	}
	r.computed, r.registered = hitTokens, len(hits)
	if e.cpu != nil {
		e.touchCPU(r, len(hits)+loaded/BlockSize)
	}
	if remote {
		e.startTransfer(r, hitTokens, now)
		return true
	}
	if loaded > 0 {
		e.startLoad(r, hitTokens, loaded, now)
		return true
	}
	e.loraStart(r, now)
	if !r.cachedSet {
		// Counted once per request, like vLLM's counters for requests that
		// were never preempted, so that hits/queries is the hit rate the
		// clients see in usage.prompt_tokens_details.cached_tokens.
		r.cachedSet = true
		r.CachedTokens = hitTokens
		r.ScheduledAt = now
		e.stats.PrefixQueries += int64(r.PromptTokens)
		e.stats.PrefixHits += int64(hitTokens)
	}
	r.state = stateRunning
	e.running = append(e.running, r)
	e.commit(r, n, false)
	return true
}
