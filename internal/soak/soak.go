// Package soak is `kvroute bench --soak` run on its own fleet: it starts
// emulated engines in this process and a `kvroute serve` child process in
// front of them (with admission on, so that the router's goroutines and
// memory are its own), soaks the router at a multiple of the fleet's
// capacity with bench.Soak, then stops it with SIGTERM and requires a
// clean exit. It supervises; the load, the samples and the verdict are
// bench's.
//
// It must not route nor emulate: it only starts and watches the router
// and engines.
package soak

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
	"github.com/kvroute/kvroute/internal/fault"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// The self-contained soak's setup: two small engines, so that a laptop or
// a CI runner can offer twice their capacity without the load generator
// becoming the bottleneck.
const (
	DefaultEngines  = "2"
	DefaultPreset   = "a100-llama3-8b"
	DefaultWorkload = "chat"
	DefaultLoad     = 2.0
	// MaxWait is the admission queue's max_wait: a request that cannot
	// start within it gets 429, which is what keeps the admitted
	// requests' TTFT bounded at twice the fleet's capacity.
	MaxWait = 2 * time.Second
	// inFlight is the admission limit of requests in flight per backend.
	inFlight = 32
)

// Config is one soak of its own fleet.
type Config struct {
	// Engines is an engine count (with Preset) or a mix such as
	// 2xa100-llama3-8b.
	Engines, Preset string
	// Workload is a built-in workload or a trace; "": DefaultWorkload.
	Workload string
	Seed     int64
	// Load is the offered prompt tokens/s as a multiple of the fleet's
	// prefill capacity; TimeScale the engines' emulated seconds per real
	// second.
	Load, TimeScale float64
	// Duration, Grace, Interval and MaxConcurrency are bench.Soak's.
	Duration, Grace, Interval time.Duration
	MaxConcurrency            int
	// TTFTBound fails the soak when an interval's p99 TTFT exceeds it
	// after warm-up; 0: MaxWait + 3s.
	TTFTBound time.Duration
	// Keep keeps the router's config and log in their temporary
	// directory.
	Keep bool
	// Exe is the kvroute binary run as `serve`; "": this process's.
	Exe string
	// Stdout gets the soak's report, Stderr its progress.
	Stdout, Stderr io.Writer
	// Fault, when not nil, is injected into the run (package fault): the
	// router is given an admin token to drain and undrain engines with,
	// the fault's drain grace and stream idle timeout; its report follows
	// the soak's, and the failures it caused fail the soak (see
	// bench.SoakConfig.Blame).
	Fault *fault.Fault
}

