package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/fault"
	"github.com/kvroute/kvroute/internal/soak"
	"github.com/kvroute/kvroute/internal/workload"
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
	// fault, faultAt and drainGrace are --fault, --fault-at and
	// --drain-grace (compare_faults.go).
	fault               string
	faultAt, drainGrace time.Duration
}

func registerSoak(fs *flag.FlagSet) *soakFlags {
	s := &soakFlags{}
	fs.DurationVar(&s.duration, "soak", 0, "soak for `D`: a long run whose verdict is that nothing is lost or hung and the router's goroutines, memory and admitted TTFT stay flat (see docs/reliability.md); without --target it starts its own emulated engines and a kvroute serve")
	fs.StringVar(&s.engines, "soak-engines", soak.DefaultEngines, "soak without --target: engine count (with --soak-preset) or a mix such as 2xa100-llama3-8b")
	fs.StringVar(&s.preset, "soak-preset", soak.DefaultPreset, "soak without --target: engine preset")
	fs.Float64Var(&s.load, "soak-load", soak.DefaultLoad, "soak without --target: offered prompt tokens/s as a multiple of the fleet's prefill capacity")
	fs.Float64Var(&s.timeScale, "soak-time-scale", 1, "soak without --target: emulated seconds per real second")
	fs.DurationVar(&s.grace, "soak-grace", bench.DefaultSoakGrace, "requests still open this long after the last arrival are cut and counted lost")
	fs.DurationVar(&s.interval, "soak-interval", bench.DefaultSoakInterval, "report the router's goroutines and memory this often")
	fs.DurationVar(&s.ttftBound, "soak-ttft-bound", 0, "fail when an interval's p99 TTFT of completed requests exceeds this after warm-up (default without --target: admission max_wait + 3s; with --target: no check)")
	fs.BoolVar(&s.keep, "soak-keep", false, "soak without --target: keep the router's config and log in a temporary directory")
	declareFault(fs, &s.fault, &s.faultAt, &s.drainGrace, "a soak on its own fleet (--soak without --target; the failures it causes fail the soak)")
	return s
}

// runSoak runs kvroute bench --soak. It returns the process exit code.
func runSoak(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, s *soakFlags, set map[string]bool) int {
	if s.duration <= 0 {
		fmt.Fprintln(stderr, "kvroute bench: --soak must be positive")
		return 2
	}
	injected, err := s.faultOf(f.target)
	if err != nil {
		fmt.Fprintf(stderr, "kvroute bench: %v\n", err)
		return 2
	}
	var res *bench.SoakResult
	if f.target != "" {
		res, err = soakTarget(ctx, stdout, stderr, f, s, set)
	} else {
		res, err = soak.OwnFleet(ctx, soak.Config{Engines: s.engines, Preset: s.preset, Workload: f.workload, Seed: f.seed,
			Load: s.load, TimeScale: s.timeScale, Duration: s.duration, Grace: s.grace, Interval: s.interval,
			MaxConcurrency: f.maxConc, TTFTBound: s.ttftBound, Keep: s.keep, Stdout: stdout, Stderr: stderr, Fault: injected})
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

// errFaultTarget refuses a fault with --target.
var errFaultTarget = errors.New("--fault goes with a soak on its own fleet (--soak without --target): the engines behind --target are not kvroute bench's to kill, hang or restart; drain one through the router's admin API (POST /admin/backends/{name}/drain, then /undrain) while the soak runs")

// faultOf is the fault the soak's flags ask for, nil for none; with a
// target, none may be asked for.
func (s *soakFlags) faultOf(target string) (*fault.Fault, error) {
	f, err := parseFault(s.fault, s.faultAt, s.drainGrace)
	if err == nil && f != nil && target != "" {
		return nil, errFaultTarget
	}
	return f, err
}

// soakTarget soaks a running router: the workload and rate are the
// user's, as for any bench run.
func soakTarget(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, s *soakFlags, set map[string]bool) (*bench.SoakResult, error) {
	if f.workload == "" {
		f.workload = soak.DefaultWorkload
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
