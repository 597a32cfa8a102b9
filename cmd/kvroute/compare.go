package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/compare"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fault"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/sim"
)

func init() {
	commands["compare"] = command{"run emulated engines and the router on loopback, one live run per policy", runCompare}
}

// compareFlags declares compare's flags on fs into w; it returns the time
// scale's.
func compareFlags(fs *flag.FlagSet, w *fleetFlags) *float64 {
	w.register(fs, "4")
	timeScale := fs.Float64("time-scale", 1, "emulated seconds per real second (10 replays a 10-minute workload in one minute)")
	fs.BoolVar(&w.kvEvents, "kv-events", false, "also run each policy with the engines publishing their KV cache events over ZMQ and the router routing on them (named POLICY+precise)")
	fs.BoolVar(&w.noResponseRouting, "no-response-routing", false, "route requests with previous_response_id as any request, as a balancer that does not learn response ids (the Responses API's baseline)")
	fs.IntVar(&w.replicas, "replicas", 1, "also run each policy on N router replicas sharing state through an in-process NATS server, each request entering one at random (from --seed)")
	fs.DurationVar(&w.killReplicaAt, "kill-replica-at", 0, "with --replicas: kill the last replica this long (wall clock) into its run, as a crash would; the client sends the requests it refuses to the next replica")
	faultFlags(fs, w)
	return timeScale
}

// compareUsage is compare's usage line.
const compareUsage = "usage: kvroute compare --workload NAME|FILE [--engines N --preset NAME] [--max-num-seqs N] [--max-loras N --adapters N [--adapter-zipf S]] [--max-num-batched-tokens N] [--configure-limits] [--kv-blocks N] [--cpu-kv-blocks N] [--policies a,b,c] [--prefill N --decode M] [--rate R | --speedup X | --load F] [--limit N | --window START-END | --duration D] [--seed S] [--time-scale X] [--kv-events] [--replicas N [--kill-replica-at D]] [--fault kill|hang|restart --fault-at D [--drain-grace D]] [--oracle] [--json FILE] [--out DIR]"

func runCompare(args []string) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var w fleetFlags
	timeScale := compareFlags(fs, &w)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), compareUsage)
		fmt.Fprintln(fs.Output(), "\nStarts the emulated engines and one router on loopback, in process, and replays the workload once per policy against fresh engines. Latencies are reported in emulated time.\n\nflags:")
		printDefaults(fs)
		writeBuiltins(fs.Output())
	}
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	if w.policies == "" {
		w.policies = "round-robin,least-request,kvroute"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := compareMain(ctx, os.Stdout, &w, *timeScale, nil); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute compare: %v\n", err)
		return 1
	}
	return 0
}

// compared is what a comparison produced, for demo's summary.
type compared struct {
	rep *report.Report
	// page is the path of report.html ("" without --out).
	page string
	// clockWarning says that the emulated engines fell behind the real
	// clock, "" when they kept up.
	clockWarning string
	// command is the kvroute compare command line that reproduces the run.
	command string
}

