// Package report turns per-request samples into the result of one run (the
// fields of `kvroute bench --json`), and renders runs side by side: the
// table with each policy's ratio to round-robin, the {"runs":[...]} JSON,
// and the SVG charts. kvroute bench, compare and sim all report through it,
// so their results have one shape.
//
// It does no network I/O.
package report

import (
	"io"
	"time"
)

// Sample is one request's outcome.
type Sample struct {
	// Start is the request's intended start (arrival) time from the start of the run.
	Start time.Duration
	// TTFT and E2E are measured from the intended start.
	TTFT, E2E time.Duration
	// ITL are the gaps between successive output tokens (streamed chunks).
	ITL          []time.Duration
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Err is non-empty when the request failed.
	Err string
	// Backend is the backend that served it (X-Kvroute-Backend), if known.
	Backend string
}

// Dist summarises a latency distribution in milliseconds.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// ITLDist summarises inter-token latency in milliseconds.
type ITLDist struct {
	Mean float64 `json:"mean"`
	P99  float64 `json:"p99"`
}

// Run is the result of one policy's run.
type Run struct {
	Policy        string  `json:"policy"`
	OfferedLoad   float64 `json:"offered_load,omitempty"`
	Completed     int     `json:"completed"`
	Errors        int     `json:"errors"`
	TTFT          Dist    `json:"ttft_ms"`
	E2E           Dist    `json:"e2e_ms"`
	ITL           ITLDist `json:"itl_ms"`
	OutputTokS    float64 `json:"output_tok_s"`
	ReqS          float64 `json:"req_s"`
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// Simulator extras.
	PrefillUtilisation float64   `json:"prefill_utilisation,omitempty"`
	EngineShare        []float64 `json:"engine_share,omitempty"`
	// OfOracle is PrefixHitRate as a fraction of the oracle bound, when known.
	OfOracle float64 `json:"hit_rate_of_oracle,omitempty"`

	// Samples are kept for charts; not serialised.
	Samples []Sample `json:"-"`
}

// Report is the JSON document of compare and sim: {"runs":[...]}.
type Report struct {
	Runs   []Run   `json:"runs"`
	Oracle *Oracle `json:"oracle,omitempty"`
}

// Oracle holds the workload's bounds (kvroute sim --oracle).
type Oracle struct {
	// HitRate is the prefix hit rate of one server with an infinite cache.
	HitRate float64 `json:"hit_rate"`
	// MeanTTFTms is the fleet-level lower bound of mean TTFT if every
	// request found its prefix cached and never queued.
	MeanTTFTms float64 `json:"mean_ttft_ms"`
}

// Summarize computes a Run from samples; wall is the run's duration (for
// throughput).
func Summarize(policy string, samples []Sample, wall time.Duration) Run { panic("unimplemented") }

// WriteTable writes runs side by side, with each policy's ratio to
// round-robin where round-robin is among them.
func WriteTable(w io.Writer, rep *Report) { panic("unimplemented") }

// WriteTTFTChart writes an SVG of each run's TTFT distribution (CDF).
func WriteTTFTChart(w io.Writer, runs []Run) error { panic("unimplemented") }

// SweepPoint is one policy's p99 TTFT at one offered load.
type SweepPoint struct {
	Policy string
	Load   float64
	P99ms  float64
}

// WriteSweepChart writes an SVG of p99 TTFT against offered load, one line per policy.
func WriteSweepChart(w io.Writer, points []SweepPoint) error { panic("unimplemented") }
