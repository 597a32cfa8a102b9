package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/slo"
)

// SLORun is what a run's requests with objectives attained.
type SLORun struct {
	// Requests counts the requests with objectives, refused ones
	// included; Classes splits them by criticality.
	Requests int        `json:"requests"`
	Classes  []SLOClass `json:"classes"`
	// Goodput is the requests that met both their objectives per second
	// of the workload's arrivals (the span from the first arrival to the
	// last, the same for every policy on one workload), and GoodputTokS
	// their output tokens per second.
	Goodput     float64 `json:"goodput_req_s"`
	GoodputTokS float64 `json:"goodput_tok_s"`
	// Attainment is the share of Requests that met both objectives (a
	// refused request meets none).
	Attainment float64 `json:"attainment"`
	// TTFTError and ITLError are the prediction's error: the observed
	// over the predicted value, over the served requests the router made
	// a prediction for.
	TTFTError ErrDist `json:"ttft_error"`
	ITLError  ErrDist `json:"itl_error"`
}

// SLOClass is one criticality's attainment.
type SLOClass struct {
	Class    string `json:"class"`
	Requests int    `json:"requests"`
	// Shed were refused for their objectives; Served got an answer;
	// MetTTFT, MetITL and MetBoth count the served requests within their
	// objective(s).
	Shed    int `json:"shed"`
	Served  int `json:"served"`
	MetTTFT int `json:"met_ttft"`
	MetITL  int `json:"met_itl"`
	MetBoth int `json:"met_both"`
}

// Attainment is the share of the class's requests that met both
// objectives.
func (c SLOClass) Attainment() float64 {
	if c.Requests == 0 {
		return 0
	}
	return float64(c.MetBoth) / float64(c.Requests)
}

// ErrDist is a distribution of observed/predicted ratios.
type ErrDist struct {
	N   int     `json:"n"`
	P10 float64 `json:"p10"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
}

// MeanITL is a completed sample's mean time between output tokens; 0 for
// one of at most one token.
func MeanITL(s *Sample) time.Duration {
	if s.OutputTokens <= 1 {
		return 0
	}
	return (s.E2E - s.TTFT) / time.Duration(s.OutputTokens-1)
}

// summarizeSLO summarises the samples with objectives; nil when none has.
func summarizeSLO(samples []Sample) *SLORun {
	var r SLORun
	classes := map[slo.Class]*SLOClass{}
	var first, last time.Duration
	var ttftErr, itlErr []float64
	tokens := 0
	for i := range samples {
		s := &samples[i]
		if i == 0 || s.Start < first {
			first = s.Start
		}
		last = max(last, s.Start)
		if s.Objective.None() {
			continue
		}
		r.Requests++
		c := classes[s.Objective.Class]
		if c == nil {
			c = &SLOClass{Class: s.Objective.Class.String()}
			classes[s.Objective.Class] = c
		}
		c.Requests++
		if s.Shed {
			c.Shed++
			continue
		}
		if s.Err != "" {
			continue
		}
		c.Served++
		itl := MeanITL(s)
		a := s.Objective.Judge(s.TTFT, itl)
		if a.TTFT {
			c.MetTTFT++
		}
		if a.ITL {
			c.MetITL++
		}
		if a.Both() {
			c.MetBoth++
			tokens += s.OutputTokens
		}
		if s.PredTTFT > 0 {
			ttftErr = append(ttftErr, s.TTFT.Seconds()/s.PredTTFT)
		}
		if s.PredITL > 0 && itl > 0 {
			itlErr = append(itlErr, itl.Seconds()/s.PredITL)
		}
	}
	if r.Requests == 0 {
		return nil
	}
	met := 0
	for _, k := range slo.Classes {
		if c := classes[k]; c != nil {
			r.Classes = append(r.Classes, *c)
			met += c.MetBoth
		}
	}
	r.Attainment = float64(met) / float64(r.Requests)
	if span := (last - first).Seconds(); span > 0 {
		r.Goodput = float64(met) / span
		r.GoodputTokS = float64(tokens) / span
	}
	r.TTFTError, r.ITLError = errDist(ttftErr), errDist(itlErr)
	return &r
}

// errDist summarises ratios.
func errDist(xs []float64) ErrDist {
	if len(xs) == 0 {
		return ErrDist{}
	}
	slices.Sort(xs)
	return ErrDist{N: len(xs), P10: Percentile(xs, 10), P50: Percentile(xs, 50), P90: Percentile(xs, 90)}
}

// Class returns the run's figures for class c (zero when it had none).
func (r *SLORun) Class(c slo.Class) SLOClass {
	for _, x := range r.Classes {
		if x.Class == c.String() {
			return x
		}
	}
	return SLOClass{Class: c.String()}
}

// writeSLO writes the objectives' table beside the latency table: goodput,
// attainment by criticality, the requests shed, and the prediction's
// error (observed / predicted, median and 10th-90th percentiles).
func writeSLO(w io.Writer, runs []Run) {
	some := false
	for i := range runs {
		some = some || runs[i].SLO != nil
	}
	if !some {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join([]string{"objectives: policy", "load", "goodput req/s", "goodput tok/s", "met both",
		"critical met", "standard met", "sheddable met", "shed", "TTFT err p50 (p10-p90)", "ITL err p50 (p10-p90)"}, "\t")+"\t")
	for _, r := range runs {
		s := r.SLO
		if s == nil {
			continue
		}
		shed := 0
		for _, c := range s.Classes {
			shed += c.Shed
		}
		row := []string{r.Policy, fmt.Sprintf("%.2f", r.OfferedLoad), fmt.Sprintf("%.2f", s.Goodput), fmt.Sprintf("%.0f", s.GoodputTokS),
			pct(s.Attainment)}
		for _, k := range slo.Classes {
			c := s.Class(k)
			if c.Requests == 0 {
				row = append(row, "-")
				continue
			}
			row = append(row, pct(c.Attainment()))
		}
		row = append(row, fmt.Sprint(shed), errCell(s.TTFTError), errCell(s.ITLError))
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintln(w, "goodput: requests (and their output tokens) that met both objectives per second of arrivals; met: share of the class's requests, refused ones included; err: observed / predicted")
}

// errCell renders an error distribution, "-" when empty.
func errCell(d ErrDist) string {
	if d.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f-%.2f)", d.P50, d.P10, d.P90)
}
