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
	"time"
)

// BlockSize is the KV cache block size in tokens.
const BlockSize = 16

// BytesPerToken is the deterministic tokenizer's token size: a prompt of n
// bytes is ceil(n/4) tokens, each the next 4 bytes, so two prompts that share
// a text prefix share a token prefix.
const BytesPerToken = 4

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
}

// Presets returns the built-in presets.
func Presets() []Preset { panic("unimplemented") }

// LookupPreset finds a preset by name, with an error that lists the names.
func LookupPreset(name string) (Preset, error) { panic("unimplemented") }

// PrefillTokensPerSec is the preset's prefill capacity when it does nothing
// but prefill in full steps: the yardstick of offered load.
func (p Preset) PrefillTokensPerSec() float64 { panic("unimplemented") }

// Request is one request inside the engine. The driver fills the inputs;
// the engine fills the outputs.
type Request struct {
	// Inputs.
	ID     uint64
	Prompt string // rendered prompt text
	// OutputTokens is how many tokens to generate before finishing.
	OutputTokens int
	// Tag is the driver's handle; the engine never looks at it.
	Tag any

	// Outputs.
	PromptTokens int
	CachedTokens int // prompt tokens found in the prefix cache at first schedule
	Generated    int
	Arrival      time.Duration
	FirstTokenAt time.Duration // 0 until the first token
	FinishedAt   time.Duration
}

// Sink receives the events of a step, stamped at the step's end.
type Sink interface {
	// Token is called for every generated token; the first token of a
	// request is when its Generated becomes 1.
	Token(r *Request, at time.Duration)
	// Finished is called once when r is done (or aborted).
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
}

// Engine is one engine's state.
type Engine struct{}

// New returns an idle engine for p; kvBlocks > 0 overrides p.KVBlocks.
func New(p Preset, kvBlocks int) *Engine { panic("unimplemented") }

// ContextError is returned by Add for a request over the context length;
// its message is vLLM's.
type ContextError struct{ Message string }

func (e *ContextError) Error() string { return e.Message }

// Tokens returns the prompt token count the engine's tokenizer gives text.
func Tokens(text string) int { return (len(text) + BytesPerToken - 1) / BytesPerToken }

// Add queues r at time now. It returns a *ContextError if the prompt plus
// output exceeds the context length.
func (e *Engine) Add(r *Request, now time.Duration) error { panic("unimplemented") }

// Abort removes r (the client left), freeing its blocks; Finished is not called.
func (e *Engine) Abort(r *Request) { panic("unimplemented") }

// Step runs one scheduler iteration starting at now, reports its events to
// s stamped at now+d, and returns d; 0 when there was nothing to do.
func (e *Engine) Step(now time.Duration, s Sink) time.Duration { panic("unimplemented") }

// Idle reports whether nothing is running or waiting.
func (e *Engine) Idle() bool { panic("unimplemented") }

// Stats returns the counters.
func (e *Engine) Stats() Stats { panic("unimplemented") }

// Preset returns the engine's preset (with KVBlocks as overridden).
func (e *Engine) Preset() Preset { panic("unimplemented") }
