package sim

import (
	"bytes"
	"encoding/csv"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/report"
)

// TestRequestsCSV: the per-request rows of a run, parsed back, give the
// run's own summary (count, p99 TTFT, hit rate), each row's TTFT is its hold,
// queue and prefill, and the oracle column is there exactly when the run
// has one.
func TestRequestsCSV(t *testing.T) {
	for _, tc := range []struct {
		name, workload, policy string
		engines                int
		load                   float64
		oracle                 bool
		hold                   *Hold
		wantHeld               bool // some request was held by the router
	}{
		{name: "kvroute chat oracle", workload: "chat", policy: "kvroute", engines: 3, load: 0.8, oracle: true},
		{name: "round-robin rag", workload: "rag", policy: "round-robin", engines: 2, load: 0.9},
		{name: "kvroute mixed late binding", workload: "mixed", policy: "kvroute", engines: 2, load: 1.5, oracle: true,
			hold: &Hold{Tokens: 8192, Order: admission.FCFS}, wantHeld: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engines, reqs := fixture(t, tc.workload, tc.engines, 120, tc.load)
			cfg := Config{Engines: engines, Policy: tc.policy, Seed: 1, Hold: tc.hold}
			if tc.oracle {
				_, own, err := OracleTTFTs(reqs, engines[0], cfg.Request)
				if err != nil {
					t.Fatal(err)
				}
				cfg.OracleTTFT = own
			}
			run, err := Run(reqs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := report.WriteRequestsCSV(&buf, []report.Run{run}); err != nil {
				t.Fatal(err)
			}
			rows, err := csv.NewReader(&buf).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			col := map[string]int{}
			for i, h := range rows[0] {
				col[h] = i
			}
			rows = rows[1:]
			if len(rows) != run.Completed+run.Errors || run.Errors != 0 {
				t.Fatalf("%d rows for %d completed and %d failed requests", len(rows), run.Completed, run.Errors)
			}
			num := func(row []string, name string) float64 {
				t.Helper()
				v, err := strconv.ParseFloat(row[col[name]], 64)
				if err != nil {
					t.Fatalf("column %s: %v", name, err)
				}
				return v
			}
			var ttfts []float64
			var prompt, cached float64
			held := false
			seen := map[int]bool{}
			for _, row := range rows {
				if row[col["policy"]] != tc.policy {
					t.Fatalf("policy %q, want %q", row[col["policy"]], tc.policy)
				}
				k := int(num(row, "request"))
				if seen[k] || k < 0 || k >= len(reqs) {
					t.Fatalf("request %d twice or out of range", k)
				}
				seen[k] = true
				if got, want := num(row, "arrival_ms"), float64(reqs[k].At)/float64(time.Millisecond); got != want {
					t.Errorf("request %d arrived at %v ms, want %v", k, got, want)
				}
				ttft := num(row, "ttft_ms")
				parts := num(row, "held_ms") + num(row, "queued_ms") + num(row, "prefill_ms")
				if math.Abs(parts-ttft) > 1e-6 || num(row, "queued_ms") < 0 || num(row, "prefill_ms") <= 0 {
					t.Errorf("request %d: held+queued+prefill %v ms, TTFT %v ms", k, parts, ttft)
				}
				held = held || num(row, "held_ms") > 0
				if !strings.HasPrefix(row[col["route"]], "policy="+tc.policy+" ") {
					t.Errorf("request %d: route %q", k, row[col["route"]])
				}
				if (row[col["oracle_ttft_ms"]] != "") != tc.oracle {
					t.Errorf("request %d: oracle TTFT %q with oracle %v", k, row[col["oracle_ttft_ms"]], tc.oracle)
				}
				if c := num(row, "cached_tokens"); c > num(row, "prompt_tokens") {
					t.Errorf("request %d: %v cached of %v", k, c, num(row, "prompt_tokens"))
				}
				ttfts = append(ttfts, ttft)
				prompt += num(row, "prompt_tokens")
				cached += num(row, "cached_tokens")
			}
			slices.Sort(ttfts)
			if got := report.Percentile(ttfts, 99); got != run.TTFT.P99 {
				t.Errorf("p99 TTFT from the rows %v ms, the run's %v ms", got, run.TTFT.P99)
			}
			if got := cached / prompt; got != run.PrefixHitRate {
				t.Errorf("hit rate from the rows %v, the run's %v", got, run.PrefixHitRate)
			}
			if held != tc.wantHeld {
				t.Errorf("some request held: %v, want %v", held, tc.wantHeld)
			}
		})
	}
}
