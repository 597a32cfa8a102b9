package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
)

func init() {
	commands["demo"] = command{"a one-minute live comparison of round-robin, least-request and kvroute on multi-turn conversations", runDemo}
}

// The demo's setup: the conversation whose next turn must land where its
// KV cache is. chat-docs conversations each open on a long text of their own
// (2-8k tokens) followed by short questions, so most of every later prompt
// is history that only the engine of the previous turn holds. Each engine's
// KV cache is cut to demoKVBlocks (262,144 tokens, 58% of the preset's
// 450,896, as on a GPU that also holds a bigger model or serves longer
// contexts): mid-run some 220-250 conversations are open, whose contexts
// add up to about 1.1-1.2M tokens, more than the 1.05M the four engines
// hold together. A fleet that keeps each conversation on one engine
// holds most of them once; one that spreads a conversation's turns over all
// four would need four copies of each, and evicts. The offered load is the
// fleet's whole prefill capacity counted as if nothing were cached: where
// the cache decides whether the fleet keeps up. Answers are short, so the
// live path (engines, router and client on one machine) keeps up at a time
// scale of 4: 64s of emulated traffic replay in 16s of wall clock per
// policy, under a minute for the three.
const (
	demoEngines   = "4"
	demoPreset    = "h100-llama3-8b"
	demoWorkload  = "chat-docs"
	demoLoad      = 1.0
	demoKVBlocks  = 16384
	demoTimeScale = 4
	demoSpan      = 64 * time.Second
	demoPolicies  = "round-robin,least-request,kvroute"
)

// demoOptions are what a demo run may change: its flags, and its span
// (fixed for the command, shortened by tests).
type demoOptions struct {
	timeScale float64
	seed      int64
	out       string
	span      time.Duration
}

func runDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	o := demoOptions{span: demoSpan}
	fs.Float64Var(&o.timeScale, "time-scale", demoTimeScale, "emulated seconds per real second; lower it if the report warns that the engines fell behind the real clock (the run takes longer)")
	fs.Int64Var(&o.seed, "seed", 1, "seed of the workload and of the policies' random choices")
	fs.StringVar(&o.out, "out", "", "write report.html and the charts into this directory (default: a new temporary directory)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: kvroute demo [--time-scale X] [--seed S] [--out DIR]

Runs a one-minute live comparison of round-robin, least-request and
kvroute on %s emulated engines whose KV cache cannot hold every
conversation everywhere, and prints a verdict, the table and the path of
an HTML report. Progress goes to stderr: a bar on a terminal, else a line
every %v.

flags:
`, demoEngines, bench.LogProgressEvery)
		printDefaults(fs)
	}
	if code, ok := parseFlags(fs, args, true); !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := demoMain(ctx, os.Stdout, o); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute demo: %v\n", err)
		return 1
	}
	return 0
}

// demoMain runs the demo and prints its report, which opens with the
// verdict, the clock warning when the engines fell behind, and the
// commands that reproduce the run; the tables follow.
func demoMain(ctx context.Context, stdout io.Writer, o demoOptions) error {
	if o.timeScale <= 0 {
		return errors.New("--time-scale must be positive")
	}
	var w fleetFlags
	w.engines, w.preset, w.workload, w.policies = demoEngines, demoPreset, demoWorkload, demoPolicies
	w.load, w.seed = demoLoad, o.seed
	w.duration, w.kvBlocks = o.span, demoKVBlocks
	fmt.Fprintf(stdout, "kvroute demo: %s engines (%s, KV cache cut to %d tokens each), workload %q at %.0f%% load, policies %s; about %.0fs\n",
		demoEngines, demoPreset, demoKVBlocks*engine.BlockSize, demoWorkload, 100*demoLoad, demoPolicies, 3*o.span.Seconds()/o.timeScale)
	w.out = o.out
	if w.out == "" {
		dir, err := os.MkdirTemp("", "kvroute-demo-")
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		w.out = dir
	}
	rerun := fmt.Sprintf("kvroute demo --time-scale %s --seed %d", strconv.FormatFloat(o.timeScale, 'g', -1, 64), o.seed)
	if o.span != demoSpan {
		rerun = "" // a test's shortened run: only compare reproduces it
	}
	lead := func(c *compared) []string { return demoOpening(demoVerdict(c.rep), c, rerun) }
	var tables bytes.Buffer
	c, err := compareMain(ctx, &tables, &w, o.timeScale, lead)
	if err != nil {
		return err
	}
	rr, kv := findRun(c.rep, report.RoundRobin), findRun(c.rep, "kvroute")
	if rr == nil || kv == nil {
		return fmt.Errorf("demo: missing a run")
	}
	fmt.Fprintln(stdout)
	for _, l := range lead(c) {
		fmt.Fprintln(stdout, l)
	}
	fmt.Fprintln(stdout)
	_, _ = tables.WriteTo(stdout)
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, gainLine("p99 time to first token", rr.TTFT.P99, kv.TTFT.P99, "ms", true))
	fmt.Fprintln(stdout, gainLine("prefix cache hit rate", 100*rr.PrefixHitRate, 100*kv.PrefixHitRate, "%", false))
	fmt.Fprintf(stdout, "\nreport: %s\n", c.page)
	return nil
}

// demoOpening is the first lines of the demo's report, on stdout and in
// the HTML page alike: the verdict, the clock warning if any, and the
// commands that reproduce the run (rerun, the demo's own, may be "").
func demoOpening(verdict string, c *compared, rerun string) []string {
	lines := []string{verdict}
	if c.clockWarning != "" {
		lines = append(lines, c.clockWarning+" (the figures measure the machine as much as the routing)")
	}
	if rerun != "" {
		lines = append(lines, "reproduce: "+rerun+", or the same run as: "+c.command)
	} else {
		lines = append(lines, "reproduce: "+c.command)
	}
	return lines
}

// demoVerdict says in one sentence what the demo showed: whether kvroute
// cut the p99 time to first token against round-robin, and by keeping
// conversations where their cache is.
func demoVerdict(rep *report.Report) string {
	rr, kv := findRun(rep, report.RoundRobin), findRun(rep, "kvroute")
	switch {
	case rr == nil || kv == nil:
		return "Verdict: none: a run is missing."
	case rr.TTFT.P99 <= 0 || kv.TTFT.P99 <= 0 || kv.Completed == 0:
		return fmt.Sprintf("Verdict: none: kvroute completed %d requests and round-robin %d, too few to compare.", kv.Completed, rr.Completed)
	case kv.TTFT.P99 < rr.TTFT.P99:
		return fmt.Sprintf("Verdict: kvroute cut the p99 time to first token %.1fx against round-robin (%.0f ms vs %.0f ms) by keeping each conversation where its KV cache is (prefix cache hit rate %.0f%% vs %.0f%%).",
			rr.TTFT.P99/kv.TTFT.P99, kv.TTFT.P99, rr.TTFT.P99, 100*kv.PrefixHitRate, 100*rr.PrefixHitRate)
	default:
		return fmt.Sprintf("Verdict: no gain in this run: kvroute's p99 time to first token was %.0f ms against round-robin's %.0f ms (prefix cache hit rate %.0f%% vs %.0f%%).",
			kv.TTFT.P99, rr.TTFT.P99, 100*kv.PrefixHitRate, 100*rr.PrefixHitRate)
	}
}

func findRun(rep *report.Report, policy string) *report.Run {
	for i := range rep.Runs {
		if rep.Runs[i].Policy == policy {
			return &rep.Runs[i]
		}
	}
	return nil
}

// gainLine says in plain words how kvroute's figure compares with
// round-robin's; lowerBetter says which way is a gain.
func gainLine(what string, rr, kv float64, unit string, lowerBetter bool) string {
	switch {
	case rr <= 0 || kv <= 0:
		return fmt.Sprintf("kvroute: %s %.1f%s, round-robin %.1f%s", what, kv, unit, rr, unit)
	case lowerBetter && kv < rr:
		return fmt.Sprintf("kvroute: %s %.1fx lower than round-robin (%.0f%s vs %.0f%s)", what, rr/kv, kv, unit, rr, unit)
	case !lowerBetter && kv > rr:
		return fmt.Sprintf("kvroute: %s %.1fx higher than round-robin (%.1f%s vs %.1f%s)", what, kv/rr, kv, unit, rr, unit)
	case lowerBetter:
		return fmt.Sprintf("kvroute: %s %.1fx higher than round-robin (%.0f%s vs %.0f%s): no gain here", what, kv/rr, kv, unit, rr, unit)
	default:
		return fmt.Sprintf("kvroute: %s %.1fx lower than round-robin (%.1f%s vs %.1f%s): no gain here", what, rr/kv, kv, unit, rr, unit)
	}
}
