package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/report"
)

// errNotOpenAI prefixes the error of a non-200 response whose body is not
// the OpenAI error shape: a soak counts such a response as a failure even
// when its status is 429 or 503.
const errNotOpenAI = "error body not in the OpenAI shape: "

// isErrorBody reports whether b is an OpenAI error body with a message.
func isErrorBody(b []byte) bool {
	var eb openai.ErrorBody
	return json.Unmarshal(b, &eb) == nil && eb.Error.Message != ""
}

// Soak defaults.
const (
	DefaultSoakInterval = 10 * time.Second
	DefaultSoakGrace    = 30 * time.Second
)

// SoakConfig describes a soak: a long open-loop run at more load than the
// fleet can serve, whose verdict is about the router staying healthy
// (nothing lost, nothing hung, goroutines and memory flat, the admitted
// requests' TTFT bounded) rather than about its latency distribution.
type SoakConfig struct {
	// Run is the open-loop run; its Requests should span Duration.
	Run Config
	// Duration is how long arrivals last; later requests are dropped.
	Duration time.Duration
	// Grace is how long requests still open after the last arrival may
	// take to end; those still open then are cut and counted lost. Default
	// DefaultSoakGrace.
	Grace time.Duration
	// Interval between two report lines. Default DefaultSoakInterval.
	Interval time.Duration
	// Warmup is left out of the flatness check (goroutines and resident
	// memory ramp up with the load first). Default: a fifth of Duration,
	// at least one Interval.
	Warmup time.Duration
	// Metrics is the router's /metrics URL, read every Interval for
	// go_goroutines and process_resident_memory_bytes; empty skips them.
	Metrics string
	// TTFTBound is the highest p99 TTFT of completed requests allowed in
	// any interval after Warmup; 0 checks nothing.
	TTFTBound time.Duration
	// Out receives a line every Interval and the final table.
	Out io.Writer
	// Started, when not nil, is called as the run starts (the clock of a
	// fault injected into it: package fault).
	Started func()
	// Blame, when not nil, tells the failures a fault injected into the
	// run caused: counted apart (FaultFailed), and failing the soak all
	// the same, since a router that moves streams should cost no client
	// an error when an engine dies, hangs or restarts.
	Blame func(*report.Sample) bool
}

// SoakWindow is one reporting interval: the requests that arrived in it
// and, when the router exposes them, its goroutines and resident memory at
// the interval's end.
type SoakWindow struct {
	// End is the interval's end from the start of the run.
	End                               time.Duration
	Sent, Completed, Rejected, Failed int
	Lost                              int
	TTFTP99                           time.Duration
	Goroutines                        float64
	RSSBytes                          float64
	InFlight, Queued                  float64
}

// SoakResult is a soak's outcome. Problems is empty when it passed.
type SoakResult struct {
	Sent int
	// Completed requests read a whole stream ended by [DONE].
	Completed int
	// Rejected requests got a clean 429 or 503: the OpenAI error shape.
	Rejected int
	// Failed requests got anything else: another status, a broken stream,
	// an error body in another shape.
	Failed int
	// FaultFailed requests failed or were lost because of a fault
	// injected into the run (SoakConfig.Blame); Failed and Lost do not
	// count them.
	FaultFailed int
	// Lost requests neither completed nor failed by the end of the grace
	// period: they hung, and were cut.
	Lost int
	// TTFTP99 is over every completed request.
	TTFTP99 time.Duration
	// Baseline and After are the router's goroutines before the load and
	// once it is idle again; AfterInFlight and AfterQueued its requests in
	// flight and queued then (both must be 0); Backends how many backends
	// it reports.
	Baseline, After            float64
	AfterInFlight, AfterQueued float64
	Backends                   int
	Windows                    []SoakWindow
	FirstFailure               string
	FirstFaultFailure          string
	Problems                   []string
	// Samples are the run's requests, wall clock from its start.
	Samples []report.Sample
}

