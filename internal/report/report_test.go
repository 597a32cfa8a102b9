package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	htmlparse "golang.org/x/net/html"
)

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func seq(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	return xs
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"one value", []float64{7}, 99, 7},
		{"p50 of 4 is the 2nd", []float64{10, 20, 30, 40}, 50, 20},
		{"p90 of 4 is the 4th (ceil 3.6)", []float64{10, 20, 30, 40}, 90, 40},
		{"p10 of 1..10", seq(10), 10, 1},
		{"p1 of 1..10 rounds up to rank 1", seq(10), 1, 1},
		{"p90 of 1..10", seq(10), 90, 9},
		{"p99 of 1..10", seq(10), 99, 10},
		{"p99 of 1..100", seq(100), 99, 99},
		{"p29 of 1..100 despite 0.29*100 > 29", seq(100), 29, 29},
		{"p99 of 1..1000", seq(1000), 99, 990},
		{"p100", seq(10), 100, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.xs, tc.p); got != tc.want {
				t.Errorf("Percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		samples []Sample
		wall    time.Duration
		want    Run
	}{
		{
			name: "errors excluded from latencies and throughput",
			samples: []Sample{
				{TTFT: msd(40), E2E: msd(400), ITL: []time.Duration{msd(10), msd(30)}, PromptTokens: 100, CachedTokens: 50, MatchedTokens: 80, OutputTokens: 3},
				{TTFT: msd(10), E2E: msd(100), ITL: []time.Duration{msd(20)}, PromptTokens: 200, CachedTokens: 0, MatchedTokens: 20, OutputTokens: 2},
				{TTFT: msd(30), E2E: msd(300), PromptTokens: 50, CachedTokens: 50, OutputTokens: 1},
				{TTFT: msd(20), E2E: msd(200), ITL: []time.Duration{msd(40)}, PromptTokens: 50, CachedTokens: 0, OutputTokens: 2},
				{Err: "HTTP 503: overloaded", PromptTokens: 1000, CachedTokens: 1000, MatchedTokens: 1000},
			},
			wall: 2 * time.Second,
			want: Run{
				Policy: "p", Completed: 4, Errors: 1,
				// TTFT 10,20,30,40: mean 25, p50 rank 2, p90 rank ceil(3.6)=4, p99 rank 4.
				TTFT: Dist{Mean: 25, P50: 20, P90: 40, P99: 40},
				E2E:  Dist{Mean: 250, P50: 200, P90: 400, P99: 400},
				// Gaps 10,20,30,40 pooled over requests.
				ITL:        ITLDist{Mean: 25, P99: 40},
				OutputTokS: 4, // 8 tokens / 2 s
				ReqS:       2,
				// (50+0+50+0) / (100+200+50+50)
				PrefixHitRate: 0.25,
				// (80+20) / 400, beside it
				PredictedHitRate: 0.25 * 1,
			},
		},
		{
			name:    "all failed",
			samples: []Sample{{Err: "x"}, {Err: "y"}},
			wall:    time.Second,
			want:    Run{Policy: "p", Errors: 2},
		},
		{
			name:    "zero wall",
			samples: []Sample{{TTFT: msd(5), E2E: msd(6), OutputTokens: 1}},
			want:    Run{Policy: "p", Completed: 1, TTFT: Dist{5, 5, 5, 5}, E2E: Dist{6, 6, 6, 6}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Summarize("p", tc.samples, tc.wall)
			got.Samples = nil
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tc.want)
			if string(gj) != string(wj) {
				t.Errorf("got  %s\nwant %s", gj, wj)
			}
		})
	}
}

