package report

import (
	"encoding/csv"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// requestsHeader names the columns of WriteRequestsCSV. Times are in
// milliseconds from the start of the run (arrival_ms) or of the request.
var requestsHeader = []string{
	"policy", "offered_load", "request", "arrival_ms", "prompt_tokens", "matched_tokens",
	"cached_tokens", "output_tokens", "engine", "held_ms", "queued_ms", "prefill_ms",
	"ttft_ms", "oracle_ttft_ms", "route", "error",
	// The request's objectives and what the router predicted (objectives.go):
	// per engine, observed over predicted is the prediction's error.
	"criticality", "slo_ttft_ms", "slo_itl_ms", "itl_ms", "pred_ttft_ms", "pred_itl_ms", "shed",
}

// WriteRequestsCSV writes one row per request of every run, a run's rows in
// request order: where each request went and what its TTFT was made of
// (Sample's simulator fields). Milliseconds are written in full, so a
// percentile recomputed from the rows is the run's to the last digit. A
// failed request has its error and no times; oracle_ttft_ms is empty when
// unknown.
func WriteRequestsCSV(w io.Writer, runs []Run) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(requestsHeader); err != nil {
		return err
	}
	row := make([]string, len(requestsHeader))
	for _, r := range runs {
		order := make([]int, len(r.Samples))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return r.Samples[a].Request - r.Samples[b].Request })
		// The offered load is a ratio of rates computed in floating
		// point (0.7000000000002304): six decimals say it.
		load := strconv.FormatFloat(math.Round(r.OfferedLoad*1e6)/1e6, 'f', -1, 64)
		for _, i := range order {
			s := &r.Samples[i]
			row = append(row[:0], r.Policy, load, strconv.Itoa(s.Request), msString(s.Start),
				strconv.Itoa(s.PromptTokens), strconv.Itoa(s.MatchedTokens), strconv.Itoa(s.CachedTokens),
				strconv.Itoa(s.OutputTokens), s.Backend)
			if s.Err != "" {
				row = append(row, "", "", "", "", "", s.Route, s.Err)
			} else {
				oracle := ""
				if s.OracleTTFT > 0 {
					oracle = msString(s.OracleTTFT)
				}
				row = append(row, msString(s.Held), msString(s.Queued), msString(s.Prefill),
					msString(s.TTFT), oracle, s.Route, "")
			}
			row = appendObjective(row, s)
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// msString is d in milliseconds, as exactly as Summarize computes it.
func msString(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', -1, 64) }

// appendObjective appends a sample's objective columns: empty for a
// request without objectives; its mean inter-token latency (MeanITL) and
// the router's predictions when known.
func appendObjective(row []string, s *Sample) []string {
	if s.Objective.None() {
		return append(row, "", "", "", "", "", "", "")
	}
	opt := func(d time.Duration, ok bool) string {
		if !ok {
			return ""
		}
		return msString(d)
	}
	sec := func(x float64) string {
		if x <= 0 {
			return ""
		}
		return strconv.FormatFloat(x*1000, 'f', -1, 64)
	}
	itl := MeanITL(s)
	return append(row, s.Objective.Class.String(), opt(s.Objective.TTFT, s.Objective.TTFT > 0), opt(s.Objective.ITL, s.Objective.ITL > 0),
		opt(itl, s.Err == "" && itl > 0), sec(s.PredTTFT), sec(s.PredITL), strconv.FormatBool(s.Shed))
}