// Soak runs cfg.Run for cfg.Duration, reports every Interval, and judges
// the run (see SoakResult). It returns an error only when the run could
// not be made; a failed verdict is in Problems.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSoakInterval
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultSoakGrace
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = max(cfg.Duration/5, cfg.Interval)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	run := cfg.Run
	run.Duration = cfg.Duration
	res := &SoakResult{}
	probe := &http.Client{Timeout: 5 * time.Second}
	if cfg.Metrics != "" {
		g, err := readRouterMetrics(ctx, probe, cfg.Metrics)
		if err != nil {
			return nil, err
		}
		res.Baseline = g.goroutines
	}

	// Requests still open Grace after the last arrival are cut: that is
	// what "hung" means here, and it bounds the soak.
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.Grace)
	defer cancel()
	var (
		mu       sync.Mutex
		readings []SoakWindow // End, Goroutines, RSSBytes only
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			w := SoakWindow{End: time.Since(start).Round(time.Second)}
			if cfg.Metrics != "" {
				g, _ := readRouterMetrics(runCtx, probe, cfg.Metrics)
				w.Goroutines, w.RSSBytes, w.InFlight, w.Queued = g.goroutines, g.rss, g.inflight, g.queued
			}
			mu.Lock()
			readings = append(readings, w)
			mu.Unlock()
			fmt.Fprintf(cfg.Out, "soak %6v: router goroutines %s, resident memory %s, in flight %s, queued %s\n", w.End,
				gauge(w.Goroutines, cfg.Metrics), mib(w.RSSBytes, cfg.Metrics), gauge(w.InFlight, cfg.Metrics), gauge(w.Queued, cfg.Metrics))
		}
	}()
	if cfg.Started != nil {
		cfg.Started()
	}
	samples, _, runErr := Drive(runCtx, run)
	close(stop)
	<-sampled
	if samples == nil && runErr != nil {
		return nil, runErr
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("soak interrupted: %w", ctx.Err())
	}
	if cfg.Metrics != "" {
		// Idle again: nothing in flight or queued, and the goroutines of
		// finished requests gone. The router's pool of idle connections
		// to the engines keeps two goroutines per connection (see
		// idleBound); give the bookkeeping a few seconds.
		probe.CloseIdleConnections()
		if c := run.Client; c != nil {
			c.CloseIdleConnections()
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			g, err := readRouterMetrics(ctx, probe, cfg.Metrics)
			if err == nil {
				res.After, res.AfterInFlight, res.AfterQueued, res.Backends = g.goroutines, g.inflight, g.queued, g.backends
			}
			if err == nil && g.inflight == 0 && g.queued == 0 && g.goroutines <= res.idleBound() || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	res.Samples = samples
	res.judge(samples, readings, cfg)
	res.writeTable(cfg.Out, cfg)
	return res, nil
}

// idleSlack is how many more goroutines than before the load an idle
// router may keep besides its idle upstream connections (timers, the
// listener's accepted but idle client connections being reaped).
const idleSlack = 50

// upstreamIdlePerBackend is the router's bound on idle connections kept
// to each backend (proxy's transport, MaxIdleConnsPerHost); each holds a
// read and a write goroutine until upstream idle timeout closes it.
const upstreamIdlePerBackend = 256

// idleBound is the most goroutines an idle router may have without a
// leak: what it had before the load, plus its pool of idle upstream
// connections, plus a slack. A leak of one goroutine per request exceeds
// it within the first few thousand requests.
func (res *SoakResult) idleBound() float64 {
	return res.Baseline + float64(2*upstreamIdlePerBackend*res.Backends) + idleSlack
}

// Refused reports whether the router refused s cleanly: a 429 or 503 in
// the OpenAI error shape, which a soak at more load than the fleet can
// serve expects of its admission queue.
func Refused(s *report.Sample) bool {
	_, rejected, _, _ := classify(s)
	return rejected
}

// classify sorts one sample into completed, rejected, failed or lost.
func classify(s *report.Sample) (completed, rejected, failed, lost bool) {
	switch {
	case s.Err == "":
		return true, false, false, false
	case (s.Status == http.StatusTooManyRequests || s.Status == http.StatusServiceUnavailable) && !strings.HasPrefix(s.Err, errNotOpenAI):
		return false, true, false, false
	case strings.Contains(s.Err, context.DeadlineExceeded.Error()) || strings.Contains(s.Err, context.Canceled.Error()):
		return false, false, false, true
	}
	return false, false, true, false
}

func (res *SoakResult) judge(samples []report.Sample, readings []SoakWindow, cfg SoakConfig) {
	n := max(len(readings), int((cfg.Duration+cfg.Interval-1)/cfg.Interval))
	wins := make([]SoakWindow, n)
	ttfts := make([][]time.Duration, n)
	var all []time.Duration
	for i := range wins {
		wins[i].End = time.Duration(i+1) * cfg.Interval
		if i < len(readings) {
			wins[i].Goroutines, wins[i].RSSBytes = readings[i].Goroutines, readings[i].RSSBytes
		}
	}
	for i := range samples {
		s := &samples[i]
		w := min(int(s.Start/cfg.Interval), n-1)
		c, r, f, l := classify(s)
		res.Sent++
		wins[w].Sent++
		switch {
		case c:
			res.Completed++
			wins[w].Completed++
			ttfts[w] = append(ttfts[w], s.TTFT)
			all = append(all, s.TTFT)
		case r:
			res.Rejected++
			wins[w].Rejected++
		case (f || l) && cfg.Blame != nil && cfg.Blame(s):
			// The fault's: shown in its interval's column, counted
			// apart.
			res.FaultFailed++
			if l {
				wins[w].Lost++
			} else {
				wins[w].Failed++
			}
			if res.FirstFaultFailure == "" {
				res.FirstFaultFailure = s.Err
			}
		case l:
			res.Lost++
			wins[w].Lost++
		case f:
			res.Failed++
			wins[w].Failed++
			if res.FirstFailure == "" {
				res.FirstFailure = s.Err
			}
		}
	}
	for i := range wins {
		wins[i].TTFTP99 = p99(ttfts[i])
	}
	res.TTFTP99 = p99(all)
	res.Windows = wins

	bad := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }
	if res.Sent == 0 {
		bad("no request was sent")
	}
	if res.Lost > 0 {
		bad("%d requests lost: still open %v after the last arrival", res.Lost, cfg.Grace)
	}
	if res.Failed > 0 {
		bad("%d requests failed without a clean 429 or 503; first: %s", res.Failed, res.FirstFailure)
	}
	if res.FaultFailed > 0 {
		bad("%d requests failed or were lost because of the injected fault (a stream on a failed engine moves: none should); first: %s", res.FaultFailed, res.FirstFaultFailure)
	}
	if res.Completed == 0 && res.Sent > 0 {
		bad("no request completed")
	}
	if cfg.TTFTBound > 0 {
		for _, w := range wins {
			if w.End > cfg.Warmup && w.TTFTP99 > cfg.TTFTBound {
				bad("p99 TTFT %v in the interval ending at %v is over the bound %v", w.TTFTP99.Round(time.Millisecond), w.End, cfg.TTFTBound)
			}
		}
	}
	if cfg.Metrics == "" {
		return
	}
	if res.AfterInFlight != 0 || res.AfterQueued != 0 {
		bad("once idle the router still counts %.0f requests in flight and %.0f queued", res.AfterInFlight, res.AfterQueued)
	}
	if res.After > res.idleBound() {
		bad("router goroutines %.0f once idle, %.0f before the load, more than its idle upstream connections explain (%.0f): a leak", res.After, res.Baseline, res.idleBound())
	}
	// Flat after warm-up: the second half of the post-warm-up readings may
	// not exceed the first half's peak by more than a margin.
	var post []SoakWindow
	for _, w := range wins {
		if w.End > cfg.Warmup && w.Goroutines > 0 {
			post = append(post, w)
		}
	}
	if len(post) >= 2 {
		h := (len(post) + 1) / 2
		var g0, r0, g1, r1 float64
		for i, w := range post {
			if i < h {
				g0, r0 = max(g0, w.Goroutines), max(r0, w.RSSBytes)
			} else {
				g1, r1 = max(g1, w.Goroutines), max(r1, w.RSSBytes)
			}
		}
		if g1 > 1.5*g0+100 {
			bad("router goroutines grew after warm-up: peak %.0f, then %.0f", g0, g1)
		}
		if r1 > 1.25*r0+32<<20 {
			bad("router resident memory grew after warm-up: peak %s, then %s", mib(r0, "x"), mib(r1, "x"))
		}
	}
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, (len(ds)*99+99)/100-1)]
}