func TestRunJSONFields(t *testing.T) {
	b, err := json.Marshal(Report{Runs: []Run{{Policy: "kvroute", Completed: 1, Samples: []Sample{{Err: "x"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, f := range []string{`"runs":[`, `"policy":"kvroute"`, `"completed":1`, `"errors":0`, `"ttft_ms":{"mean":0,"p50":0,"p90":0,"p99":0}`,
		`"e2e_ms":`, `"itl_ms":{"mean":0,"p99":0}`, `"output_tok_s":0`, `"req_s":0`, `"prefix_hit_rate":0`} {
		if !strings.Contains(s, f) {
			t.Errorf("JSON %s lacks %s", s, f)
		}
	}
	for _, f := range []string{"offered_load", "engine_share", "oracle", "Samples", "samples"} {
		if strings.Contains(s, f) {
			t.Errorf("JSON %s has %s, which should be omitted", s, f)
		}
	}
}

func TestWriteTable(t *testing.T) {
	rep := &Report{Runs: []Run{
		{Policy: "round-robin", OfferedLoad: 0.7, Completed: 100, TTFT: Dist{Mean: 500, P50: 300, P99: 4000}, PrefixHitRate: 0.1, OutputTokS: 1234},
		{Policy: "kvroute", OfferedLoad: 0.7, Completed: 99, Errors: 1, TTFT: Dist{Mean: 50, P50: 30, P99: 200}, PrefixHitRate: 0.35, PredictedHitRate: 0.425, EngineShare: []float64{0.5, 0.25, 0.25}},
	}}
	var buf bytes.Buffer
	WriteTable(&buf, rep)
	out := buf.String()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 3 {
		t.Fatalf("table too short:\n%s", out)
	}
	// Aligned: the header and rows have the same width.
	if len(lines[0]) != len(lines[1]) || len(lines[1]) != len(lines[2]) {
		t.Errorf("rows not aligned:\n%s", out)
	}
	for _, want := range []string{"load", "0.70", "4000ms", "200ms", "35.0%", "0.05x", "3.50x", "1.00x", "50/25/25", "1234", "vs rr", "predicted hit", "42.5%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	WriteTable(&buf, &Report{Runs: []Run{{Policy: "bench", Completed: 3}}})
	if out := buf.String(); strings.Contains(out, "vs rr") || strings.Contains(out, "load") || strings.Contains(out, "share") || strings.Contains(out, "predicted") {
		t.Errorf("table without round-robin, load or shares shows their columns:\n%s", out)
	}
}

// checkSVG checks that an SVG is well-formed XML and contains want.
func checkSVG(t *testing.T, svg string, want ...string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
	}
	for _, w := range want {
		if !strings.Contains(svg, w) {
			t.Errorf("SVG lacks %q", w)
		}
	}
}

func TestWriteTTFTChart(t *testing.T) {
	var a, b []Sample
	for i := 1; i <= 1000; i++ {
		a = append(a, Sample{TTFT: msd(float64(i))})
		b = append(b, Sample{TTFT: msd(float64(i) * 10)})
	}
	b = append(b, Sample{Err: "x"}, Sample{TTFT: 0})
	var buf bytes.Buffer
	if err := WriteTTFTChart(&buf, []Run{{Policy: "round-robin", Samples: b}, {Policy: "a<b", Samples: a}}); err != nil {
		t.Fatal(err)
	}
	// A zero TTFT clamps to 0.01 ms, so the log axis spans 0.01 ms to 10 s.
	checkSVG(t, buf.String(), "<svg", "round-robin", "a&lt;b", ">0.01<", ">1<", ">10k<", "log scale", "polyline")
	if n := strings.Count(buf.String(), "<polyline"); n != 2 {
		t.Errorf("%d lines, want 2", n)
	}
	buf.Reset()
	if err := WriteTTFTChart(&buf, nil); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, buf.String(), "<svg")
}

func TestWriteSweepChart(t *testing.T) {
	pts := []SweepPoint{
		{"round-robin", 0.9, 8000}, {"round-robin", 0.5, 300}, {"round-robin", 0.7, 1500},
		{"kvroute", 0.5, 80}, {"kvroute", 0.7, 120}, {"kvroute", 0.9, 400},
	}
	var buf bytes.Buffer
	if err := WriteSweepChart(&buf, pts); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	checkSVG(t, s, "round-robin", "kvroute", ">10<", ">10k<", ">0.5<", ">0.9<")
	if n := strings.Count(s, "<circle"); n != len(pts) {
		t.Errorf("%d points drawn, want %d", n, len(pts))
	}
}

// TestITLSummaryMatchesSort checks the selection against the definition:
// the mean and nearest-rank p99 of every gap of the completed samples,
// sorted, whatever the spread of the gaps (ties, negatives, huge values).
func TestITLSummaryMatchesSort(t *testing.T) {
	gens := map[string]func(r *rand.Rand) time.Duration{
		"spread": func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(time.Second))) },
		"ties":   func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(3)) * time.Millisecond },
		"tiny":   func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(200) - 20) },
		"heavy": func(r *rand.Rand) time.Duration {
			return time.Duration(r.ExpFloat64() * float64(time.Millisecond) * float64(1+r.IntN(1000)))
		},
		"constant": func(*rand.Rand) time.Duration { return 7 * time.Millisecond },
	}
	for name, gen := range gens {
		for _, n := range []int{1, 2, 99, 100, 101, 5000} {
			r := rand.New(rand.NewPCG(uint64(n), 1))
			var samples []Sample
			var all []float64
			for len(all) < n {
				s := Sample{ITL: make([]time.Duration, 1+r.IntN(20))}
				for j := range s.ITL {
					s.ITL[j] = gen(r)
				}
				if r.IntN(10) == 0 {
					s.Err = "failed" // its gaps must not count
				} else {
					for _, g := range s.ITL {
						all = append(all, ms(g))
					}
				}
				samples = append(samples, s)
			}
			want := dist(all)
			got := itlSummary(samples)
			if got.P99 != want.P99 || math.Abs(got.Mean-want.Mean) > 1e-9*math.Max(1, math.Abs(want.Mean)) {
				t.Errorf("%s n=%d: got mean %v p99 %v, want mean %v p99 %v", name, n, got.Mean, got.P99, want.Mean, want.P99)
			}
		}
	}
}

