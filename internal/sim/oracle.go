package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/workload"
)

// Oracle computes the workload's bounds on preset p: the prefix hit rate of
// one server with an infinite cache that sees every request in arrival
// order (no routing can beat it: any fleet's caches together hold at most
// what that server holds), and the mean and p99 TTFT if every request found
// that much of its prompt cached and never queued. The p99 is a bound on any
// run's p99 too: each request's TTFT in a run is at least its TTFT here (its
// uncached part prefilled alone, in full steps), so every order statistic
// of a run's TTFTs is at least the oracle's.
//
// Both come from the engine model itself rather than a formula beside it:
// one engine with a KV cache large enough to never evict receives the
// requests one at a time, each asking for a single output token so that it
// finishes at its first token, on an otherwise idle engine. Its cache hits
// are the hit bound, and its TTFTs (the uncached part prefilled in full
// chunked-prefill steps by the preset's timing model) give the TTFT bound.
// Requests the engine rejects (over the context length) are left out of
// both, as they are out of every run's hit rate.
func Oracle(reqs []workload.Request, p engine.Preset, opt request.Options) (report.Oracle, error) {
	o, _, err := OracleTTFTs(reqs, p, opt)
	return o, err
}

// OracleTTFTs is Oracle that also returns each request's own TTFT there,
// indexed as reqs (0 for a request the engine rejects): the denominator of
// its slowdown in a run (Config.OracleTTFT).
func OracleTTFTs(reqs []workload.Request, p engine.Preset, opt request.Options) (report.Oracle, []time.Duration, error) {
	s := oracleSink{}
	own := make([]time.Duration, len(reqs))
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	sortByArrival(order, reqs)
	// Size the cache for every distinct block of the workload, counted in
	// the engine's blocks (BlockSize tokens of BytesPerToken bytes), plus
	// the longest prompt, so that nothing is ever evicted.
	blockChars := engine.BlockSize * engine.BytesPerToken
	seen := make(map[uint64]struct{})
	var hashes []uint64
	longest := 0
	for _, i := range order {
		v, err := parse(&reqs[i], p.Model, opt)
		if err != nil {
			continue
		}
		hashes = prefix.Hash(hashes[:0], v.Prompt, blockChars)
		for _, h := range hashes {
			seen[h] = struct{}{}
		}
		longest = max(longest, len(hashes)+1)
	}
	eng := engine.New(p, len(seen)+longest+1)
	seen = nil

	var now time.Duration
	var prompt, cached int64
	var ttfts []float64
	for _, i := range order {
		v, err := parse(&reqs[i], p.Model, opt)
		if err != nil {
			continue
		}
		r := &engine.Request{ID: uint64(i) + 1, Prompt: v.Prompt, OutputTokens: 1}
		if err := eng.Add(r, now); err != nil {
			continue
		}
		for !eng.Idle() {
			d := eng.Step(now, &s)
			if d <= 0 {
				return report.Oracle{}, nil, fmt.Errorf("oracle: engine stalled on request %d", i)
			}
			now += d
		}
		if r.Generated == 0 {
			return report.Oracle{}, nil, fmt.Errorf("oracle: request %d finished without a token", i)
		}
		prompt += int64(r.PromptTokens)
		cached += int64(r.CachedTokens)
		own[i] = r.FirstTokenAt - r.Arrival
		ttfts = append(ttfts, float64(own[i])/float64(time.Millisecond))
	}
	var o report.Oracle
	if prompt > 0 {
		o.HitRate = float64(cached) / float64(prompt)
	}
	if len(ttfts) > 0 {
		sum := 0.0
		for _, t := range ttfts {
			sum += t
		}
		o.MeanTTFTms = sum / float64(len(ttfts))
		slices.Sort(ttfts)
		o.P99TTFTms = report.Percentile(ttfts, 99)
	}
	return o, own, nil
}

// oracleSink ignores events: the oracle reads the request's own outputs.
type oracleSink struct{}

func (oracleSink) Token(*engine.Request, time.Duration)    {}
func (oracleSink) Finished(*engine.Request, time.Duration) {}

func parse(r *workload.Request, model string, opt request.Options) (*request.View, error) {
	v, perr := request.Parse(r.Kind, r.Body(model), opt)
	if perr != nil {
		return nil, perr
	}
	return v, nil
}
