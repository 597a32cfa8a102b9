package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

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

func runDemo(args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "usage: kvroute demo\n\nRuns a one-minute live comparison on 4 emulated engines whose KV cache cannot hold every conversation everywhere; it takes no flags.")
		if args[0] == "-h" || args[0] == "--help" {
			return 0
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := demoMain(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute demo: %v\n", err)
		return 1
	}
	return 0
}

func demoMain(ctx context.Context, stdout io.Writer) error {
	var w fleetFlags
	w.engines, w.preset, w.workload, w.policies = demoEngines, demoPreset, demoWorkload, demoPolicies
	w.load, w.seed = demoLoad, 1
	w.duration, w.kvBlocks = demoSpan, demoKVBlocks
	fmt.Fprintf(stdout, "kvroute demo: %s engines (%s, KV cache cut to %d tokens each), workload %q at %.0f%% load, policies %s\n\n",
		demoEngines, demoPreset, demoKVBlocks*engine.BlockSize, demoWorkload, 100*demoLoad, demoPolicies)
	dir, err := os.MkdirTemp("", "kvroute-demo-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	w.out = dir
	rep, page, err := compareMain(ctx, stdout, &w, demoTimeScale)
	if err != nil {
		return err
	}
	rr, kv := findRun(rep, report.RoundRobin), findRun(rep, "kvroute")
	if rr == nil || kv == nil {
		return fmt.Errorf("demo: missing a run")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, gainLine("p99 time to first token", rr.TTFT.P99, kv.TTFT.P99, "ms", true))
	fmt.Fprintln(stdout, gainLine("prefix cache hit rate", 100*rr.PrefixHitRate, 100*kv.PrefixHitRate, "%", false))
	fmt.Fprintf(stdout, "\nreport: %s\n", page)
	return nil
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
