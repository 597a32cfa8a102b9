// Package fault injects a fault into a run on a fleet of emulated engines
// (an engine killed, an engine hung, every engine restarted in turn as a
// rolling update does) and sums up how the run's clients took it: the
// requests that saw an error, the streams the router moved to another
// engine, and the latency a move added to a stream against its bound.
// `kvroute compare` and `kvroute bench --soak` (on its own fleet) both
// inject their faults through it.
//
// It owns the engines' side of a fault (their HTTP servers, closed for a
// kill, stalled for a hang, started again on their address for a
// restart), the fault's clock, the timing of a rolling restart, and the
// arithmetic over the run's samples. The router's side (drain and undrain
// an engine, what it holds in flight, how many streams it moved) is a
// Router: one in this process (Local) or one in another, over its admin
// API and /metrics (Admin). It must not route, emulate nor generate load.
package fault

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
)

// Fault kinds (Fault.Kind).
const (
	// Kill crashes the first engine: its listener and every connection
	// closed, whatever they were doing.
	Kill = "kill"
	// Hang has the first engine stop sending, its connections kept open:
	// the router's upstream.stream_idle_timeout (set to HangIdle) finds
	// its streams.
	Hang = "hang"
	// Restart restarts every engine in turn, as a rolling update does:
	// drained, its streams finishing or moved after fleet.drain_grace,
	// stopped once it holds none, started again on the same address,
	// undrained.
	Restart = "restart"
)

// DefaultHangIdle is the router's upstream.stream_idle_timeout during a
// hang when Fault.HangIdle is 0.
const DefaultHangIdle = time.Second

// Fault is a fault injected into a run.
type Fault struct {
	// Kind is Kill, Hang or Restart; At how long (wall clock) into the
	// run it starts.
	Kind string
	At   time.Duration
	// DrainGrace, when positive, is the router's fleet.drain_grace.
	DrainGrace time.Duration
	// HangIdle is the router's upstream.stream_idle_timeout for a hang;
	// 0 means DefaultHangIdle.
	HangIdle time.Duration
}

// Check reports a fault that cannot be injected.
func (f Fault) Check() error {
	switch f.Kind {
	case Kill, Hang, Restart:
	default:
		return fmt.Errorf("fault %q: want %s, %s or %s", f.Kind, Kill, Hang, Restart)
	}
	if f.At <= 0 || f.DrainGrace < 0 || f.HangIdle < 0 {
		return errors.New("a fault takes a positive start (and a drain grace and hang idle timeout not negative)")
	}
	return nil
}

// StreamIdle is the router's upstream.stream_idle_timeout the fault
// needs, 0 when it needs none (only a hang does: its streams are found
// silent).
func (f Fault) StreamIdle() time.Duration {
	if f.Kind != Hang {
		return 0
	}
	return cmp.Or(f.HangIdle, DefaultHangIdle)
}

// Router is the router's side of a fault, named by backend name.
type Router interface {
	// Drain stops new requests to the backend; its streams go on for
	// fleet.drain_grace, then move.
	Drain(name string) error
	// Undrain lets it receive new requests again.
	Undrain(name string) error
	// InFlight is the requests the router has in flight on it.
	InFlight(name string) (int64, error)
	// Moved is the streams the router moved to another engine so far
	// (kvroute_migrations_total, outcome moved).
	Moved() (int, error)
}

// Injector injects one Fault into one run: it knows the run's engines'
// servers (Engine and Served, or Serve), starts the fault's clock (Arm),
// and sums the run up (Result).
type Injector struct {
	f       Fault
	preset  engine.Preset
	servers []*http.Server
	addrs   []string
	names   []string
	hung    []*atomic.Bool
	configs []emulator.Config
	router  Router
	timer   *time.Timer
	done    sync.WaitGroup
	mu      sync.Mutex
	res     Result
	faulted map[string]bool
	refused func(*report.Sample) bool
	// started are the engines the injector started (Serve, the restart),
	// closed by Close.
	started []*emulator.Server
}

// New prepares f for a run whose engines are of preset p (the bound of a
// move's latency).
func New(f Fault, p engine.Preset) *Injector {
	return &Injector{f: f, preset: p}
}

// Fault is the fault injected.
func (in *Injector) Fault() Fault { return in.f }

