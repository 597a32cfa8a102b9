// Package workload produces the request streams that kvroute's benchmark,
// comparison and simulator replay: the Mooncake-format traces (any JSONL
// file in that format) and the built-in synthetic workloads (chat, agent,
// mixed, rag). Text is generated deterministically, so the same workload and
// seed always give the same bytes.
//
// It does no network I/O and knows nothing of routing.
package workload

import (
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// Request is one request of a workload.
type Request struct {
	// At is the arrival time from the start of the run.
	At   time.Duration
	Kind request.Kind
	// Session is the conversation id sent as X-Session-ID, or empty.
	Session string
	// InputTokens and OutputTokens are the intended lengths; the body asks
	// for exactly OutputTokens (max_tokens = min_tokens, ignore_eos).
	InputTokens, OutputTokens int

	body func(model string) []byte
}

// Body returns the JSON request body for model, with "stream": true and
// stream_options.include_usage. It is built on demand (traces are large).
func (r *Request) Body(model string) []byte { return r.body(model) }

// Options select and shape a workload.
type Options struct {
	// Rate is the Poisson arrival rate (requests/s) for synthetic
	// workloads; default 10.
	Rate float64
	// Speedup compresses a trace's timestamps; default 1.
	Speedup float64
	// Limit keeps the first Limit requests (0: all).
	Limit int
	// WindowStart and WindowEnd keep a trace's requests with timestamps in
	// [start, end) (both zero: all).
	WindowStart, WindowEnd time.Duration
	// Duration bounds a synthetic workload's arrivals (default 60s unless
	// Limit is set).
	Duration time.Duration
	Seed     int64
}

// Load returns the named built-in workload, or the trace at path name.
func Load(name string, opt Options) ([]Request, error) { panic("unimplemented") }

// Builtins lists the built-in workloads with a one-line description each.
func Builtins() [][2]string { panic("unimplemented") }

// PromptTokensPerSec is the workload's offered prompt tokens per second over
// its arrival span.
func PromptTokensPerSec(reqs []Request) float64 { panic("unimplemented") }

// ScaleTime multiplies every arrival time by f (f < 1 compresses).
func ScaleTime(reqs []Request, f float64) { panic("unimplemented") }