func TestGapBucketMonotone(t *testing.T) {
	prev := -1
	for _, d := range []time.Duration{-5, -1, 0, 1, 63, 64, 65, 127, 128, 129, 1000, 1 << 20, 1<<20 + 1, 1 << 40, 1<<62 + 12345, math.MaxInt64} {
		b := gapBucket(d)
		if b < prev || b >= itlBuckets {
			t.Fatalf("gapBucket(%d) = %d after %d (of %d)", d, b, prev, itlBuckets)
		}
		prev = b
	}
}

// BenchmarkSummarize summarises a simulated run's worth of samples: 20,000
// requests of 250 gaps.
func BenchmarkSummarize(b *testing.B) {
	b.ReportAllocs()
	r := rand.New(rand.NewPCG(1, 2))
	samples := make([]Sample, 20000)
	for i := range samples {
		samples[i] = Sample{TTFT: time.Duration(r.Int64N(int64(time.Second))), E2E: time.Duration(r.Int64N(int64(10 * time.Second))), ITL: make([]time.Duration, 250)}
		for j := range samples[i].ITL {
			samples[i].ITL[j] = time.Duration(r.Int64N(int64(50 * time.Millisecond)))
		}
	}
	b.ResetTimer()
	for range b.N {
		Summarize("p", samples, time.Minute)
	}
}

// reportRuns is two policies' runs over 10 s on three engines: "a" fast and
// cached on engine-1 and engine-2, "b" slow and uncached, spread over all three.
func reportRuns() []Run {
	var a, b []Sample
	for i := range 200 {
		st := time.Duration(i) * 50 * time.Millisecond
		a = append(a, Sample{Start: st, TTFT: msd(float64(10 + i%7)), E2E: msd(100), PromptTokens: 100, CachedTokens: 80, OutputTokens: 5, Backend: fmt.Sprintf("engine-%d", 1+i%2)})
		b = append(b, Sample{Start: st, TTFT: msd(float64(100 + 10*(i%13))), E2E: msd(300), PromptTokens: 100, CachedTokens: 10, OutputTokens: 5, Backend: fmt.Sprintf("engine-%d", i%3)})
	}
	b[7].Err = "HTTP 503"
	return []Run{Summarize("a", a, 10*time.Second), Summarize("b", b, 10*time.Second)}
}

