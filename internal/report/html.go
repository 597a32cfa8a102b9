package report

import (
	"bufio"
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// HTMLOptions add to what WriteHTML shows of a report.
type HTMLOptions struct {
	// Title heads the page (default "kvroute report").
	Title string
	// Notes are lines shown under the title, such as the fleet and the
	// workload.
	Notes []string
	// Sweep, when not empty, adds a section of p99 TTFT against load.
	Sweep []SweepPoint
}

// htmlSection is one chart of the page: its anchor, heading, a line on
// what it shows, and the chart.
type htmlSection struct {
	id, heading, note string
	chart             func(io.Writer) error
}

// Windows is how many time windows the over-time charts divide a run into.
const Windows = 20

// WriteHTML writes rep as one self-contained HTML page: the table, then one
// section per chart, each an inline SVG: the TTFT distribution of every
// run, p99 TTFT and prefix hit rate over time (by arrival, in Windows
// windows), each engine's share of the requests, and with opt.Sweep p99
// TTFT against load. It loads nothing and runs no script, so it opens
// offline and from a file.
func WriteHTML(w io.Writer, rep *Report, opt HTMLOptions) error {
	if opt.Title == "" {
		opt.Title = "kvroute report"
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n", html.EscapeString(opt.Title))
	bw.WriteString("<style>body{font-family:sans-serif;margin:2em;max-width:1100px}pre{font-size:12px;overflow-x:auto}section{margin:2em 0}</style>\n</head>\n<body>\n")
	fmt.Fprintf(bw, "<h1>%s</h1>\n", html.EscapeString(opt.Title))
	for _, n := range opt.Notes {
		fmt.Fprintf(bw, "<p>%s</p>\n", html.EscapeString(n))
	}
	var table bytes.Buffer
	WriteTable(&table, rep)
	fmt.Fprintf(bw, "<section id=\"table\">\n<h2>Results</h2>\n<pre>%s</pre>\n</section>\n", html.EscapeString(table.String()))

	sections := []htmlSection{
		{"ttft", "TTFT distribution", "The share of requests whose first token came within a given time, per policy.",
			func(w io.Writer) error { return WriteTTFTChart(w, rep.Runs) }},
		{"p99-over-time", "p99 TTFT over time", fmt.Sprintf("The p99 TTFT of the requests that arrived in each of %d windows of the run.", Windows),
			func(w io.Writer) error { return writeWindowChart(w, rep.Runs, windowP99) }},
		{"hit-over-time", "Prefix cache hit rate over time", "Cached prompt tokens over prompt tokens of the requests that arrived in each window.",
			func(w io.Writer) error { return writeWindowChart(w, rep.Runs, windowHitRate) }},
		{"engine-share", "Each engine's share of load", "The share of each policy's requests that each engine served; an even fleet is at 1/N.",
			func(w io.Writer) error { return writeShareChart(w, rep.Runs) }},
	}
	if len(opt.Sweep) > 0 {
		sections = append(sections, htmlSection{"sweep", "p99 TTFT against load", "One point per policy and offered load.",
			func(w io.Writer) error { return WriteSweepChart(w, opt.Sweep) }})
	}
	for _, s := range sections {
		fmt.Fprintf(bw, "<section id=\"%s\">\n<h2>%s</h2>\n<p>%s</p>\n", s.id, html.EscapeString(s.heading), html.EscapeString(s.note))
		if err := s.chart(bw); err != nil {
			return fmt.Errorf("report %s: %w", s.id, err)
		}
		bw.WriteString("</section>\n")
	}
	bw.WriteString("</body>\n</html>\n")
	return bw.Flush()
}

// windowStat is one of the over-time charts: what it plots per window of
// completed samples, and its axis.
type windowStat struct {
	title, ylabel string
	value         func([]*Sample) float64
	axis          func(lo, hi float64) axis
}

var (
	windowP99 = windowStat{
		title: "p99 TTFT over time", ylabel: "p99 TTFT (ms, log scale)",
		value: func(ss []*Sample) float64 {
			xs := make([]float64, len(ss))
			for i, s := range ss {
				xs[i] = math.Max(ms(s.TTFT), minPositiveMs)
			}
			slices.Sort(xs)
			return Percentile(xs, 99)
		},
		axis: func(lo, hi float64) axis {
			if math.IsInf(lo, 0) {
				lo, hi = 1, 1000
			}
			lo, hi = logRange(lo, hi)
			return axis{lo: lo, hi: hi, log: true, px: plotH}
		},
	}
	windowHitRate = windowStat{
		title: "Prefix cache hit rate over time", ylabel: "hit rate (% of prompt tokens)",
		value: func(ss []*Sample) float64 {
			prompt, cached := 0, 0
			for _, s := range ss {
				prompt += s.PromptTokens
				cached += s.CachedTokens
			}
			if prompt == 0 {
				return 0
			}
			return 100 * float64(cached) / float64(prompt)
		},
		axis: func(float64, float64) axis { return axis{lo: 0, hi: 100, px: plotH} },
	}
)

// windows splits the runs' common arrival span into Windows equal windows
// and returns, per run, each window's completed samples, and the windows'
// midpoints in seconds.
func windows(runs []Run) ([][][]*Sample, []float64) {
	var lo, hi time.Duration
	first := true
	for _, r := range runs {
		for i := range r.Samples {
			st := r.Samples[i].Start
			if first || st < lo {
				lo = st
			}
			if first || st > hi {
				hi = st
			}
			first = false
		}
	}
	width := (hi - lo + Windows) / Windows // at least 1ns, and hi falls in the last
	mid := make([]float64, Windows)
	for k := range mid {
		mid[k] = (lo + time.Duration(k)*width + width/2).Seconds()
	}
	out := make([][][]*Sample, len(runs))
	for ri, r := range runs {
		out[ri] = make([][]*Sample, Windows)
		for i := range r.Samples {
			s := &r.Samples[i]
			if s.Err != "" {
				continue
			}
			k := min(Windows-1, int((s.Start-lo)/width))
			out[ri][k] = append(out[ri][k], s)
		}
	}
	return out, mid
}

// writeWindowChart plots st over time, one line per run; windows in which a
// run completed no request are left out of its line.
func writeWindowChart(w io.Writer, runs []Run, st windowStat) error {
	byRun, mid := windows(runs)
	lo, hi := math.Inf(1), math.Inf(-1)
	var lines []series
	for ri, r := range runs {
		s := series{name: r.Policy, points: true}
		for k, ss := range byRun[ri] {
			if len(ss) == 0 {
				continue
			}
			v := st.value(ss)
			s.x, s.y = append(s.x, mid[k]), append(s.y, v)
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		lines = append(lines, s)
	}
	// The axis runs to the end of the last window, at least a second.
	xhi := math.Max(1, mid[Windows-1]+(mid[1]-mid[0])/2)
	step := niceStep(xhi / 5)
	return plot(w, st.title, "arrival time (s from the start of the run)", st.ylabel,
		axis{lo: 0, hi: math.Ceil(xhi/step) * step, px: plotW}, st.axis(lo, hi), lines, topLeft)
}

// EngineShares is each run's share of requests per engine, over the
// engines any run used (by Sample.Backend, sorted by name with shorter
// names first, so that engine-2 comes before engine-10): shares[r][e] is
// run r's share at engines[e]. Failed requests count where they were sent;
// samples that name no backend are left out.
func EngineShares(runs []Run) (engines []string, shares [][]float64) {
	counts := make([]map[string]float64, len(runs))
	seen := map[string]bool{}
	for ri, r := range runs {
		counts[ri] = map[string]float64{}
		total := 0
		for _, s := range r.Samples {
			if s.Backend != "" {
				counts[ri][s.Backend]++
				total++
			}
		}
		for n := range counts[ri] {
			counts[ri][n] /= float64(total)
		}
		for n := range counts[ri] {
			if !seen[n] {
				seen[n] = true
				engines = append(engines, n)
			}
		}
	}
	slices.SortFunc(engines, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	shares = make([][]float64, len(runs))
	for ri := range runs {
		shares[ri] = make([]float64, len(engines))
		for e, n := range engines {
			shares[ri][e] = counts[ri][n]
		}
	}
	return engines, shares
}

// writeShareChart draws EngineShares: one group of bars per engine, one bar
// per policy, in percent.
func writeShareChart(w io.Writer, runs []Run) error {
	engines, shares := EngineShares(runs)
	names := make([]string, len(runs))
	top := 0.0
	for ri, r := range runs {
		names[ri] = r.Policy
		for i := range shares[ri] {
			shares[ri][i] *= 100
			top = math.Max(top, shares[ri][i])
		}
	}
	step := niceStep(math.Max(top, 1) / 5)
	// Room above the tallest bar for the legend.
	hi := math.Ceil(top*1.25/step) * step
	return barChart(w, "Each engine's share of load", "engine", "share of requests (%)",
		axis{lo: 0, hi: math.Max(hi, step), px: plotH}, shortNames(engines), names, shares)
}

// shortNames drops the prefix all names share up to a separator (such as
// "engine-" or "http://127.0.0.1:") so that engine labels fit under their
// bars.
func shortNames(names []string) []string {
	if len(names) < 2 {
		return names
	}
	p := names[0]
	for _, n := range names[1:] {
		for !strings.HasPrefix(n, p) {
			p = p[:len(p)-1]
		}
	}
	p = p[:strings.LastIndexAny(p, "-_:/. ")+1]
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strings.TrimPrefix(n, p)
	}
	return out
}