// Engine is the handler engine ec serves through: one that can hang.
// The restart starts a fresh engine of the same config. Each engine of
// the run is given once, in order, then its server to Served.
func (in *Injector) Engine(ec emulator.Config, h http.Handler) http.Handler {
	hung := &atomic.Bool{}
	in.hung = append(in.hung, hung)
	in.configs = append(in.configs, ec)
	return hangable{h: h, hung: hung}
}

// Served notes the server of the engine last given to Engine, named name
// (its backend's name at the router) and serving url.
func (in *Injector) Served(name, url string, srv *http.Server) {
	in.names = append(in.names, name)
	in.servers = append(in.servers, srv)
	in.addrs = append(in.addrs, strings.TrimPrefix(url, "http://"))
}

// Serve starts an engine of config ec on a fresh loopback port, through
// Engine and Served, and returns its base URL; Close stops it.
func (in *Injector) Serve(name string, ec emulator.Config) (string, error) {
	em, err := emulator.New(ec)
	if err != nil {
		return "", err
	}
	srv, addr, err := serve("127.0.0.1:0", in.Engine(ec, em.Handler()))
	if err != nil {
		_ = em.Close()
		return "", err
	}
	in.mu.Lock()
	in.started = append(in.started, em)
	in.mu.Unlock()
	url := "http://" + addr
	in.Served(name, url, srv)
	return url, nil
}

// serve serves h on addr.
func serve(addr string, h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, ln.Addr().String(), nil
}

// Arm starts the fault's clock: the run starts now. r is the router of
// the run.
func (in *Injector) Arm(r Router) {
	in.router = r
	in.res = Result{Kind: in.f.Kind, At: in.f.At}
	in.faulted = map[string]bool{}
	in.done.Add(1)
	in.timer = time.AfterFunc(in.f.At, func() {
		defer in.done.Done()
		switch in.f.Kind {
		case Kill:
			in.mark(0)
			in.mu.Lock()
			_ = in.servers[0].Close()
			in.mu.Unlock()
		case Hang:
			in.mark(0)
			in.hung[0].Store(true)
		case Restart:
			for i := range in.servers {
				d, err := in.restartOne(i)
				if err != nil {
					in.mu.Lock()
					in.res.RestartErr = err.Error()
					in.mu.Unlock()
					return
				}
				in.mu.Lock()
				in.res.Restarts = append(in.res.Restarts, d)
				in.mu.Unlock()
			}
		}
	})
}

func (in *Injector) mark(i int) {
	in.mu.Lock()
	in.faulted[in.names[i]] = true
	in.mu.Unlock()
}

// restartPoll is how often a restart asks whether a drained engine still
// holds a request.
const restartPoll = 5 * time.Millisecond

// restartOne drains engine i, stops it once it holds no request, starts
// it again on its address and undrains it; it returns how long that took.
func (in *Injector) restartOne(i int) (time.Duration, error) {
	start := time.Now()
	name := in.names[i]
	in.mark(i)
	if err := in.router.Drain(name); err != nil {
		return 0, err
	}
	for {
		n, err := in.router.InFlight(name)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		time.Sleep(restartPoll)
	}
	in.mu.Lock()
	_ = in.servers[i].Close()
	in.mu.Unlock()
	up := time.Now()
	em, err := emulator.New(in.configs[i])
	if err != nil {
		return 0, err
	}
	srv, _, err := serve(in.addrs[i], em.Handler())
	if err != nil {
		_ = em.Close()
		return 0, err
	}
	in.mu.Lock()
	in.servers[i] = srv
	in.started = append(in.started, em)
	in.res.Started = max(in.res.Started, time.Since(up))
	in.mu.Unlock()
	if err := in.router.Undrain(name); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// Close cancels a fault still to come and stops the engines' servers and
// the engines the injector started.
func (in *Injector) Close() {
	if in.timer != nil && in.timer.Stop() {
		in.done.Done()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, s := range in.servers {
		_ = s.Close()
	}
	for _, em := range in.started {
		_ = em.Close()
	}
}

// Configure sets what the router of a run needs for the fault in cc: its
// fleet.drain_grace, its upstream.stream_idle_timeout for a hang.
func (f Fault) Configure(cc *config.Config) {
	if f.DrainGrace > 0 {
		cc.Fleet.DrainGrace = f.DrainGrace
	}
	if d := f.StreamIdle(); d > 0 {
		cc.Upstream.StreamIdleTimeout = d
	}
}