func (res *SoakResult) writeTable(w io.Writer, cfg SoakConfig) {
	fmt.Fprintf(w, "\n%8s %7s %9s %8s %6s %5s %10s %10s %8s\n", "interval", "sent", "completed", "429/503", "failed", "lost", "p99 TTFT", "goroutines", "RSS")
	for _, win := range res.Windows {
		fmt.Fprintf(w, "%8v %7d %9d %8d %6d %5d %10v %10s %8s\n", win.End, win.Sent, win.Completed, win.Rejected, win.Failed, win.Lost,
			win.TTFTP99.Round(time.Millisecond), gauge(win.Goroutines, cfg.Metrics), mib(win.RSSBytes, cfg.Metrics))
	}
	fault := ""
	if cfg.Blame != nil {
		fault = fmt.Sprintf(" (and %d failed or lost because of the fault)", res.FaultFailed)
	}
	fmt.Fprintf(w, "\nsoak %v: %d sent, %d completed, %d rejected cleanly (429/503), %d failed%s, %d lost; p99 TTFT of completed %v\n",
		cfg.Duration, res.Sent, res.Completed, res.Rejected, res.Failed, fault, res.Lost, res.TTFTP99.Round(time.Millisecond))
	if cfg.Metrics != "" {
		fmt.Fprintf(w, "router once idle: %.0f goroutines (%.0f before the load; bound %.0f with %d backends' idle connections), %.0f in flight, %.0f queued\n",
			res.After, res.Baseline, res.idleBound(), res.Backends, res.AfterInFlight, res.AfterQueued)
	}
	if len(res.Problems) == 0 {
		fmt.Fprintln(w, "verdict: PASS")
		return
	}
	fmt.Fprintln(w, "verdict: FAIL")
	for _, p := range res.Problems {
		fmt.Fprintln(w, "  "+p)
	}
}

