package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// The self-contained soak's setup: two small engines, so that a laptop or
// a CI runner can offer twice their capacity without the load generator
// becoming the bottleneck.
const (
	soakEngines  = "2"
	soakPreset   = "a100-llama3-8b"
	soakWorkload = "chat"
	soakLoad     = 2.0
	// soakMaxWait is the admission queue's max_wait: a request that cannot
	// start within it gets 429, which is what keeps the admitted
	// requests' TTFT bounded at twice the fleet's capacity.
	soakMaxWait = 2 * time.Second
	// soakInFlight is the admission limit of requests in flight per
	// backend.
	soakInFlight = 32
)

// soakFlags are kvroute bench's soak flags.
type soakFlags struct {
	duration  time.Duration
	engines   string
	preset    string
	load      float64
	timeScale float64
	grace     time.Duration
	interval  time.Duration
	ttftBound time.Duration
	keep      bool
}

func registerSoak(fs *flag.FlagSet) *soakFlags {
	s := &soakFlags{}
	fs.DurationVar(&s.duration, "soak", 0, "soak for `D`: a long run whose verdict is that nothing is lost or hung and the router's goroutines, memory and admitted TTFT stay flat (see docs/reliability.md); without --target it starts its own emulated engines and a kvroute serve")
	fs.StringVar(&s.engines, "soak-engines", soakEngines, "soak without --target: engine count (with --soak-preset) or a mix such as 2xa100-llama3-8b")
	fs.StringVar(&s.preset, "soak-preset", soakPreset, "soak without --target: engine preset")
	fs.Float64Var(&s.load, "soak-load", soakLoad, "soak without --target: offered prompt tokens/s as a multiple of the fleet's prefill capacity")
	fs.Float64Var(&s.timeScale, "soak-time-scale", 1, "soak without --target: emulated seconds per real second")
	fs.DurationVar(&s.grace, "soak-grace", bench.DefaultSoakGrace, "requests still open this long after the last arrival are cut and counted lost")
	fs.DurationVar(&s.interval, "soak-interval", bench.DefaultSoakInterval, "report the router's goroutines and memory this often")
	fs.DurationVar(&s.ttftBound, "soak-ttft-bound", 0, "fail when an interval's p99 TTFT of completed requests exceeds this after warm-up (default without --target: admission max_wait + 3s; with --target: no check)")
	fs.BoolVar(&s.keep, "soak-keep", false, "soak without --target: keep the router's config and log in a temporary directory")
	return s
}

// runSoak runs kvroute bench --soak. It returns the process exit code.
func runSoak(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, s *soakFlags, set map[string]bool) int {
	if s.duration <= 0 {
		fmt.Fprintln(stderr, "kvroute bench: --soak must be positive")
		return 2
	}
	var res *bench.SoakResult
	var err error
	if f.target != "" {
		res, err = soakTarget(ctx, stdout, stderr, f, s, set)
	} else {
		res, err = soakOwnFleet(ctx, stdout, stderr, f, s)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvroute bench: soak: %v\n", err)
		return 1
	}
	if len(res.Problems) > 0 {
		return 1
	}
	return 0
}

// soakTarget soaks a running router: the workload and rate are the
// user's, as for any bench run.
func soakTarget(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, s *soakFlags, set map[string]bool) (*bench.SoakResult, error) {
	if f.workload == "" {
		f.workload = soakWorkload
	}
	f.duration = s.duration
	set["duration"] = true
	opt, err := f.check(nil, set)
	if err != nil {
		return nil, err
	}
	reqs, err := workload.Load(f.workload, opt)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "soak %v against %s: %d requests\n", s.duration, f.target, len(reqs))
	return bench.Soak(ctx, bench.SoakConfig{
		Run:       bench.Config{Target: f.target, Model: f.model, Requests: reqs, Policy: f.label, MaxConcurrency: f.maxConc},
		Duration:  s.duration,
		Grace:     s.grace,
		Interval:  s.interval,
		Metrics:   strings.TrimSuffix(strings.TrimSuffix(f.target, "/"), "/v1") + "/metrics",
		TTFTBound: s.ttftBound,
		Out:       stdout,
	})
}

