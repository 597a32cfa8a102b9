package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

func init() {
	commands["bench"] = command{"replay a workload open-loop against an OpenAI-compatible endpoint and report latencies", runBench}
}

// benchFlags are the flags of kvroute bench.
type benchFlags struct {
	target, workload, model, label string
	rate, speedup                  float64
	duration                       time.Duration
	window                         string
	limit, maxConc                 int
	seed                           int64
	out, json                      string
	adapters                       int
	adapterZipf                    float64
}

func runBench(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var f benchFlags
	fs.StringVar(&f.target, "target", "", "base URL of the OpenAI-compatible server or kvroute router, e.g. http://127.0.0.1:8080 (required)")
	fs.StringVar(&f.workload, "workload", "", "a built-in workload name (below) or the path of a Mooncake-format JSONL trace (required)")
	fs.Float64Var(&f.rate, "rate", 0, "arrival rate in requests/s of a built-in workload (Poisson; default 10)")
	fs.Float64Var(&f.speedup, "speedup", 0, "divide a trace's timestamps by `X` (2 replays it twice as fast; default 1)")
	fs.DurationVar(&f.duration, "duration", 0, "built-in workload: arrivals span this long (default 60s unless --limit); trace: replay only requests arriving within this time")
	fs.StringVar(&f.window, "window", "", "trace only: keep requests with trace timestamps in `START-END` (Go durations, e.g. 10m-20m or 30m-), re-based to start at 0")
	fs.IntVar(&f.limit, "limit", 0, "send at most `N` requests (the first N by arrival)")
	fs.Int64Var(&f.seed, "seed", 1, "seed of a built-in workload's arrivals and text")
	fs.StringVar(&f.model, "model", "", "model name sent in each request (default: the first model of GET /v1/models)")
	fs.IntVar(&f.adapters, "adapters", 0, "have each conversation ask for one of N LoRA adapters (lora-0 ... lora-N-1) in place of the model")
	fs.Float64Var(&f.adapterZipf, "adapter-zipf", 0, "Zipf exponent of the adapters' popularity (default 1)")
	fs.StringVar(&f.label, "label", "bench", "name of this run in the table and the JSON (the policy column)")
	fs.IntVar(&f.maxConc, "max-concurrency", bench.DefaultMaxConcurrency, "safety cap on requests in flight; a request arriving at the cap is not sent and counts as an error")
	fs.StringVar(&f.out, "out", "", "write ttft.svg (TTFT distribution) into `DIR`")
	fs.StringVar(&f.json, "json", "", "write the results as {\"runs\":[...]} JSON to `FILE`")
	soak := registerSoak(fs)
	fs.Usage = func() {
		o := fs.Output()
		fmt.Fprintln(o, "usage: kvroute bench --target URL --workload NAME|FILE [--rate R | --speedup X] [--duration D] [--limit N] [--seed S] [--model M] [--adapters N [--adapter-zipf S]] [--out DIR] [--json FILE]")
		fmt.Fprintln(o, "       kvroute bench --soak D [--soak-engines N --soak-preset NAME --soak-load X] [--fault kill|hang|restart --fault-at D [--drain-grace D]]")
		fmt.Fprintln(o, "       kvroute bench --soak D --target URL [--workload NAME|FILE ...]")
		fmt.Fprintln(o, "\nReplays a workload open-loop: every request starts at its arrival time, whatever the latency of earlier ones. Records time to first token, inter-token latency, end-to-end latency and the cached prompt tokens the server reports, and prints a table.\n\nflags:")
		printDefaults(fs)
		writeBuiltins(o)
	}
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if !set["soak"] && (set["fault"] || set["fault-at"] || set["drain-grace"]) {
		fmt.Fprintf(os.Stderr, "kvroute bench: %v\n", errFaultTarget)
		return 2
	}
	if set["soak"] {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		return runSoak(ctx, os.Stdout, os.Stderr, &f, soak, set)
	}
	opt, err := f.check(fs.Args(), set)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvroute bench: %v\nRun 'kvroute bench -h' for the flags.\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := benchMain(ctx, os.Stdout, os.Stderr, &f, opt); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute bench: %v\n", err)
		return 1
	}
	return 0
}

func isBuiltin(name string) bool {
	for _, b := range workload.Builtins() {
		if b[0] == name {
			return true
		}
	}
	return false
}

