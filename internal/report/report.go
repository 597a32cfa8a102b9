// Package report turns per-request samples into the result of one run (the
// fields of `kvroute bench --json`), and renders runs side by side: the
// table with each policy's ratio to round-robin, the {"runs":[...]} JSON,
// the SVG charts, and the self-contained HTML page of a comparison
// (WriteHTML), and the simulator's requests one row each (WriteRequestsCSV).
// kvroute bench, compare and sim all report through it, so their results
// have one shape.
//
// It does no network I/O.
package report

import (
	"fmt"
	"github.com/kvroute/kvroute/internal/slo"
	"io"
	"math"
	"math/bits"
	"slices"
	"strings"
	"text/tabwriter"
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
	// Status is the HTTP status of the response, 0 when none arrived.
	Status int
	// Entry is the target the request entered (with several targets, see
	// bench.Config.Spread): 0 for the first, i for the i-th of the others.
	// Refused counts the targets that refused its connection before.
	Entry, Refused int
	// OracleTTFT is the request's TTFT alone on an idle engine with an
	// infinite cache (the simulator's --oracle), 0 when unknown; its
	// slowdown is TTFT over it.
	OracleTTFT time.Duration
	// The simulator's account of the request, zero elsewhere: Request is
	// its index in the workload; MatchedTokens the router's predicted
	// prefix hit on the engine it chose; Held the time the router held it
	// (late binding), Queued the time it then waited on the engine before
	// its first step, Prefill from that step to its first token (vLLM's
	// queue and prefill times), so that TTFT = Held + Queued + Prefill;
	// Route the router's account of its choice (scheduler.Assignment's
	// Reason: the prefix matched there, the policy's TTFT estimate, its
	// note).
	Request               int
	MatchedTokens         int
	Held, Queued, Prefill time.Duration
	Route                 string
	// Objective is the request's latency objectives (zero: none); Shed
	// is set when the router refused it for them (429, its Err set);
	// PredTTFT and PredITL are the router's predictions for the engine it
	// chose, in seconds, 0 when unknown (objectives.go).
	Objective         slo.Objective
	Shed              bool
	PredTTFT, PredITL float64
}

// LongPromptTokens divides the request classes of the slowdown: a prompt of
// at least this many tokens is long. It is one step of chunked prefill
// (vLLM's max_num_batched_tokens, policy.PrefillChunkTokens): a short
// prompt prefills within one engine step, a long one takes several.
const LongPromptTokens = 8192

