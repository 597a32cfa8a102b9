package fleet

import (
	"math"
	"sync/atomic"
)

// Limits are an engine's own limits, each 0 when unknown.
type Limits struct {
	// MaxNumSeqs caps the sequences the engine runs at once (vLLM's and
	// SGLang's max_num_seqs / max_running_requests, llama.cpp's slots): a
	// request beyond it waits for a running one to finish.
	MaxNumSeqs int
	// MaxBatchedTokens is the engine's token budget of one step (vLLM's
	// max_num_batched_tokens): chunked prefill cuts a prompt into steps of
	// at most this many tokens.
	MaxBatchedTokens int
	// ContextLen is the context length of one request in tokens (vLLM's
	// max_model_len, llama.cpp's n_ctx per slot).
	ContextLen int
	// PlausibleSeqs is the cap to route by: MaxNumSeqs when known, else,
	// before a learned cap is confirmed, the smallest cap that what has
	// been observed allows (the cold-start cap, below); 0 when nothing
	// suggests one.
	PlausibleSeqs int
}

// Learning the running-sequence cap of an engine that does not report it
// (vLLM exports neither max_num_seqs nor max_num_batched_tokens). The
// engine never runs more than its cap, so the most running sequences ever
// seen is a lower bound of it; it is taken as the cap once the engine has
// been seen holding that many running with requests waiting CapConfirmations
// times. An engine also queues requests below its cap, when a long prefill
// has used a step's token budget or its KV cache is full. In the first case
// the running count varies from one reading to the next, where a cap that
// binds holds it at exactly the same value while a queue stands. In the
// second it can hold too (the engine admits a request as another finishes
// and frees its blocks), so a reading confirms only while the engine
// reports at most CapKVUsage of its KV cache in use: on the Mooncake trace
// at load 0.7 the engines' queues are memory's, and pricing them as a
// sequence cap cost 7.5% of p99 (docs/routing.md). A reading above the
// bound raises it and starts the count afresh. 2 confirmations: a live
// router reads the engine every 250 ms, and in a 53-second kvroute compare
// with 16 it never confirmed the cap of a busy engine and with 4 it took
// 3-30 s (docs/routing.md); on the default preset the simulator, which
// reads the engine after every step, gives the same figures with 1 to 16
// except on the mixed workload, where a bound learned below the real cap
// (a queue behind a 20-31k-token summary) moves p99 and mean by 1-3%.
const (
	CapConfirmations = 2
	CapKVUsage       = 0.5
)

// capState packs the learned cap: the bound in the high 32 bits and its
// confirmations in the low 32.
type capState = atomic.Uint64

// engineLimits is a backend's limits as configured and reported, and the
// cap and decode time learned from its readings.
type engineLimits struct {
	maxNumSeqs, maxBatchedTokens, contextLen atomic.Int64
	// reportedSeqs is the cap the engine reports, which wins over the
	// configured maxNumSeqs.
	reportedSeqs atomic.Int64
	learnedCap   capState
	// observed is set once the engine has shown anything of its running
	// sequences: a reading of its running count, or a first byte.
	observed atomic.Bool
	// decodeTime holds the float64 bits of the engine's time per output
	// token in seconds (see ObserveEngineDecode); 0 until then.
	decodeTime atomic.Uint64
}

// SetMaxNumSeqs records b's running-sequence cap as configured; n <= 0
// leaves it unknown.
func (b *Backend) SetMaxNumSeqs(n int) { b.limits.maxNumSeqs.Store(int64(max(n, 0))) }

// SetEngineMaxNumSeqs records b's running-sequence cap as its engine
// reports it (llama.cpp's slot count), which wins over the configured
// one; n <= 0 withdraws it.
func (b *Backend) SetEngineMaxNumSeqs(n int) { b.limits.reportedSeqs.Store(int64(max(n, 0))) }

// SetMaxBatchedTokens records b's token budget per engine step; n <= 0
// leaves it unknown.
func (b *Backend) SetMaxBatchedTokens(n int) { b.limits.maxBatchedTokens.Store(int64(max(n, 0))) }

