package compare

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/server"
)

// Fault kinds (Fault.Kind).
const (
	// FaultKill crashes the first engine: its listener and every
	// connection closed, whatever they were doing.
	FaultKill = "kill"
	// FaultHang has the first engine stop sending, its connections kept
	// open: the router's upstream.stream_idle_timeout (set to HangIdle)
	// finds its streams.
	FaultHang = "hang"
	// FaultRestart restarts every engine in turn, as a rolling update
	// does: drained, its streams finishing or moved after
	// fleet.drain_grace, stopped once it holds none, started again on the
	// same address, undrained.
	FaultRestart = "restart"
)

// Fault is a fault injected into every policy's run.
type Fault struct {
	// Kind is FaultKill, FaultHang or FaultRestart; At how long (wall
	// clock) into the run it starts.
	Kind string
	At   time.Duration
	// DrainGrace, when positive, is the router's fleet.drain_grace.
	DrainGrace time.Duration
	// HangIdle is the router's upstream.stream_idle_timeout for a hang;
	// 0 means 1s.
	HangIdle time.Duration
}

// FaultResult is how a run took its fault. Latencies are emulated time.
type FaultResult struct {
	Kind string
	At   time.Duration
	// Errors are the requests whose client saw an error (a status other
	// than 200, an error event, a broken stream); Requests all of them;
	// Why the first few distinct errors.
	Errors, Requests int
	Why              []string
	// Moved is the streams the router moved to another engine
	// (kvroute_migrations_total, outcome moved).
	Moved int
	// Hit is the completed streams that were streaming from a faulted
	// engine when the fault began (FaultRestart: when the restart began);
	// Added their added latency at the median and p99 (their longest gap
	// between two tokens after that moment less their median gap: the
	// move's wait), and Bound the p99
	// of its bound, the prefill time of the stream's context on an idle
	// engine plus 100 ms; Over the streams whose added latency was over
	// their own bound.
	Hit              int
	Added50, Added99 time.Duration
	Bound99          time.Duration
	Over             int
	// Restarts are each engine's restart (drain to undrain), wall clock,
	// for FaultRestart; Started how long the engine took to start.
	Restarts []time.Duration
	Started  time.Duration
}

// injector injects cfg.Fault into one run: its engines' servers, the
// router (the fleet and its metrics) and how to start an engine again.
type injector struct {
	f       Fault
	servers []*http.Server
	addrs   []string
	names   []string
	hung    []*atomic.Bool
	restart func(i int) (*emulator.Server, error)
	router  *server.Server
	preset  engine.Preset
	timer   *time.Timer
	done    sync.WaitGroup
	mu      sync.Mutex
	res     FaultResult
	faulted map[string]bool
	// started are the engines the restart started.
	started []*emulator.Server
}

// hangable serves h until hung, after which its writes block until the
// request ends: an engine that keeps its connections and sends nothing.
type hangable struct {
	h    http.Handler
	hung *atomic.Bool
}

func (g hangable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.h.ServeHTTP(&hangWriter{ResponseWriter: w, g: g, ctx: r.Context()}, r)
}

type hangWriter struct {
	http.ResponseWriter
	g   hangable
	ctx context.Context
}

func (w *hangWriter) Write(p []byte) (int, error) {
	if w.g.hung.Load() {
		<-w.ctx.Done()
		return 0, w.ctx.Err()
	}
	return w.ResponseWriter.Write(p)
}