func gauge(v float64, src string) string {
	if src == "" {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func mib(v float64, src string) string {
	if src == "" {
		return "-"
	}
	return strconv.FormatFloat(v/(1<<20), 'f', 1, 64) + "MiB"
}

// routerGauges are the router's figures a soak watches.
type routerGauges struct {
	goroutines, rss float64
	// inflight and queued sum kvroute_inflight_requests over backends and
	// kvroute_queue_length; backends counts the former's series.
	inflight, queued float64
	backends         int
}

// readRouterMetrics reads go_goroutines, process_resident_memory_bytes,
// kvroute_inflight_requests and kvroute_queue_length from a Prometheus
// text endpoint. A line scan does for these few gauges; a missing
// goroutine or memory gauge is an error.
func readRouterMetrics(ctx context.Context, c *http.Client, url string) (routerGauges, error) {
	var g routerGauges
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return g, fmt.Errorf("router metrics: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return g, fmt.Errorf("router metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return g, fmt.Errorf("router metrics: GET %s: status %d", url, resp.StatusCode)
	}
	var gotG, gotR bool
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		name := line[:sp]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		switch name {
		case "go_goroutines":
			g.goroutines, gotG = v, true
		case "process_resident_memory_bytes":
			g.rss, gotR = v, true
		case "kvroute_inflight_requests":
			g.inflight += v
			g.backends++
		case "kvroute_queue_length":
			g.queued += v
		}
	}
	if !gotG || !gotR {
		return g, errors.New("router metrics: " + url + " has no go_goroutines or process_resident_memory_bytes gauge")
	}
	return g, nil
}