// soakOwnFleet starts emulated engines in this process and a kvroute serve
// child process (this binary) in front of them, with admission on, so that
// the router's goroutines and memory are its own; it soaks the router at
// --soak-load times the fleet's capacity, then stops it with SIGTERM and
// requires a clean exit.
func soakOwnFleet(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, s *soakFlags) (*bench.SoakResult, error) {
	if s.timeScale <= 0 || s.load <= 0 {
		return nil, errors.New("--soak-time-scale and --soak-load must be positive")
	}
	presets, err := sim.ParseEngines(s.engines, s.preset)
	if err != nil {
		return nil, err
	}
	capacity := sim.Capacity(presets)
	name := f.workload
	if name == "" {
		name = soakWorkload
	}
	// Arrivals in emulated time at the load asked, then replayed
	// timeScale times faster, as kvroute compare does.
	emulated := time.Duration(float64(s.duration) * s.timeScale)
	reqs, offered, err := sim.LoadAt(name, workload.Options{Duration: emulated, Seed: f.seed}, s.load, capacity)
	if err != nil {
		return nil, err
	}
	workload.ScaleTime(reqs, 1/s.timeScale)

	dir, err := os.MkdirTemp("", "kvroute-soak-")
	if err != nil {
		return nil, err
	}
	if !s.keep {
		defer os.RemoveAll(dir)
	}
	ectx, stopEngines := context.WithCancel(ctx)
	defer stopEngines()
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "listen: 127.0.0.1:0\npolicy: kvroute\nshutdown_grace: 10s\nlog:\n  level: info\n  access: false\nbackends:\n")
	for i, p := range presets {
		em, err := emulator.Start(ectx, emulator.Config{Preset: p, TimeScale: s.timeScale}, "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		defer em.Close()
		fmt.Fprintf(&yaml, "  - url: %s\n    name: engine-%d\n", em.URL, i)
	}
	// Admission: a backend is saturated with soakInFlight requests in
	// flight, or with half a second (of the wall clock) of prefill queued
	// on it. The in-flight limit is well below the engines' batch, so
	// that the fleet saturates within seconds instead of after minutes of
	// growing batches, and the soak's steady state is the overloaded one.
	p := presets[0]
	pending := int64(p.PrefillTokensPerSec() * s.timeScale / 2)
	fmt.Fprintf(&yaml, "admission:\n  max_inflight_per_backend: %d\n  max_pending_prefill_tokens_per_backend: %d\n  max_wait: %v\n  max_queue: 1024\n",
		min(p.MaxNumSeqs, soakInFlight), pending, soakMaxWait)
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml.String()), 0o600); err != nil {
		return nil, err
	}
	router, addr, exited, err := startRouter(ctx, cfgPath, filepath.Join(dir, "router.log"))
	if err != nil {
		return nil, err
	}
	defer router.Process.Kill() // after a clean stop below, a no-op

	fmt.Fprintf(stderr, "soak %v: %d emulated engines (%s, time scale %gx), kvroute serve at %s with admission (max_wait %v)\n",
		s.duration, len(presets), presetNames(presets), s.timeScale, addr, soakMaxWait)
	fmt.Fprintf(stderr, "workload %s: %d requests, offered load %.2f of the fleet's prefill capacity\n", name, len(reqs), offered)
	bound := s.ttftBound
	if bound == 0 {
		bound = soakMaxWait + 3*time.Second
	}
	res, err := bench.Soak(ctx, bench.SoakConfig{
		Run:       bench.Config{Target: "http://" + addr, Model: p.Model, Requests: reqs, Policy: "soak", MaxConcurrency: f.maxConc},
		Duration:  s.duration,
		Grace:     s.grace,
		Interval:  s.interval,
		Metrics:   "http://" + addr + "/metrics",
		TTFTBound: bound,
		Out:       stdout,
	})
	if err != nil {
		return nil, err
	}
	// The router must stop cleanly on SIGTERM once idle.
	_ = router.Process.Signal(syscall.SIGTERM)
	select {
	case werr := <-exited:
		if werr != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("kvroute serve did not exit cleanly on SIGTERM: %v", werr))
		} else {
			fmt.Fprintln(stdout, "kvroute serve exited 0 on SIGTERM")
		}
	case <-time.After(15 * time.Second):
		res.Problems = append(res.Problems, "kvroute serve still running 15s after SIGTERM")
	}
	if len(res.Problems) > 0 {
		fmt.Fprintf(stderr, "router log: %s\n", filepath.Join(dir, "router.log"))
		if !s.keep {
			tail(stderr, filepath.Join(dir, "router.log"), 20)
		}
	}
	return res, nil
}

func presetNames(ps []engine.Preset) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

// startRouter runs this binary's serve command with cfgPath, logging to
// logPath, and returns once it listens, with its address (from its
// "listening" log line), and a channel that receives its exit.
func startRouter(ctx context.Context, cfgPath, logPath string) (*exec.Cmd, string, <-chan error, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", nil, fmt.Errorf("find kvroute binary: %w", err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "serve", "--config", cfgPath)
	pr, pw := io.Pipe()
	cmd.Stderr, cmd.Stdout = pw, logf
	if err := cmd.Start(); err != nil {
		return nil, "", nil, fmt.Errorf("start kvroute serve: %w", err)
	}
	addrc := make(chan string, 1)
	go func() {
		defer logf.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if strings.Contains(line, "msg=listening") {
				for _, field := range strings.Fields(line) {
					if a, ok := strings.CutPrefix(field, "addr="); ok {
						select {
						case addrc <- a:
						default:
						}
					}
				}
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { err := cmd.Wait(); _ = pw.Close(); exited <- err }()
	select {
	case a := <-addrc:
		return cmd, a, exited, nil
	case err := <-exited:
		return nil, "", nil, fmt.Errorf("kvroute serve exited before listening (%v); see %s", err, logPath)
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		return nil, "", nil, fmt.Errorf("kvroute serve did not listen within 15s; see %s", logPath)
	}
}

// tail copies the last n lines of path to w.
func tail(w io.Writer, path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}
