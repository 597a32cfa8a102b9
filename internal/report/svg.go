package report

import (
	"bufio"
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
)

// The charts are hand-written SVG: self-contained files that any browser
// opens, with no plotting dependency.

const (
	svgW, svgH             = 720, 440
	padL, padR, padT, padB = 70, 20, 40, 50
	plotW, plotH           = svgW - padL - padR, svgH - padT - padB
	maxPointsPerLine       = 400
	legendLineH            = 18
	legendW                = 170
)

// legendCorner places the legend where a chart's lines seldom are.
type legendCorner int

const (
	// topLeft suits curves that rise to the right (p99 against load).
	topLeft legendCorner = iota
	// bottomRight suits CDFs, which are at 1 on the right.
	bottomRight
)

// palette holds distinguishable line colours (Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

// lineStyle is the stroke attributes of the i-th series: its palette
// colour, dashed from the second round of the palette on (kvroute sim runs
// a dozen policies), so that no two series look alike.
func lineStyle(i int) string {
	st := fmt.Sprintf(`stroke="%s"`, palette[i%len(palette)])
	if i >= len(palette) {
		st += ` stroke-dasharray="6 3"`
	}
	return st
}

// fillStyle is the same for a bar: from the second round on, lighter with
// an outline.
func fillStyle(i int) string {
	c := palette[i%len(palette)]
	if i >= len(palette) {
		return fmt.Sprintf(`fill="%s" fill-opacity="0.45" stroke="%s"`, c, c)
	}
	return fmt.Sprintf(`fill="%s"`, c)
}

// axis maps data values to pixels, linearly or in log10.
type axis struct {
	lo, hi float64
	log    bool
	px     float64 // length in pixels
}

func (a axis) pos(v float64) float64 {
	lo, hi := a.lo, a.hi
	if a.log {
		v, lo, hi = math.Log10(math.Max(v, a.lo)), math.Log10(lo), math.Log10(hi)
	}
	if hi == lo {
		return 0
	}
	return (v - lo) / (hi - lo) * a.px
}