// TestWriteHTML parses the page: every chart section holds exactly one
// inline svg with a line or bar per policy, and nothing refers to anything
// outside the page (no script, link, image or URL but SVG's namespace).
func TestWriteHTML(t *testing.T) {
	runs := reportRuns()
	tests := []struct {
		name     string
		opt      HTMLOptions
		sections []string
	}{
		{"one load", HTMLOptions{Title: "t <&>", Notes: []string{"fleet: 3 engines"}},
			[]string{"ttft", "p99-over-time", "hit-over-time", "engine-share"}},
		{"sweep", HTMLOptions{Sweep: []SweepPoint{{"a", 0.5, 10}, {"a", 0.9, 20}, {"b", 0.5, 100}, {"b", 0.9, 400}}},
			[]string{"ttft", "p99-over-time", "hit-over-time", "engine-share", "sweep"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteHTML(&buf, &Report{Runs: runs}, tc.opt); err != nil {
				t.Fatal(err)
			}
			doc, err := htmlparse.Parse(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			svgs := map[string]int{} // section id -> svg elements in it
			var ids []string
			var walk func(n *htmlparse.Node, section string)
			walk = func(n *htmlparse.Node, section string) {
				if n.Type == htmlparse.ElementNode {
					switch n.Data {
					case "script", "link", "img", "iframe", "object", "embed":
						t.Errorf("page has a <%s> element", n.Data)
					case "section":
						section = attr(n, "id")
						ids = append(ids, section)
					case "svg":
						svgs[section]++
						checkChart(t, section, n)
					}
					for _, a := range n.Attr {
						if strings.Contains(a.Val, "://") && !(a.Key == "xmlns" && a.Val == "http://www.w3.org/2000/svg") {
							t.Errorf("<%s %s=%q> refers outside the page", n.Data, a.Key, a.Val)
						}
					}
				}
				if n.Type == htmlparse.TextNode && strings.Contains(n.Data, "://") {
					t.Errorf("text %q holds a URL", n.Data)
				}
				for c := n.FirstChild; c != nil; c = c.NextSibling {
					walk(c, section)
				}
			}
			walk(doc, "")
			if want := append([]string{"table"}, tc.sections...); !slices.Equal(ids, want) {
				t.Errorf("sections %v, want %v", ids, want)
			}
			for _, id := range tc.sections {
				if svgs[id] != 1 {
					t.Errorf("section %s has %d charts, want 1", id, svgs[id])
				}
			}
			if svgs["table"] != 0 || svgs[""] != 0 {
				t.Errorf("charts outside their sections: %v", svgs)
			}
			if tc.opt.Title != "" && !strings.Contains(buf.String(), "t &lt;&amp;&gt;") {
				t.Error("the title is not escaped")
			}
		})
	}
}

func attr(n *htmlparse.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// checkChart checks what a section's chart draws for reportRuns' two
// policies: a line each (points per window over time), or, for the share
// chart, a bar per policy and engine whose heights are the shares.
func checkChart(t *testing.T, section string, svg *htmlparse.Node) {
	t.Helper()
	count := map[string]int{}
	var bars []string
	var walk func(n *htmlparse.Node)
	walk = func(n *htmlparse.Node) {
		if n.Type == htmlparse.ElementNode {
			count[n.Data]++
			if n.Data == "rect" && n.FirstChild != nil && n.FirstChild.Data == "title" {
				bars = append(bars, n.FirstChild.FirstChild.Data)
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(svg)
	switch section {
	case "engine-share":
		// a on engine-1 and -2 (50% each, none on engine-0), b about a third
		// on each (67, 67 and 66 of 200, the failed request counted).
		want := []string{"a, 0: 0", "b, 0: 33.5", "a, 1: 50", "b, 1: 33.5", "a, 2: 50", "b, 2: 33"}
		if !slices.Equal(bars, want) {
			t.Errorf("share bars %q, want %q", bars, want)
		}
	case "p99-over-time", "hit-over-time":
		if count["polyline"] != 2 || count["circle"] != 2*Windows {
			t.Errorf("%s: %d lines and %d points, want 2 and %d", section, count["polyline"], count["circle"], 2*Windows)
		}
	default:
		if count["polyline"] != 2 {
			t.Errorf("%s: %d lines, want 2", section, count["polyline"])
		}
	}
}

// TestWindowStats checks the over-time values against hand counts: in each
// window a's hit rate is 80% and b's 10%, and a's p99 is its slowest
// request there.
func TestWindowStats(t *testing.T) {
	runs := reportRuns()
	byRun, mid := windows(runs)
	if len(mid) != Windows || mid[0] <= 0 || mid[Windows-1] >= 10 {
		t.Fatalf("window midpoints %v", mid)
	}
	total := 0
	for k := range Windows {
		a, b := byRun[0][k], byRun[1][k]
		total += len(b)
		if got := windowHitRate.value(a); math.Abs(got-80) > 1e-9 {
			t.Errorf("window %d: a's hit rate %v, want 80", k, got)
		}
		if got := windowHitRate.value(b); math.Abs(got-10) > 1e-9 {
			t.Errorf("window %d: b's hit rate %v, want 10", k, got)
		}
		slowest := 0.0
		for _, s := range a {
			slowest = math.Max(slowest, ms(s.TTFT))
		}
		if got := windowP99.value(a); len(a) < 100 && got != slowest {
			t.Errorf("window %d: a's p99 %v, want its slowest %v (%d samples)", k, got, slowest, len(a))
		}
	}
	if total != 199 {
		t.Errorf("b's windows hold %d completed samples, want 199", total)
	}
}

// TestSeriesStylesDiffer: a dozen policies (kvroute sim's default) get a
// dozen different lines and bars.
func TestSeriesStylesDiffer(t *testing.T) {
	lines, bars := map[string]bool{}, map[string]bool{}
	for i := range 2 * len(palette) {
		if lines[lineStyle(i)] || bars[fillStyle(i)] {
			t.Errorf("series %d looks like an earlier one: %s, %s", i, lineStyle(i), fillStyle(i))
		}
		lines[lineStyle(i)], bars[fillStyle(i)] = true, true
	}
}

// TestSlowdownByClass: TTFT over the oracle TTFT, split at
// LongPromptTokens; failed samples and samples without an oracle TTFT are
// left out, and a class without samples prints as "-".
func TestSlowdownByClass(t *testing.T) {
	ms := time.Millisecond
	samples := []Sample{
		{PromptTokens: 100, TTFT: 20 * ms, OracleTTFT: 10 * ms},                // short 2x
		{PromptTokens: 8191, TTFT: 300 * ms, OracleTTFT: 100 * ms},             // short 3x
		{PromptTokens: 8192, TTFT: 5000 * ms, OracleTTFT: 1000 * ms},           // long 5x
		{PromptTokens: 100, TTFT: 90 * ms, OracleTTFT: 0},                      // no oracle
		{PromptTokens: 100, TTFT: 90 * ms, OracleTTFT: 1 * ms, Err: "refused"}, // failed
	}
	r := Summarize("p", samples, time.Second)
	want := []Slowdown{{Class: "short", N: 2, P50: 2, P99: 3}, {Class: "long", N: 1, P50: 5, P99: 5}}
	if !slices.Equal(r.Slowdown, want) {
		t.Errorf("slowdown %+v, want %+v", r.Slowdown, want)
	}
	if s := Summarize("p", samples[3:4], time.Second).Slowdown; s != nil {
		t.Errorf("no oracle TTFT: slowdown %+v, want none", s)
	}
	var out strings.Builder
	WriteTable(&out, &Report{Runs: []Run{Summarize("p", samples[:2], time.Second)}})
	if !strings.Contains(out.String(), "3.0x") || !strings.Contains(out.String(), "-") {
		t.Errorf("table lacks the slowdowns:\n%s", out.String())
	}
}

func TestAddedLatency(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		first  time.Duration
		itl    []time.Duration
		at     time.Duration
		added  time.Duration
		before int
		ok     bool
	}{
		// tokens at 100, 110, 120, 620, 630: the fault at 125 made the
		// 500 ms gap, the pace is 10 ms.
		{"moved", 100 * ms, []time.Duration{10 * ms, 10 * ms, 500 * ms, 10 * ms}, 125 * ms, 490 * ms, 3, true},
		{"started after", 200 * ms, []time.Duration{10 * ms, 10 * ms}, 150 * ms, 0, 0, false},
		{"over before", 100 * ms, []time.Duration{10 * ms, 10 * ms}, 500 * ms, 0, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b, ok := AddedLatency(c.first, c.itl, c.at)
			if a != c.added || b != c.before || ok != c.ok {
				t.Fatalf("got %v %d %v, want %v %d %v", a, b, ok, c.added, c.before, c.ok)
			}
		})
	}
}
