// Package compare runs kvroute's live side-by-side benchmark in process:
// for each policy, a fresh set of emulated engines (package emulator) and
// one router (package proxy) on loopback, or with Replicas several router
// replicas sharing state through an in-process NATS server, and the load
// generator (package bench) replaying the same workload against the router
// (spread over the replicas at random). The results come
// back as one report.Report, in emulated time.
//
// It owns the wiring and the lifetime of those servers and the conversion
// between wall-clock and emulated time; it must not contain any routing,
// engine or measurement logic of its own.
package compare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fault"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/server"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// Config describes a comparison.
type Config struct {
	// Engines has one preset per emulated engine.
	Engines []engine.Preset
	// KVBlocks > 0 overrides every engine's KV cache capacity.
	KVBlocks int
	// ConfigureLimits gives the router each engine's running-sequence cap
	// and token budget per step as backends[].max_num_seqs and
	// max_num_batched_tokens; without it the router learns the cap from
	// the engines' metrics, as it must from vLLM, which exports neither.
	ConfigureLimits bool
	// TimeScale is emulated seconds per wall-clock second (see
	// emulator.Config); 0 means 1. The workload's arrival times are in
	// emulated time and are replayed TimeScale times faster, so the load
	// the engines see is the load the workload offers.
	TimeScale float64
	// Policies are run one after the other, each on fresh engines.
	Policies []string
	// KVEvents runs each policy a second time (named POLICY+precise) with
	// the engines publishing their KV cache events over ZMQ on loopback
	// and the router subscribing and tokenizing on their /tokenize.
	KVEvents bool
	// NoResponseRouting routes a request with previous_response_id as any
	// request (session.max_responses -1): what a balancer that does not
	// learn response ids does, the baseline of the Responses API.
	NoResponseRouting bool
	// Seed seeds the policies' random choices (and, with Replicas, which
	// replica each request enters).
	Seed int64
	// Replicas > 1 adds, for each policy, a run with that many router
	// replicas sharing state through an in-process NATS server, the
	// client's requests spread over them at random (replicas.go).
	Replicas int
	// KillReplicaAt > 0 kills the last replica of the replica run that
	// long (wall clock) after the run starts, as a crash would (see
	// server.Server.Kill); the client then sends the requests it refuses
	// to the next replica (see bench.Config.Spread), and Killed hears
	// what happened.
	KillReplicaAt time.Duration
	Killed        func(run string, k Kill)
	// PeerTimeout, when positive, overrides the replicas' sync.peer_timeout.
	PeerTimeout time.Duration
	// Fault, when set, is injected into every policy's run (an engine
	// killed or hung, a rolling restart: package fault), and Faulted hears
	// how the run took it.
	Fault   *Fault
	Faulted func(run string, r FaultResult)
	// Roles, when it names a prefill engine, adds for each policy a run
	// on a disaggregated fleet (named POLICY+xPyD, sim.FleetVariants):
	// engine i started with role Roles[i] (kvroute engine --role) and
	// configured so (backends[].role), the router splitting requests over
	// a prefill and a decode engine with the vLLM protocol. Pair policies
	// (policy.PairDecider) run on that fleet only.
	Roles []string
	// OfferedLoad is copied into every run (see sim.Offered).
	OfferedLoad float64
	// Progress, when not nil, receives the load generator's progress bar
	// (see bench.StderrProgress) and one line per policy.
	Progress *bench.Progress
	// Logger receives the servers' logs; nil discards them.
	Logger *slog.Logger
	// Driver, when not nil, receives each engine's driver statistics at
	// the end of each policy's run: how well the emulated clock kept up
	// with the real one. A live run on a machine too busy to keep up
	// measures the machine, not the routing.
	Driver func(policy string, engine int, st emulator.DriverStats)
}