// SetContextLen records b's context length per request in tokens; n <= 0
// leaves it unknown.
func (b *Backend) SetContextLen(n int) { b.limits.contextLen.Store(int64(max(n, 0))) }

// Limits returns what is known of b's limits. The cap is the one the
// engine reports, else the configured one, else the learned one once
// confirmed (see CapConfirmations); the plausible cap before that (the
// cold-start cap).
func (b *Backend) Limits() Limits {
	l := Limits{
		MaxNumSeqs:       int(b.limits.reportedSeqs.Load()),
		MaxBatchedTokens: int(b.limits.maxBatchedTokens.Load()),
		ContextLen:       int(b.limits.contextLen.Load()),
	}
	if l.MaxNumSeqs == 0 {
		l.MaxNumSeqs = int(b.limits.maxNumSeqs.Load())
	}
	if l.MaxNumSeqs == 0 {
		if s := b.limits.learnedCap.Load(); uint32(s) >= CapConfirmations {
			l.MaxNumSeqs = int(s >> 32)
		} else if uint32(s) > 0 {
			l.PlausibleSeqs = int(s >> 32)
		} else if !b.limits.observed.Load() {
			l.PlausibleSeqs = 1
		}
	}
	if l.MaxNumSeqs > 0 {
		l.PlausibleSeqs = l.MaxNumSeqs
	}
	return l
}

// The cold-start cap, for an engine whose cap is not confirmed yet (see
// CapConfirmations): route as if its cap were the smallest one that what
// has been observed allows. Before anything is observed (no reading of
// its running count, no first byte), that is one: a burst onto fresh
// engines spreads by count, whatever their prefill queues, instead of
// piling short prompts onto the one engine whose queue of tokens is
// shortest (60 of 63 on four engines, TestColdBurstSpreads in package
// sim). Once the engine has been seen holding its
// highest running count so far with requests waiting (and its KV cache
// at most CapKVUsage full), that count is its plausible cap
// (Limits.PlausibleSeqs), until a higher count or the confirmations
// settle it. The first burst after startup then spreads over the
// engines at the first sign of a queue, instead of piling on the one
// the cache favours until a second reading confirms the cap.

// ObserveRunning teaches b's learned cap one engine reading of running
// sequences, waiting requests and KV cache usage 0..1 (negative when the
// engine does not report it); see CapConfirmations.
func (b *Backend) ObserveRunning(running, waiting int, kvUsage float64) {
	b.limits.observed.Store(true)
	if running <= 0 || running >= math.MaxInt32 {
		return
	}
	r := uint64(running)
	for {
		old := b.limits.learnedCap.Load()
		bound, seen := old>>32, old&math.MaxUint32
		next := old
		switch {
		case r > bound:
			next = r << 32
			if waiting > 0 && kvUsage <= CapKVUsage {
				next |= 1
			}
		case r == bound && waiting > 0 && kvUsage <= CapKVUsage && seen < math.MaxUint32:
			next = old + 1
		}
		if next == old || b.limits.learnedCap.CompareAndSwap(old, next) {
			return
		}
	}
}

// ObserveEngineDecode folds the engine's own report of tokens generated
// in seconds of inter-token latency (the growth of its histogram's count
// and sum between two readings) into b's decode time per token.
func (b *Backend) ObserveEngineDecode(tokens, seconds float64) {
	if tokens < 1 || seconds <= 0 {
		return
	}
	fold(&b.limits.decodeTime, min(max(seconds/tokens, MinDecodeTime), MaxDecodeTime))
}

// MinDecodeTime and MaxDecodeTime clamp a decode time sample (seconds per
// token), so that a clock hiccup or a stalled engine cannot poison it.
const (
	MinDecodeTime = 1e-5
	MaxDecodeTime = 10.0
)

// EngineDecodeTime is the engine's time per output token in seconds as
// its own inter-token latency shows it, 0 when it reports none.
func (b *Backend) EngineDecodeTime() float64 { return math.Float64frombits(b.limits.decodeTime.Load()) }
