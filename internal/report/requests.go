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