// Run replays reqs (arrival times in emulated time) once per policy and
// returns the runs in policy order. Latencies, throughputs and durations in
// the result are in emulated time: a wall-clock measurement times
// TimeScale.
func Run(ctx context.Context, reqs []workload.Request, cfg Config) (*report.Report, error) {
	if len(cfg.Engines) == 0 {
		return nil, errors.New("compare: no engines")
	}
	if len(cfg.Policies) == 0 {
		return nil, errors.New("compare: no policies")
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("compare: time scale %g is negative", cfg.TimeScale)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// The wall-clock schedule: the same requests, TimeScale times faster.
	wall := make([]workload.Request, len(reqs))
	copy(wall, reqs)
	workload.ScaleTime(wall, 1/cfg.TimeScale)

	rep := &report.Report{}
	for _, p := range cfg.Policies {
		for _, fl := range fleetsOf(cfg.Roles) {
			if !fl.Runs(p) {
				continue
			}
			for _, precise := range []bool{false, true}[:1+btoi(cfg.KVEvents)] {
				for _, n := range replicaCounts(cfg.Replicas) {
					run, err := runOne(ctx, wall, cfg, p, precise, n, fl)
					if err != nil {
						return nil, fmt.Errorf("compare: %s: %w", runLabel(p, precise, n)+fl.Suffix, err)
					}
					run.OfferedLoad = cfg.OfferedLoad
					rep.Runs = append(rep.Runs, run)
					if cfg.Progress != nil {
						fmt.Fprintf(cfg.Progress.W, "%s: %d completed, %d errors, mean TTFT %.1f ms, hit rate %.1f%%\n",
							run.Policy, run.Completed, run.Errors, run.TTFT.Mean, 100*run.PrefixHitRate)
					}
				}
			}
		}
	}
	return rep, nil
}

// RunName is the name of policy p's run, precise or not.
func RunName(p string, precise bool) string {
	if precise {
		return p + "+precise"
	}
	return p
}

// runLabel names a run: RunName, and " xN" for N router replicas.
func runLabel(p string, precise bool, replicas int) string {
	if replicas > 1 {
		return fmt.Sprintf("%s x%d", RunName(p, precise), replicas)
	}
	return RunName(p, precise)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runOne starts fresh engines and a router with policy p, replays wall
// (arrival times on the wall clock) through the router, stops everything
// and returns the run in emulated time. precise has the engines publish
// their KV events to the router; replicas above 1 start that many router
// replicas sharing state through a NATS server.
func runOne(ctx context.Context, wall []workload.Request, cfg Config, p string, precise bool, replicas int, fl sim.Variant) (report.Run, error) {
	var stack servers
	defer stack.close()

	cc := config.Default()
	cc.Listen = "127.0.0.1:0"
	cc.Policy = p
	cc.PolicyOptions.Seed = cfg.Seed
	cc.Upstream.DiscoverModels = false
	if cfg.NoResponseRouting {
		cc.Session.MaxResponses = -1
	}
	// The workload's LoRA adapters, served by every engine that has slots
	// for them; the router learns them from the engines' /v1/models.
	loras := loraModules(wall)
	kv := make([]int, len(cfg.Engines))
	engineOf := map[string]int{} // backend name -> engine index
	ems := make([]*emulator.Server, len(cfg.Engines))
	var inj *fault.Injector
	if cfg.Fault != nil {
		cfg.Fault.Configure(cc)
		inj = fault.New(*cfg.Fault, cfg.Engines[0])
	}
	for i, pr := range cfg.Engines {
		ec := emulator.Config{Preset: pr, KVBlocks: cfg.KVBlocks, TimeScale: cfg.TimeScale, Logger: cfg.Logger, Role: roleOf(fl, i)}
		if pr.MaxLoras > 0 && len(loras) > 0 {
			ec.LoRAModules = loras
			cc.Upstream.DiscoverModels = true
		}
		if precise {
			ec.KVEvents = &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true}
		}
		em, err := emulator.New(ec)
		if err != nil {
			return report.Run{}, fmt.Errorf("engine %d: %w", i, err)
		}
		ems[i] = em
		stack.closers = append(stack.closers, em.Close)
		h := http.Handler(em.Handler())
		if inj != nil {
			h = inj.Engine(ec, h)
		}
		url, err := stack.serve(h)
		if err != nil {
			return report.Run{}, fmt.Errorf("engine %d: %w", i, err)
		}
		kv[i] = em.Preset().KVBlocks
		name := fmt.Sprintf("engine-%d", i)
		engineOf[name] = i
		if inj != nil {
			inj.Served(name, url, stack.last)
		}
		be := backendOf(cfg, pr, url, name, roleOf(fl, i))
		if be.Role == config.RoleDecode {
			// The conditional split weighs the transfer the decode
			// engines wait, in the router's (wall-clock) time, as the
			// simulator weighs the decode engine's preset's.
			wallClock := func(d time.Duration) time.Duration { return time.Duration(float64(d) / cfg.TimeScale) }
			cc.Disaggregation.KVTransferLatency = wallClock(pr.KVTransferLatency)
			cc.Disaggregation.KVTransferTimePerToken = wallClock(pr.KVTransferPerToken)
		}
		if precise {
			be.KVEvents = "tcp://" + em.KVEventsAddr().String()
		}
		cc.Backends = append(cc.Backends, be)
	}
	var (
		targets []string
		routers []*server.Server
	)
	if replicas > 1 {
		url, err := stack.nats()
		if err != nil {
			return report.Run{}, err
		}
		cc.Sync.URL = url
		if cfg.PeerTimeout > 0 {
			cc.Sync.PeerTimeout = cfg.PeerTimeout
		}
	}
	for r := range max(replicas, 1) {
		c := *cc
		if replicas > 1 {
			c.Sync.ReplicaID = fmt.Sprintf("replica-%d", r)
		}
		rt, err := startRouter(&stack, &c, cfg.Logger, engineOf, kv)
		if err != nil {
			return report.Run{}, err
		}
		routers = append(routers, rt)
		targets = append(targets, "http://"+rt.Addr())
	}
	label := runLabel(p, precise, replicas) + fl.Suffix
	var kill *killer
	if replicas > 1 && cfg.KillReplicaAt > 0 {
		label += " kill"
		kill = &killer{at: cfg.KillReplicaAt, routers: routers, sync: cc.Sync}
		kill.arm()
	}

	if inj != nil {
		label += " " + cfg.Fault.Kind
		defer inj.Close()
		inj.Arm(fault.Local{Fleet: routers[0].Fleet(), Metrics: routers[0].Metrics().Registry()})
	}
	samples, elapsed, err := bench.Drive(ctx, bench.Config{
		Target:     targets[0],
		Spread:     targets[1:],
		SpreadSeed: cfg.Seed,
		Model:      cfg.Engines[0].Model,
		Requests:   wall,
		Policy:     label,
		Progress:   cfg.Progress,
	})
	if kill != nil {
		k := kill.result(samples, label, cfg.TimeScale)
		if err == nil && cfg.Killed != nil {
			cfg.Killed(label, k)
		}
	}
	if inj != nil {
		r := inj.Result(samples, cfg.TimeScale)
		if err == nil && cfg.Faulted != nil {
			cfg.Faulted(label, r)
		}
	}
	if err != nil {
		return report.Run{}, err
	}
	if cfg.Driver != nil {
		for i, em := range ems {
			cfg.Driver(label, i, em.Driver())
		}
	}
	run := report.Summarize(label, toEmulated(samples, cfg.TimeScale), scale(elapsed, cfg.TimeScale))
	var loads int64
	for _, em := range ems {
		loads += em.Stats().LoRALoads
	}
	if run.Completed > 0 {
		run.AdapterLoads = 1000 * float64(loads) / float64(run.Completed)
	}
	return run, nil
}

// backendOf is engine pr's entry in the router's config, served at url
// under name with role: its limits when ConfigureLimits says so, and its
// CPU tier (backends[].cpu_kv_blocks), which the approximate index models
// as the engine's offload, as the simulator's router is told it
// (sim.Config.TierBlindIndex off). Its load time per token is not given:
// the router learns it from the engine's offload counters, as from vLLM's.
func backendOf(cfg Config, pr engine.Preset, url, name, role string) config.Backend {
	be := config.Backend{URL: url, Name: name, Role: role, CPUKVBlocks: pr.CPUBlocks}
	if cfg.ConfigureLimits {
		be.MaxNumSeqs, be.MaxNumBatchedTokens = pr.MaxNumSeqs, pr.MaxBatchedTokens
	}
	return be
}

// loraModules lists the adapters reqs ask for, in order of first use, as
// the emulated engines serve them.
func loraModules(reqs []workload.Request) []emulator.LoRAModule {
	var mods []emulator.LoRAModule
	seen := map[string]bool{}
	for i := range reqs {
		if a := reqs[i].Adapter; a != "" && !seen[a] {
			seen[a] = true
			mods = append(mods, emulator.LoRAModule{Name: a, Path: "/adapters/" + a})
		}
	}
	return mods
}

// startRouter validates c, starts a router with it and sizes its prefix
// index from the engines' KV caches.
func startRouter(stack *servers, c *config.Config, logger *slog.Logger, engineOf map[string]int, kv []int) (*server.Server, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	rt, err := server.New(c, logger)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	// The router's prefix index holds as much as each engine's KV cache,
	// exactly as the simulator sets it, from the start (the engine
	// monitor would learn the same from the engines' metrics within its
	// first scrape).
	for _, b := range rt.Fleet().Snapshot().All {
		// By name: a backend's ID is the fleet's, not its place in the
		// config's list.
		i, ok := engineOf[b.Name]
		if !ok {
			return nil, fmt.Errorf("router: backend %q is none of the engines", b.Name)
		}
		rt.Scheduler().SetKVCapacity(b.ID, int64(kv[i])*engine.BlockSize)
	}
	if err := rt.Start(); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	stack.closers = append(stack.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return rt.Shutdown(ctx)
	})
	return rt, nil
}

// toEmulated converts wall-clock samples to emulated time in place.
func toEmulated(samples []report.Sample, timeScale float64) []report.Sample {
	for i := range samples {
		s := &samples[i]
		s.Start = scale(s.Start, timeScale)
		s.TTFT = scale(s.TTFT, timeScale)
		s.E2E = scale(s.E2E, timeScale)
		for j := range s.ITL {
			s.ITL[j] = scale(s.ITL[j], timeScale)
		}
	}
	return samples
}

func scale(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * f)
}

// servers are the loopback servers of one run, closed in reverse order.
type servers struct {
	closers []func() error
	// last is the server serve started last (a fault stops an
	// engine's).
	last *http.Server
}

// serve serves h on a fresh loopback port and returns its base URL.
func (s *servers) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.last = srv
	s.closers = append(s.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return srv.Close()
		}
		return nil
	})
	return "http://" + ln.Addr().String(), nil
}

func (s *servers) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		_ = s.closers[i]()
	}
	s.closers = nil
}