// Slowdown is one request class's slowdown: TTFT over the oracle TTFT.
type Slowdown struct {
	Class string  `json:"class"`
	N     int     `json:"n"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
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
	// PredictedHitRate is the hit rate the router predicted for the same
	// requests (their MatchedTokens over their prompt tokens), beside the
	// delivered one the engines report (PrefixHitRate); absent when the
	// samples carry no prediction (a target that is not kvroute, or one
	// that does not reveal its reasons).
	PredictedHitRate float64 `json:"predicted_hit_rate,omitempty"`
	// Simulator extras.
	PrefillUtilisation float64   `json:"prefill_utilisation,omitempty"`
	EngineShare        []float64 `json:"engine_share,omitempty"`
	// AdapterLoads is the engines' LoRA adapter loads per 1,000 requests
	// completed, when they serve adapters.
	AdapterLoads float64 `json:"adapter_loads_per_1k,omitempty"`
	// OfOracle is PrefixHitRate as a fraction of the oracle bound, when known.
	OfOracle float64 `json:"hit_rate_of_oracle,omitempty"`
	// Slowdown is the slowdown of short and long prompts (see
	// LongPromptTokens), when the samples carry their oracle TTFT.
	Slowdown []Slowdown `json:"slowdown,omitempty"`
	// PD is a disaggregated fleet's per-leg figures (pd.go).
	PD *PDRun `json:"pd,omitempty"`
	// Fault is how the run took an engine fault (the simulator's), nil
	// without one (faults.go).
	Fault *FaultRun `json:"fault,omitempty"`
	// SLO is the attainment and goodput of the requests with objectives,
	// when some had them (objectives.go).
	SLO *SLORun `json:"slo,omitempty"`

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
	// P99TTFTms is the same requests' p99 TTFT, a lower bound on any run's
	// p99: no request can reach its first token sooner than with its
	// longest possible prefix cached on an idle engine.
	P99TTFTms float64 `json:"p99_ttft_ms"`
}

// RoundRobin is the policy name the table compares every run against.
const RoundRobin = "round-robin"

// Summarize computes a Run from samples; wall is the run's duration (for
// throughput).
//
// Latencies, throughput and the hit rate count completed requests only (Err
// empty); failed ones are counted in Errors. Percentiles are nearest-rank:
// the p-th percentile of n sorted values is the ceil(p/100*n)-th smallest,
// always an observed value. ITL pools every gap of every completed request;
// its mean is exact (an integer sum of nanoseconds) and its p99 is the exact
// nearest-rank value, found by selection rather than by sorting every gap
// (see itlSummary). The prefix hit rate is the sum of cached prompt tokens
// over the sum of prompt tokens, and the predicted one the sum of the
// router's predicted hits over the same.
func Summarize(policy string, samples []Sample, wall time.Duration) Run {
	r := Run{Policy: policy, Samples: samples}
	ttft := make([]float64, 0, len(samples))
	e2e := make([]float64, 0, len(samples))
	prompt, cached, output, matched := 0, 0, 0, 0
	for i := range samples {
		s := &samples[i]
		if s.Err != "" {
			r.Errors++
			continue
		}
		r.Completed++
		ttft = append(ttft, ms(s.TTFT))
		e2e = append(e2e, ms(s.E2E))
		prompt += s.PromptTokens
		cached += s.CachedTokens
		output += s.OutputTokens
		matched += s.MatchedTokens
	}
	r.TTFT = dist(ttft)
	r.E2E = dist(e2e)
	r.ITL = itlSummary(samples)
	if sec := wall.Seconds(); sec > 0 {
		r.OutputTokS = float64(output) / sec
		r.ReqS = float64(r.Completed) / sec
	}
	if prompt > 0 {
		r.PrefixHitRate = float64(cached) / float64(prompt)
		r.PredictedHitRate = float64(matched) / float64(prompt)
	}
	r.Slowdown = slowdowns(samples)
	r.SLO = summarizeSLO(samples)
	return r
}

// slowdowns summarises the completed samples' TTFT over their oracle TTFT,
// short prompts then long; nil when no sample has an oracle TTFT.
func slowdowns(samples []Sample) []Slowdown {
	var short, long []float64
	for i := range samples {
		s := &samples[i]
		if s.Err != "" || s.OracleTTFT <= 0 {
			continue
		}
		x := float64(s.TTFT) / float64(s.OracleTTFT)
		if s.PromptTokens >= LongPromptTokens {
			long = append(long, x)
		} else {
			short = append(short, x)
		}
	}
	if len(short)+len(long) == 0 {
		return nil
	}
	out := make([]Slowdown, 0, 2)
	for _, c := range []struct {
		name string
		xs   []float64
	}{{"short", short}, {"long", long}} {
		sd := Slowdown{Class: c.name, N: len(c.xs)}
		if len(c.xs) > 0 {
			slices.Sort(c.xs)
			sd.P50, sd.P99 = Percentile(c.xs, 50), Percentile(c.xs, 99)
		}
		out = append(out, sd)
	}
	return out
}

// itlBuckets is the number of buckets of gapBucket.
const itlBuckets = 1 + 64 + (63-6)*64

// gapBucket maps a gap to a bucket so that a smaller gap never lands in a
// later bucket: negative gaps (which a clock step back could make) share
// bucket 0, gaps under 64ns have a bucket each, and longer ones are binned
// by their bit length and the next six bits (64 buckets per power of two).
func gapBucket(d time.Duration) int {
	if d < 0 {
		return 0
	}
	v := uint64(d)
	if v < 64 {
		return 1 + int(v)
	}
	e := bits.Len64(v) // 7..63
	return 1 + 64 + (e-7)*64 + int((v>>(e-7))&63)
}

// itlSummary summarises the gaps of the completed samples: the mean and the
// nearest-rank p99, both exact. A run pools millions of gaps, and sorting
// them all used to cost more than the rest of a simulation; instead one pass
// counts the gaps per bucket of gapBucket (ordered ranges), which tells the
// bucket holding the p99's rank, and a second pass collects and sorts only
// that bucket's gaps.
func itlSummary(samples []Sample) ITLDist {
	var counts [itlBuckets]int
	n := 0
	var sum int64
	for i := range samples {
		s := &samples[i]
		if s.Err != "" {
			continue
		}
		for _, g := range s.ITL {
			counts[gapBucket(g)]++
			sum += int64(g)
		}
		n += len(s.ITL)
	}
	if n == 0 {
		return ITLDist{}
	}
	rank := nearestRank(99, n) // 1-based, among all gaps
	b, below := 0, 0
	for ; b < itlBuckets-1 && below+counts[b] < rank; b++ {
		below += counts[b]
	}
	in := make([]time.Duration, 0, counts[b])
	for i := range samples {
		s := &samples[i]
		if s.Err != "" {
			continue
		}
		for _, g := range s.ITL {
			if gapBucket(g) == b {
				in = append(in, g)
			}
		}
	}
	slices.Sort(in)
	mean := float64(sum) / float64(n) / float64(time.Millisecond)
	return ITLDist{Mean: mean, P99: ms(in[rank-below-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dist summarises xs (sorting it); all zero when xs is empty.
func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Dist{Mean: sum / float64(len(xs)), P50: Percentile(xs, 50), P90: Percentile(xs, 90), P99: Percentile(xs, 99)}
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted:
// the ceil(p/100*n)-th smallest value; 0 for an empty slice.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	return sorted[nearestRank(p, n)-1]
}

// nearestRank is the 1-based rank of the nearest-rank p-th percentile of n
// values (n > 0): ceil(p/100*n), clamped to 1..n.
func nearestRank(p float64, n int) int {
	// Round before ceil so that p/100*n landing a hair above an integer
	// (0.29*100 = 29.000000000000004) keeps the rank a person computes.
	rank := int(math.Ceil(math.Round(p/100*float64(n)*1e9) / 1e9))
	return min(n, max(1, rank))
}

// WriteTable writes runs side by side, with each policy's ratio to
// round-robin where round-robin is among them: "p99 TTFT vs rr" is the
// policy's p99 TTFT over round-robin's (lower is better), "hit vs rr" its
// prefix hit rate over round-robin's (higher is better).
func WriteTable(w io.Writer, rep *Report) {
	var rr *Run
	load, share, util, oracle, loras, predicted := false, false, false, false, false, false
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if r.Policy == RoundRobin && rr == nil {
			rr = r
		}
		load = load || r.OfferedLoad > 0
		share = share || len(r.EngineShare) > 0
		util = util || r.PrefillUtilisation > 0
		oracle = oracle || r.OfOracle > 0
		loras = loras || r.AdapterLoads > 0
		predicted = predicted || r.PredictedHitRate > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"policy"}
	if load {
		cols = append(cols, "load")
	}
	cols = append(cols, "done", "errors", "TTFT mean", "TTFT p50", "TTFT p99", "E2E p99", "ITL p99", "out tok/s", "hit rate")
	if predicted {
		cols = append(cols, "predicted hit")
	}
	if oracle {
		cols = append(cols, "of oracle")
	}
	if rr != nil {
		cols = append(cols, "p99 TTFT vs rr", "hit vs rr")
	}
	if util {
		cols = append(cols, "prefill util")
	}
	if loras {
		cols = append(cols, "adapter loads/1k")
	}
	if share {
		cols = append(cols, "engine share %")
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	for _, r := range rep.Runs {
		row := []string{r.Policy}
		if load {
			row = append(row, fmt.Sprintf("%.2f", r.OfferedLoad))
		}
		row = append(row, fmt.Sprint(r.Completed), fmt.Sprint(r.Errors),
			msec(r.TTFT.Mean), msec(r.TTFT.P50), msec(r.TTFT.P99), msec(r.E2E.P99), msec(r.ITL.P99),
			fmt.Sprintf("%.0f", r.OutputTokS), pct(r.PrefixHitRate))
		if predicted {
			row = append(row, pct(r.PredictedHitRate))
		}
		if oracle {
			row = append(row, pct(r.OfOracle))
		}
		if rr != nil {
			row = append(row, ratio(r.TTFT.P99, rr.TTFT.P99), ratio(r.PrefixHitRate, rr.PrefixHitRate))
		}
		if util {
			row = append(row, pct(r.PrefillUtilisation))
		}
		if loras {
			row = append(row, fmt.Sprintf("%.1f", r.AdapterLoads))
		}
		if share {
			parts := make([]string, len(r.EngineShare))
			for i, s := range r.EngineShare {
				parts[i] = fmt.Sprintf("%.0f", 100*s)
			}
			row = append(row, strings.Join(parts, "/"))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	if rr != nil {
		fmt.Fprintln(w, "vs rr: ratio to round-robin (p99 TTFT: lower is better; hit rate: higher is better)")
	}
	if predicted {
		fmt.Fprintln(w, "hit rate: cached prompt tokens as the engines report them; predicted hit: as the router predicted them for the same requests")
	}
	writeSlowdowns(w, rep.Runs)
	writeSLO(w, rep.Runs)
	if rep.Oracle != nil {
		fmt.Fprintf(w, "oracle: hit rate %s (one server, infinite cache), TTFT bounds: mean %s, p99 %s\n",
			pct(rep.Oracle.HitRate), msec(rep.Oracle.MeanTTFTms), msec(rep.Oracle.P99TTFTms))
	}
}

// msec formats milliseconds with about three significant digits.
func msec(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fs", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.2fms", v)
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func ratio(a, b float64) string {
	if b == 0 {
		if a == 0 {
			return "1.00x"
		}
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// SweepPoint is one policy's p99 TTFT at one offered load.
type SweepPoint struct {
	Policy string
	Load   float64
	P99ms  float64
}

// writeSlowdowns writes the runs' slowdown by class, when they have one.
func writeSlowdowns(w io.Writer, runs []Run) {
	have := false
	for _, r := range runs {
		have = have || len(r.Slowdown) > 0
	}
	if !have {
		return
	}
	fmt.Fprintf(w, "slowdown (TTFT over the request's oracle TTFT), short < %d prompt tokens <= long:\n", LongPromptTokens)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tshort n\tshort p50\tshort p99\tlong n\tlong p50\tlong p99\t")
	for _, r := range runs {
		row := []string{r.Policy}
		for _, sd := range r.Slowdown {
			if sd.N == 0 {
				row = append(row, "0", "-", "-")
				continue
			}
			row = append(row, fmt.Sprint(sd.N), fmt.Sprintf("%.1fx", sd.P50), fmt.Sprintf("%.1fx", sd.P99))
		}
		if len(r.Slowdown) == 0 {
			row = append(row, "", "", "", "", "", "")
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
}