// OwnFleet starts emulated engines in this process and a kvroute serve
// child process (this binary) in front of them, with admission on, so that
// the router's goroutines and memory are its own; it soaks the router at
// --soak-load times the fleet's capacity, then stops it with SIGTERM and
// requires a clean exit.
func OwnFleet(ctx context.Context, s Config) (*bench.SoakResult, error) {
	stdout, stderr := s.Stdout, s.Stderr
	if s.TimeScale <= 0 || s.Load <= 0 {
		return nil, errors.New("--soak-time-scale and --soak-load must be positive")
	}
	presets, err := sim.ParseEngines(s.Engines, s.Preset)
	if err != nil {
		return nil, err
	}
	capacity := sim.Capacity(presets)
	name := s.Workload
	if name == "" {
		name = DefaultWorkload
	}
	// Arrivals in emulated time at the load asked, then replayed
	// timeScale times faster, as kvroute compare does.
	emulated := time.Duration(float64(s.Duration) * s.TimeScale)
	reqs, offered, err := sim.LoadAt(name, workload.Options{Duration: emulated, Seed: s.Seed}, s.Load, capacity)
	if err != nil {
		return nil, err
	}
	workload.ScaleTime(reqs, 1/s.TimeScale)

	dir, err := os.MkdirTemp("", "kvroute-soak-")
	if err != nil {
		return nil, err
	}
	if !s.Keep {
		defer os.RemoveAll(dir)
	}
	ectx, stopEngines := context.WithCancel(ctx)
	defer stopEngines()
	var inj *fault.Injector
	if s.Fault != nil {
		if err := s.Fault.Check(); err != nil {
			return nil, err
		}
		inj = fault.New(*s.Fault, presets[0])
		inj.SetRefused(bench.Refused)
		defer inj.Close()
	}
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "listen: 127.0.0.1:0\npolicy: kvroute\nshutdown_grace: 10s\nlog:\n  level: info\n  access: false\nbackends:\n")
	for i, p := range presets {
		name, ec := fmt.Sprintf("engine-%d", i), emulator.Config{Preset: p, TimeScale: s.TimeScale}
		url, err := startEngine(ectx, inj, name, ec)
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		fmt.Fprintf(&yaml, "  - url: %s\n    name: %s\n", url, name)
	}
	token, err := faultConfig(&yaml, s.Fault)
	if err != nil {
		return nil, err
	}
	// Admission: a backend is saturated with inFlight requests in
	// flight, or with half a second (of the wall clock) of prefill queued
	// on it. The in-flight limit is well below the engines' batch, so
	// that the fleet saturates within seconds instead of after minutes of
	// growing batches, and the soak's steady state is the overloaded one.
	p := presets[0]
	pending := int64(p.PrefillTokensPerSec() * s.TimeScale / 2)
	fmt.Fprintf(&yaml, "admission:\n  max_inflight_per_backend: %d\n  max_pending_prefill_tokens_per_backend: %d\n  max_wait: %v\n  max_queue: 1024\n",
		min(p.MaxNumSeqs, inFlight), pending, MaxWait)
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml.String()), 0o600); err != nil {
		return nil, err
	}
	router, addr, exited, err := startRouter(ctx, s.Exe, cfgPath, filepath.Join(dir, "router.log"))
	if err != nil {
		return nil, err
	}
	defer router.Process.Kill() // after a clean stop below, a no-op

	fmt.Fprintf(stderr, "soak %v: %d emulated engines (%s, time scale %gx), kvroute serve at %s with admission (max_wait %v)\n",
		s.Duration, len(presets), presetNames(presets), s.TimeScale, addr, MaxWait)
	fmt.Fprintf(stderr, "workload %s: %d requests, offered load %.2f of the fleet's prefill capacity\n", name, len(reqs), offered)
	bound := s.TTFTBound
	if bound == 0 {
		bound = MaxWait + 3*time.Second
	}
	sc := bench.SoakConfig{
		Run:       bench.Config{Target: "http://" + addr, Model: p.Model, Requests: reqs, Policy: "soak", MaxConcurrency: s.MaxConcurrency},
		Duration:  s.Duration,
		Grace:     s.Grace,
		Interval:  s.Interval,
		Metrics:   "http://" + addr + "/metrics",
		TTFTBound: bound,
		Out:       stdout,
	}
	if inj != nil {
		fmt.Fprintf(stderr, "fault: %s %v into the run\n", s.Fault.Kind, s.Fault.At)
		sc.Started = func() { inj.Arm(fault.Admin{URL: "http://" + addr, Token: token}) }
		sc.Blame = inj.Blame
	}
	res, err := bench.Soak(ctx, sc)
	if err != nil {
		return nil, err
	}
	if inj != nil {
		r := inj.Result(res.Samples, s.TimeScale)
		fmt.Fprint(stdout, fault.Describe("soak", r))
		if r.RestartErr != "" {
			// The fault was not the one asked for: the verdict above
			// judged another run.
			p := "the rolling restart stopped: " + r.RestartErr
			res.Problems = append(res.Problems, p)
			fmt.Fprintln(stdout, "verdict: FAIL: "+p)
		}
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
		if !s.Keep {
			tail(stderr, filepath.Join(dir, "router.log"), 20)
		}
	}
	return res, nil
}

// startEngine starts an emulated engine of config ec named name, through
// inj when a fault is injected (inj.Close stops it), and returns its URL.
func startEngine(ctx context.Context, inj *fault.Injector, name string, ec emulator.Config) (string, error) {
	if inj != nil {
		return inj.Serve(name, ec)
	}
	em, err := emulator.Start(ctx, ec, "127.0.0.1:0") // stopped with ctx
	if err != nil {
		return "", err
	}
	return em.URL, nil
}

// faultConfig adds to the router's config what fault f needs: an admin
// token (returned) to drain and undrain engines with, its drain grace,
// its stream idle timeout. Nothing without a fault.
func faultConfig(yaml *strings.Builder, f *fault.Fault) (string, error) {
	if f == nil {
		return "", nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	fmt.Fprintf(yaml, "admin:\n  token: %s\n", token)
	if f.DrainGrace > 0 {
		fmt.Fprintf(yaml, "fleet:\n  drain_grace: %v\n", f.DrainGrace)
	}
	if d := f.StreamIdle(); d > 0 {
		fmt.Fprintf(yaml, "upstream:\n  stream_idle_timeout: %v\n", d)
	}
	return token, nil
}

func presetNames(ps []engine.Preset) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

// startRouter runs exe's serve command (this binary's when "") with cfgPath, logging to
// logPath, and returns once it listens, with its address (from its
// "listening" log line), and a channel that receives its exit.
func startRouter(ctx context.Context, exe, cfgPath, logPath string) (*exec.Cmd, string, <-chan error, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, "", nil, fmt.Errorf("find kvroute binary: %w", err)
		}
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