// ticks returns tick values: powers of ten on a log axis, 1-2-5 steps on a
// linear one.
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		for e := math.Floor(math.Log10(a.lo)); e <= math.Ceil(math.Log10(a.hi)); e++ {
			if v := math.Pow(10, e); v >= a.lo*0.999 && v <= a.hi*1.001 {
				out = append(out, v)
			}
		}
		return out
	}
	step := niceStep((a.hi - a.lo) / 5)
	// Integer multiples of the step, so that 0.1 steps do not drift.
	for k := math.Ceil(a.lo / step); k*step <= a.hi+step*1e-9; k++ {
		out = append(out, k*step)
	}
	return out
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// logRange widens [lo, hi] to whole decades.
func logRange(lo, hi float64) (float64, float64) {
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

func fmtTick(v float64) string {
	switch {
	case v >= 1000 && math.Mod(v, 1000) == 0:
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%.4g", v)
}

type series struct {
	name   string
	x, y   []float64
	points bool
}

// frame starts a chart: the title, the grid and ticks of ya (and of xa
// unless categorical), the plot area and the axis labels. The caller draws
// its content and closes the svg element.
func frame(bw *bufio.Writer, title, xlabel, ylabel string, xa, ya axis, categorical bool) {
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(bw, `<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", svgW/2, html.EscapeString(title))
	X := func(v float64) float64 { return padL + xa.pos(v) }
	Y := func(v float64) float64 { return padT + plotH - ya.pos(v) }
	if !categorical {
		for _, t := range xa.ticks() {
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", X(t), padT, X(t), padT+plotH)
			fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", X(t), padT+plotH+16, fmtTick(t))
		}
	}
	for _, t := range ya.ticks() {
		fmt.Fprintf(bw, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, Y(t), padL+plotW, Y(t))
		fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", padL-6, Y(t), fmtTick(t))
	}
	fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", padL, padT, plotW, plotH)
	fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, svgH-12, html.EscapeString(xlabel))
	fmt.Fprintf(bw, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, html.EscapeString(ylabel))
}

// legend writes one entry per name, in the palette's order.
func legend(bw *bufio.Writer, names []string, corner legendCorner) {
	x, y := padL+12, padT+16
	if corner == bottomRight {
		x, y = padL+plotW-legendW, padT+plotH-12-(len(names)-1)*legendLineH
	}
	if len(names) > 0 {
		// A backing so that the names stay legible over the lines.
		fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="white" fill-opacity="0.85" stroke="#ccc"/>`+"\n",
			x-6, y-legendLineH/2-2, legendW-6, len(names)*legendLineH+4)
	}
	for i, name := range names {
		ly := y + i*legendLineH
		fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" %s stroke-width="3"/>`+"\n", x, ly, x+20, ly, lineStyle(i))
		fmt.Fprintf(bw, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", x+26, ly, html.EscapeString(name))
	}
}

// plot writes a chart with axes, grid, ticks, labels and a legend.
func plot(w io.Writer, title, xlabel, ylabel string, xa, ya axis, lines []series, corner legendCorner) error {
	bw := bufio.NewWriter(w)
	frame(bw, title, xlabel, ylabel, xa, ya, false)
	X := func(v float64) float64 { return padL + xa.pos(v) }
	Y := func(v float64) float64 { return padT + plotH - ya.pos(v) }
	names := make([]string, len(lines))
	for i, s := range lines {
		names[i] = s.name
		c := palette[i%len(palette)]
		fmt.Fprintf(bw, `<polyline fill="none" %s stroke-width="2" points="`, lineStyle(i))
		for j := range s.x {
			fmt.Fprintf(bw, "%.1f,%.1f ", X(s.x[j]), Y(s.y[j]))
		}
		fmt.Fprintln(bw, `"/>`)
		if s.points {
			for j := range s.x {
				fmt.Fprintf(bw, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", X(s.x[j]), Y(s.y[j]), c)
			}
		}
	}
	legend(bw, names, corner)
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

// barChart writes grouped bars: one group per label along the x axis, one
// bar per series in each group (values[s][g] is series s in group g), with
// the series coloured as the lines of the other charts.
func barChart(w io.Writer, title, xlabel, ylabel string, ya axis, groups, names []string, values [][]float64) error {
	bw := bufio.NewWriter(w)
	frame(bw, title, xlabel, ylabel, axis{}, ya, true)
	Y := func(v float64) float64 { return padT + plotH - ya.pos(v) }
	if len(groups) > 0 && len(names) > 0 {
		gw := float64(plotW) / float64(len(groups))
		bar := gw * 0.8 / float64(len(names))
		for g, label := range groups {
			x0 := padL + float64(g)*gw + gw*0.1
			for s := range names {
				v := 0.0
				if g < len(values[s]) {
					v = values[s][g]
				}
				fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" %s><title>%s, %s: %.4g</title></rect>`+"\n",
					x0+float64(s)*bar, Y(v), bar, Y(ya.lo)-Y(v), fillStyle(s), html.EscapeString(names[s]), html.EscapeString(label), v)
			}
			fmt.Fprintf(bw, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", padL+(float64(g)+0.5)*gw, padT+plotH+16, html.EscapeString(label))
		}
	}
	legend(bw, names, topLeft)
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

// minPositiveMs keeps zero latencies (possible with a coarse clock) on a log axis.
const minPositiveMs = 0.01

// WriteTTFTChart writes an SVG of each run's TTFT distribution (CDF), with
// a log-scale time axis: policies differ by orders of magnitude in the tail.
func WriteTTFTChart(w io.Writer, runs []Run) error {
	lo, hi := math.Inf(1), math.Inf(-1)
	var lines []series
	for _, r := range runs {
		var xs []float64
		for _, s := range r.Samples {
			if s.Err == "" {
				xs = append(xs, math.Max(ms(s.TTFT), minPositiveMs))
			}
		}
		slices.Sort(xs)
		s := series{name: r.Policy}
		n := len(xs)
		step := max(1, n/maxPointsPerLine)
		for i := 0; i < n; i += step {
			s.x, s.y = append(s.x, xs[i]), append(s.y, float64(i+1)/float64(n))
		}
		if n > 0 && s.x[len(s.x)-1] != xs[n-1] || n > 0 && s.y[len(s.y)-1] != 1 {
			s.x, s.y = append(s.x, xs[n-1]), append(s.y, 1)
		}
		if n > 0 {
			lo, hi = math.Min(lo, xs[0]), math.Max(hi, xs[n-1])
		}
		lines = append(lines, s)
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 1000
	}
	lo, hi = logRange(lo, hi)
	return plot(w, "TTFT distribution", "time to first token (ms, log scale)", "fraction of requests",
		axis{lo: lo, hi: hi, log: true, px: plotW}, axis{lo: 0, hi: 1, px: plotH}, lines, bottomRight)
}

// WriteSweepChart writes an SVG of p99 TTFT against offered load, one line
// per policy (log-scale TTFT axis).
func WriteSweepChart(w io.Writer, points []SweepPoint) error {
	byPolicy := map[string][]SweepPoint{}
	var order []string
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, p := range points {
		if _, ok := byPolicy[p.Policy]; !ok {
			order = append(order, p.Policy)
		}
		byPolicy[p.Policy] = append(byPolicy[p.Policy], p)
		y := math.Max(p.P99ms, minPositiveMs)
		xlo, xhi = math.Min(xlo, p.Load), math.Max(xhi, p.Load)
		ylo, yhi = math.Min(ylo, y), math.Max(yhi, y)
	}
	if len(points) == 0 {
		xlo, xhi, ylo, yhi = 0, 1, 1, 1000
	}
	if xhi == xlo {
		xlo, xhi = xlo-0.5, xhi+0.5
	}
	step := niceStep((xhi - xlo) / 5)
	xlo, xhi = math.Floor(xlo/step)*step, math.Ceil(xhi/step)*step
	ylo, yhi = logRange(ylo, yhi)
	var lines []series
	for _, name := range order {
		ps := byPolicy[name]
		slices.SortFunc(ps, func(a, b SweepPoint) int { return cmp.Compare(a.Load, b.Load) })
		s := series{name: name, points: true}
		for _, p := range ps {
			s.x, s.y = append(s.x, p.Load), append(s.y, math.Max(p.P99ms, minPositiveMs))
		}
		lines = append(lines, s)
	}
	return plot(w, "p99 TTFT against offered load", "offered load (fraction of prefill capacity)", "p99 TTFT (ms, log scale)",
		axis{lo: xlo, hi: xhi, px: plotW}, axis{lo: ylo, hi: yhi, log: true, px: plotH}, lines, topLeft)
}