// check validates the flags and turns them into workload options.
func (f *benchFlags) check(rest []string, set map[string]bool) (workload.Options, error) {
	var opt workload.Options
	switch {
	case len(rest) > 0:
		return opt, fmt.Errorf("unexpected argument %q", rest[0])
	case f.target == "":
		return opt, errors.New("--target is required")
	case !strings.HasPrefix(f.target, "http://") && !strings.HasPrefix(f.target, "https://"):
		return opt, fmt.Errorf("--target %q must be an http:// or https:// URL", f.target)
	case f.workload == "":
		return opt, errors.New("--workload is required (a built-in name or a trace file)")
	case set["rate"] && set["speedup"]:
		return opt, errors.New("--rate and --speedup are exclusive: --rate paces a built-in workload, --speedup a trace")
	case set["rate"] && f.rate <= 0:
		return opt, fmt.Errorf("--rate %v must be positive", f.rate)
	case set["speedup"] && f.speedup <= 0:
		return opt, fmt.Errorf("--speedup %v must be positive", f.speedup)
	case f.duration < 0:
		return opt, fmt.Errorf("--duration %v must not be negative", f.duration)
	case f.limit < 0:
		return opt, fmt.Errorf("--limit %d must not be negative", f.limit)
	case f.maxConc < 1:
		return opt, fmt.Errorf("--max-concurrency %d must be at least 1", f.maxConc)
	}
	builtin := isBuiltin(f.workload)
	if builtin {
		if set["speedup"] || set["window"] {
			return opt, fmt.Errorf("--speedup and --window apply to traces; %q is a built-in workload (use --rate and --duration)", f.workload)
		}
		opt.Duration = f.duration
	} else {
		if set["rate"] {
			return opt, fmt.Errorf("--rate applies to built-in workloads; %q is a trace (use --speedup)", f.workload)
		}
		if _, err := os.Stat(f.workload); err != nil {
			names := make([]string, 0, 4)
			for _, b := range workload.Builtins() {
				names = append(names, b[0])
			}
			return opt, fmt.Errorf("--workload %q is neither a built-in (%s) nor a readable trace file: %w", f.workload, strings.Join(names, ", "), err)
		}
		if f.window != "" {
			lo, hi, err := parseWindow(f.window)
			if err != nil {
				return opt, err
			}
			opt.WindowStart, opt.WindowEnd = lo, hi
		}
	}
	opt.Rate, opt.Speedup, opt.Limit, opt.Seed = f.rate, f.speedup, f.limit, f.seed
	opt.Adapters, opt.AdapterZipf = f.adapters, f.adapterZipf
	return opt, nil
}

// parseWindow parses START-END (END may be empty: to the end of the trace).
func parseWindow(s string) (time.Duration, time.Duration, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("--window %q: want START-END, e.g. 10m-20m or 30m-", s)
	}
	lo, err := time.ParseDuration(a)
	if err != nil {
		return 0, 0, fmt.Errorf("--window %q: start: %w", s, err)
	}
	var hi time.Duration
	if b != "" {
		if hi, err = time.ParseDuration(b); err != nil {
			return 0, 0, fmt.Errorf("--window %q: end: %w", s, err)
		}
		if hi <= lo {
			return 0, 0, fmt.Errorf("--window %q: end must be after start", s)
		}
	}
	if lo < 0 {
		return 0, 0, fmt.Errorf("--window %q: start must not be negative", s)
	}
	return lo, hi, nil
}

// benchMain loads the workload, runs it, and writes the table, JSON and chart.
func benchMain(ctx context.Context, stdout, stderr io.Writer, f *benchFlags, opt workload.Options) error {
	reqs, err := workload.Load(f.workload, opt)
	if err != nil {
		return err
	}
	var duration time.Duration
	if !isBuiltin(f.workload) {
		duration = f.duration
	}
	if len(reqs) > 0 {
		fmt.Fprintf(stderr, "%s: %d requests over %v, %.0f prompt tokens/s offered\n",
			f.workload, len(reqs), reqs[len(reqs)-1].At.Round(time.Millisecond), workload.PromptTokensPerSec(reqs))
	}
	run, runErr := bench.Run(ctx, bench.Config{
		Target:         f.target,
		Model:          f.model,
		Requests:       reqs,
		Policy:         f.label,
		Duration:       duration,
		Progress:       bench.StderrProgress(),
		MaxConcurrency: f.maxConc,
	})
	if runErr != nil && run.Completed+run.Errors == 0 {
		return runErr
	}
	rep := &report.Report{Runs: []report.Run{run}}
	report.WriteTable(stdout, rep)
	if n := run.Errors; n > 0 {
		fmt.Fprintf(stderr, "%d requests failed; first error: %s\n", n, firstError(run.Samples))
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		if err := writeOutputFile(filepath.Join(f.out, "ttft.svg"), func(w io.Writer) error {
			return report.WriteTTFTChart(w, rep.Runs)
		}); err != nil {
			return err
		}
	}
	if f.json != "" {
		if err := writeReportJSON(f.json, rep); err != nil {
			return err
		}
	}
	return runErr
}

func firstError(samples []report.Sample) string {
	for _, s := range samples {
		if s.Err != "" {
			return s.Err
		}
	}
	return ""
}