func (w *hangWriter) Flush() {
	if !w.g.hung.Load() {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *hangWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newInjector prepares f for a run whose router is configured by cc
// (its drain grace, its stream idle timeout for a hang) and whose engines
// are of preset p (the bound of a move's latency).
func newInjector(f Fault, cc *config.Config, p engine.Preset) *injector {
	if f.DrainGrace > 0 {
		cc.Fleet.DrainGrace = f.DrainGrace
	}
	if f.Kind == FaultHang {
		cc.Upstream.StreamIdleTimeout = cmp.Or(f.HangIdle, time.Second)
	}
	return &injector{f: f, preset: p}
}

// engine is the handler engine ec serves through: one that can hang.
// The restart starts a fresh engine of the same config.
func (in *injector) engine(ec emulator.Config, h http.Handler) http.Handler {
	hung := &atomic.Bool{}
	in.hung = append(in.hung, hung)
	prev := in.restart
	i := len(in.hung) - 1
	in.restart = func(j int) (*emulator.Server, error) {
		if j != i {
			return prev(j)
		}
		return emulator.New(ec)
	}
	return hangable{h: h, hung: hung}
}

// served notes the server of the engine named name, at url.
func (in *injector) served(name, url string, srv *http.Server) {
	in.names = append(in.names, name)
	in.servers = append(in.servers, srv)
	in.addrs = append(in.addrs, strings.TrimPrefix(url, "http://"))
}

// arm starts the fault's clock: the run starts now.
func (in *injector) arm() {
	in.res = FaultResult{Kind: in.f.Kind, At: in.f.At}
	in.faulted = map[string]bool{}
	in.done.Add(1)
	in.timer = time.AfterFunc(in.f.At, func() {
		defer in.done.Done()
		switch in.f.Kind {
		case FaultKill:
			in.mark(0)
			_ = in.servers[0].Close()
		case FaultHang:
			in.mark(0)
			in.hung[0].Store(true)
		case FaultRestart:
			for i := range in.servers {
				d, err := in.restartOne(i)
				if err != nil {
					return
				}
				in.mu.Lock()
				in.res.Restarts = append(in.res.Restarts, d)
				in.mu.Unlock()
			}
		}
	})
}

func (in *injector) mark(i int) {
	in.mu.Lock()
	in.faulted[in.names[i]] = true
	in.mu.Unlock()
}

// restartOne drains engine i, stops it once it holds no request, starts
// it again on its address and undrains it; it returns how long that took.
func (in *injector) restartOne(i int) (time.Duration, error) {
	start := time.Now()
	b := in.backend(in.names[i])
	if b == nil {
		return 0, fmt.Errorf("no backend %s", in.names[i])
	}
	in.mark(i)
	in.router.Fleet().Drain(b)
	for b.OwnLoad().InFlight > 0 {
		time.Sleep(5 * time.Millisecond)
	}
	_ = in.servers[i].Close()
	up := time.Now()
	em, err := in.restart(i)
	if err != nil {
		return 0, err
	}
	ln, err := net.Listen("tcp", in.addrs[i])
	if err != nil {
		_ = em.Close()
		return 0, err
	}
	srv := &http.Server{Handler: em.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	in.mu.Lock()
	in.servers[i] = srv
	in.started = append(in.started, em)
	in.res.Started = max(in.res.Started, time.Since(up))
	in.mu.Unlock()
	in.router.Fleet().Undrain(b)
	return time.Since(start), nil
}

func (in *injector) backend(name string) *fleet.Backend {
	for _, b := range in.router.Fleet().Snapshot().All {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// close stops the engines the restart started.
func (in *injector) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, s := range in.servers {
		_ = s.Close()
	}
	for _, em := range in.started {
		_ = em.Close()
	}
}

// result waits for the fault to be over and sums the run up.
func (in *injector) result(samples []report.Sample, timeScale float64) FaultResult {
	if in.timer.Stop() {
		in.done.Done() // the run ended before the fault
	}
	in.done.Wait()
	in.mu.Lock()
	defer in.mu.Unlock()
	res := in.res
	res.Requests = len(samples)
	res.Moved = in.moved()
	var added, bounds []time.Duration
	for _, s := range samples {
		if s.Err != "" || s.Status != http.StatusOK {
			res.Errors++
			why := fmt.Sprintf("%d %s", s.Status, s.Err)
			if len(res.Why) < 3 && !slices.Contains(res.Why, why) {
				res.Why = append(res.Why, why)
			}
			continue
		}
		if !in.faulted[s.Backend] || len(s.ITL) < 2 {
			continue
		}
		// The gap the fault made: the longest that ends after it, in a
		// stream that had started before it (one that did not had
		// nothing to move).
		t := s.Start + s.TTFT
		if t >= in.f.At {
			continue
		}
		at, gap := -1, time.Duration(0)
		for j, g := range s.ITL {
			t += g
			if t >= in.f.At && g > gap {
				at, gap = j, g
			}
		}
		if at < 0 {
			continue // over before the fault
		}
		res.Hit++
		gaps := slices.Clone(s.ITL)
		slices.Sort(gaps)
		a := scale(gap-gaps[len(gaps)/2], timeScale)
		// The context to compute again: the prompt and the tokens sent
		// before the gap.
		ctxTokens := s.PromptTokens + at + 1
		bound := in.preset.StepOverhead + time.Duration(ctxTokens)*in.preset.PerPrefillToken + 100*time.Millisecond
		if a > bound {
			res.Over++
		}
		added, bounds = append(added, a), append(bounds, bound)
	}
	res.Added50, res.Added99 = quantile(added, 0.5), quantile(added, 0.99)
	res.Bound99 = quantile(bounds, 0.99)
	return res
}

// moved reads the router's kvroute_migrations_total{outcome="moved"}.
func (in *injector) moved() int {
	resp, err := http.Get("http://" + in.router.Addr() + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "kvroute_migrations_total{") && strings.Contains(line, `outcome="moved"`) {
			if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				n += v
			}
		}
	}
	return int(n)
}

// quantile is q of ds (sorted in place), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
