package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/migrate"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/sim"
)

// kvFlags are sim's KV event and fault flags.
type kvFlags struct {
	events bool
	delay  time.Duration
	fault  string
	// The engine faults' settings (sim.Faults) and migration's limits.
	streamIdle, drainGrace, engineStart time.Duration
	migration                           migrate.Limits
}

func (k *kvFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&k.events, "kv-events", false, "also run each policy routing on the engines' KV cache events (precise; named POLICY+precise), and with --oracle on what the engines truly hold at routing time (POLICY+truth)")
	fs.DurationVar(&k.delay, "kv-events-delay", 50*time.Millisecond, "with --kv-events: how long an engine's events take to reach the router")
	fs.StringVar(&k.fault, "fault", "", strings.Join([]string{
		"a fault for every run: restart[=D] (engine 0's cache wiped at D, default the middle of the arrivals),",
		"bypass[=F] (a share F of requests, default 0.3, reaches a random engine without the router),",
		"capacity[=X] (engine 0 reports X times its KV capacity, default 2);",
		"an engine failing at D (default the middle of the arrivals), its streams moved to other engines (--migration-*):",
		"kill[=D] (engine 0 dies and leaves the fleet), hang[=D] (engine 0 stops sending; its streams found after --stream-idle-timeout),",
		"rolling[=D] (every engine in turn drained, its streams moved after --drain-grace, restarted empty after --engine-start, undrained)",
	}, " "))
	fs.DurationVar(&k.streamIdle, "stream-idle-timeout", sim.DefaultStreamIdle, "with --fault hang: the router's upstream.stream_idle_timeout, in virtual time")
	fs.DurationVar(&k.drainGrace, "drain-grace", config.DefaultDrainGrace, "with --fault rolling: the router's fleet.drain_grace, in virtual time")
	fs.DurationVar(&k.engineStart, "engine-start", 5*time.Second, "with --fault rolling: how long a restarted engine takes to start, in virtual time")
	fs.IntVar(&k.migration.MaxAttempts, "migration-max-attempts", config.DefaultMigrationAttempts, "with --fault kill, hang or rolling: the router's migration.max_attempts (0: streams are not moved)")
	fs.IntVar(&k.migration.MaxContextTokens, "migration-max-context-tokens", config.DefaultMigrationContextTokens, "with --fault kill, hang or rolling: the router's migration.max_context_tokens (0: no bound)")
}

// faults are the engine faults' settings for sim.Config.Faults.
func (k *kvFlags) faults() sim.Faults {
	return sim.Faults{StreamIdle: k.streamIdle, DrainGrace: k.drainGrace, EngineStart: k.engineStart}
}

// writeFaults prints how the runs took their engine fault, when they had
// one.
func writeFaults(w io.Writer, runs []report.Run) {
	head := false
	for _, r := range runs {
		f := r.Fault
		if f == nil {
			continue
		}
		if !head {
			fmt.Fprintf(w, "\n%s at %.1fs\n%-34s %7s %7s %7s %7s %7s %12s %5s %20s %10s %5s\n", f.Kind, f.AtMs/1000,
				"engine fault", "errors", "moved", "streams", "refused", "resent", "extra pf tok", "hit", "added p50/p99", "bound p99", "over")
			head = true
		}
		fmt.Fprintf(w, "%-34s %7d %7d %7d %7d %7d %12d %5d %8.0f/%8.0fms %8.0fms %5d\n", r.Policy, f.Errors, f.Moved, f.Streams, f.Refused, f.Resent,
			f.ExtraPrefillTokens, f.Hit, f.Added50, f.Added99, f.Bound99, f.Over)
		if len(f.RestartsMs) > 0 {
			parts := make([]string, len(f.RestartsMs))
			for i, d := range f.RestartsMs {
				parts[i] = fmt.Sprintf("%.2fs", d/1000)
			}
			fmt.Fprintf(w, "%-34s restarts, drain to undrain: %s\n", "", strings.Join(parts, " "))
		}
	}
}

func (k *kvFlags) check() error {
	if k.delay < 0 {
		return errors.New("--kv-events-delay must not be negative")
	}
	if k.streamIdle < 0 || k.drainGrace < 0 || k.engineStart < 0 {
		return errors.New("--stream-idle-timeout, --drain-grace and --engine-start must not be negative")
	}
	if k.migration.MaxAttempts < 0 || k.migration.MaxContextTokens < 0 {
		return errors.New("--migration-max-attempts and --migration-max-context-tokens must not be negative")
	}
	_, err := sim.ParseFault(k.fault, nil)
	return err
}

// variants are the runs of each policy: approximate, then precise and the
// truth bound with --kv-events.
func (k *kvFlags) variants(oracle bool) []sim.Variant {
	return sim.KVVariants(k.events, k.delay, oracle)
}