// compareMain runs a comparison as the flags say, prints the table and
// writes the JSON and charts. lead, when not nil, gives the lines that
// open the HTML report's notes (demo's verdict), from the result.
func compareMain(ctx context.Context, stdout io.Writer, w *fleetFlags, timeScale float64, lead func(*compared) []string) (*compared, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	if timeScale <= 0 {
		return nil, errors.New("--time-scale must be positive")
	}
	if w.killReplicaAt < 0 || (w.killReplicaAt > 0 && w.replicas < 2) {
		return nil, errors.New("--kill-replica-at takes a positive duration and --replicas 2 or more")
	}
	injected, err := w.faultOf()
	if err != nil {
		return nil, err
	}
	engines, err := w.fleet()
	if err != nil {
		return nil, err
	}
	policies, err := parsePolicies(w.policies)
	if err != nil {
		return nil, err
	}
	roles, _, err := w.roles(len(engines))
	if err != nil {
		return nil, err
	}
	capacity := sim.Capacity(engines)
	// The load is computed in emulated time against the presets' capacity;
	// compare.Run replays the arrivals TimeScale times faster on the wall
	// clock, so the emulated engines see exactly this load.
	reqs, offered, err := sim.LoadAt(w.workload, w.options(), w.load, capacity)
	if err != nil {
		return nil, err
	}
	span := 0.0
	if len(reqs) > 0 {
		span = (reqs[len(reqs)-1].At - reqs[0].At).Seconds()
	}
	fmt.Fprintf(stdout, "fleet: %d emulated engines, prefill capacity %.0f prompt tokens/s; time scale %gx\n", len(engines), capacity, timeScale)
	fmt.Fprintf(stdout, "workload: %d requests over %.0fs emulated (%.0fs of wall clock per policy)\n", len(reqs), span, span/timeScale)
	var oracle *report.Oracle
	if w.oracle {
		if oracle, err = workloadOracle(stdout, reqs, engines, offered); err != nil {
			return nil, err
		}
	}
	keeping := map[string]*driverSummary{}
	var kills []string
	rep, err := compare.Run(ctx, reqs, compare.Config{
		Engines:           engines,
		KVBlocks:          w.kvBlocks,
		ConfigureLimits:   w.configureLimits,
		TimeScale:         timeScale,
		Policies:          policies,
		KVEvents:          w.kvEvents,
		NoResponseRouting: w.noResponseRouting,
		Seed:              w.seed,
		Replicas:          w.replicas,
		Roles:             roles,
		KillReplicaAt:     w.killReplicaAt,
		Fault:             injected,
		Faulted: func(run string, r compare.FaultResult) {
			kills = append(kills, fault.Describe(run, r))
		},
		Killed: func(run string, k compare.Kill) {
			kills = append(kills, describeKill(run, k))
		},
		OfferedLoad: offered,
		Progress:    progressOut(),
		Driver: func(policy string, _ int, st emulator.DriverStats) {
			d := keeping[policy]
			if d == nil {
				d = &driverSummary{}
				keeping[policy] = d
			}
			d.slip = max(d.slip, st.Slip)
			d.late = max(d.late, st.WorstLate)
		},
	})
	if err != nil {
		return nil, err
	}
	if oracle != nil {
		sim.ApplyOracle(rep.Runs, oracle)
		rep.Oracle = oracle
	}
	fmt.Fprintf(stdout, "\noffered load %.2f of the fleet's prefill capacity (every prompt token counted uncached)\n", offered)
	report.WriteTable(stdout, rep)
	labels := make([]string, len(rep.Runs)) // the policies, and their replica runs
	for i, r := range rep.Runs {
		labels[i] = r.Policy
	}
	res := &compared{rep: rep, command: w.compareCommand(timeScale)}
	res.clockWarning = writeDriverSummary(stdout, labels, keeping, span)
	for _, k := range kills {
		fmt.Fprint(stdout, k)
	}
	// Charts first: they create --out, which --json may point into.
	if w.out != "" {
		var notes []string
		if lead != nil {
			notes = lead(res)
		} else if res.clockWarning != "" {
			notes = append(notes, res.clockWarning)
		}
		notes = append(notes, fmt.Sprintf("%s: %d emulated engines; offered load %.2f of the fleet's prefill capacity (every prompt token counted uncached)",
			res.command, len(engines), offered))
		if w.kvBlocks > 0 {
			notes = append(notes, fmt.Sprintf("KV cache of every engine: %d blocks", w.kvBlocks))
		}
		if res.page, err = writeRunCharts(w.out, rep, len(rep.Runs), false, notes); err != nil {
			return nil, err
		}
	}
	if w.jsonFile != "" {
		if err := writeReportJSON(w.jsonFile, rep); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// compareCommand is the kvroute compare command line that reproduces a run
// with these flags at timeScale: every flag that shapes the run, none that
// only says where results go.
func (w *fleetFlags) compareCommand(timeScale float64) string {
	var b strings.Builder
	b.WriteString("kvroute compare")
	add := func(flag string, v any) { fmt.Fprintf(&b, " --%s %v", flag, v) }
	add("engines", w.engines)
	add("preset", w.preset)
	b.WriteString(w.limits.String())
	if w.configureLimits {
		b.WriteString(" --configure-limits")
	}
	add("workload", w.workload)
	if w.policies != "" {
		add("policies", w.policies)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"rate", w.rate}, {"speedup", w.speedup}, {"load", w.load}} {
		if f.v > 0 {
			add(f.name, strconv.FormatFloat(f.v, 'g', -1, 64))
		}
	}
	if w.limit > 0 {
		add("limit", w.limit)
	}
	if w.window != "" {
		add("window", w.window)
	}
	if w.duration > 0 {
		add("duration", w.duration)
	}
	add("seed", w.seed)
	if w.kvBlocks > 0 {
		add("kv-blocks", w.kvBlocks)
	}
	add("time-scale", strconv.FormatFloat(timeScale, 'g', -1, 64))
	if w.kvEvents {
		b.WriteString(" --kv-events")
	}
	if w.replicas > 1 {
		add("replicas", w.replicas)
	}
	if w.prefill > 0 {
		add("prefill", w.prefill)
		add("decode", w.decode)
	}
	if w.killReplicaAt > 0 {
		add("kill-replica-at", w.killReplicaAt)
	}
	if w.oracle {
		b.WriteString(" --oracle")
	}
	return b.String()
}

// driverSummary is how well one policy's emulated engines kept up with the
// real clock: the worst engine's slip (emulated time lost, which slows the
// engine down against its model) and its worst lateness in delivering a
// step (real time, which delays tokens without slowing the engine).
type driverSummary struct {
	slip, late time.Duration
}

// slipWarn is the share of the run's emulated span above which a policy's
// slip is called out: beyond it the live figures measure the machine as
// much as the routing.
const slipWarn = 0.02

// writeDriverSummary prints, per policy, how well the emulators kept up, so
// that a reader can tell a routing effect from a machine that was too busy
// for the time scale; it returns the warning it printed, "" if none.
func writeDriverSummary(w io.Writer, policies []string, keeping map[string]*driverSummary, span float64) string {
	fmt.Fprintln(w, "\nemulator clock (worst engine): slip = emulated time lost behind the real clock; late = worst delay delivering a step")
	worst := 0.0
	for _, p := range policies {
		d := keeping[p]
		if d == nil {
			continue
		}
		share := 0.0
		if span > 0 {
			share = d.slip.Seconds() / span
		}
		worst = max(worst, share)
		fmt.Fprintf(w, "  %-20s slip %8v (%.2f%% of %.0fs emulated)  late %v\n", p, d.slip.Round(time.Millisecond), 100*share, span, d.late.Round(time.Millisecond))
	}
	if worst <= slipWarn {
		return ""
	}
	warn := fmt.Sprintf("warning: the emulated engines fell behind the real clock by up to %.1f%% of the run: the machine was too busy for this time scale; use a lower --time-scale", 100*worst)
	fmt.Fprintln(w, warn)
	return warn
}

// describeKill reports a run that lost a replica: what it lost, how the
// requests that entered the others fared, and when they forgot it.
func describeKill(run string, k compare.Kill) string {
	forgot := "not within the peer timeout and three heartbeats"
	if k.Forgotten > 0 {
		forgot = fmt.Sprintf("%v after the kill", k.Forgotten.Round(time.Millisecond))
	}
	s := k.Survivors
	return fmt.Sprintf("\n%s: replica %d killed %v (wall clock) into the run with %d requests in flight: %d requests lost with it, %d refused by it and sent to another replica\n"+
		"  requests that entered the other replicas: %d completed, %d errors, TTFT mean %.1f ms, p50 %.1f ms, p99 %.1f ms, hit rate %.1f%%\n"+
		"  its peers stopped counting it (and its load) %s; peers' in-flight requests still counted after the run: %d\n",
		run, k.Replica, k.At, k.InFlight, k.Lost, k.FailedOver,
		s.Completed, s.Errors, s.TTFT.Mean, s.TTFT.P50, s.TTFT.P99, 100*s.PrefixHitRate, forgot, k.PeerLoadLeft)
}
