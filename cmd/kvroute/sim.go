package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

func init() {
	commands["sim"] = command{"replay a workload on a simulated fleet in virtual time, one run per policy", runSim}
}

// progressOut is where sim, compare and demo report their progress;
// stubbed in tests.
var progressOut = bench.StderrProgress

// fleetFlags are the workload selection flags sim and compare share.
type fleetFlags struct {
	engines, preset, workload, policies string
	window                              string
	rate, speedup, load                 float64
	limit                               int
	duration                            time.Duration
	windowStart, windowEnd              time.Duration // parsed --window
	oracle                              bool
	seed                                int64
	jitter                              time.Duration // sim only
	kvEvents                            bool          // compare only (sim has kvFlags)
	noResponseRouting                   bool          // compare only
	replicas                            int           // sim and compare
	killReplicaAt                       time.Duration // compare only
	// fault, faultAt and drainGrace are compare's --fault, --fault-at
	// and --drain-grace (compare_faults.go).
	fault               string
	faultAt, drainGrace time.Duration
	// sim only:
	syncDelay               time.Duration
	noSync                  bool
	tierBlindIndex          bool
	kvBlocks                int
	jsonFile, out, requests string
	// limits override every engine's --max-num-seqs and
	// --max-num-batched-tokens (sim and compare); configureLimits tells
	// the router those limits as backends[] keys.
	limits           limitFlags
	configureLimits  bool
	trueCoefficients bool
	// adapters and adapterZipf give the requests LoRA adapters
	// (workload.Options).
	adapters    int
	adapterZipf float64
	// prefill and decode make the fleet disaggregated (xPyD), split
	// the split modes (sim.SplitConditional, SplitAlways).
	prefill, decode int
	split           string
}

func (w *fleetFlags) register(fs *flag.FlagSet, engines string) {
	fs.StringVar(&w.engines, "engines", engines, "engine count (with --preset), or a mix such as 4xh100-llama3-8b,4xa100-llama3-8b")
	fs.StringVar(&w.preset, "preset", "h100-llama3-8b", "engine preset when --engines is a count")
	fs.StringVar(&w.workload, "workload", "", "built-in workload name or Mooncake-format trace file (required)")
	fs.StringVar(&w.policies, "policies", "", "comma-separated routing policies (default: all)")
	fs.Float64Var(&w.rate, "rate", 0, "Poisson arrival rate of a synthetic workload, requests/s")
	fs.Float64Var(&w.speedup, "speedup", 0, "compress a trace's timestamps by this factor")
	fs.Float64Var(&w.load, "load", 0, "offered prompt tokens/s as a fraction of the fleet's prefill capacity (every token counted uncached)")
	fs.IntVar(&w.limit, "limit", 0, "keep the first N requests (0: all)")
	fs.StringVar(&w.window, "window", "", "trace only: keep requests with trace timestamps in `START-END` (Go durations, e.g. 10m-20m or 30m-), re-based to start at 0")
	fs.DurationVar(&w.duration, "duration", 0, "bound a synthetic workload's arrivals (default 60s unless --limit)")
	fs.Int64Var(&w.seed, "seed", 1, "seed of the workload and of the policies' random choices")
	fs.IntVar(&w.kvBlocks, "kv-blocks", 0, "override every engine's KV cache capacity in blocks")
	fs.StringVar(&w.jsonFile, "json", "", "write {\"runs\":[...]} to this file")
	fs.StringVar(&w.out, "out", "", "write report.html (tables and charts in one self-contained page) and SVG charts into this directory")
	fs.BoolVar(&w.oracle, "oracle", false, "also compute the workload's bounds: infinite-cache hit rate, and mean and p99 TTFT with that cache and no queueing")
	w.limits.register(fs)
	fs.IntVar(&w.adapters, "adapters", 0, "have each conversation ask for one of N LoRA adapters of the base model (with --max-loras)")
	fs.Float64Var(&w.adapterZipf, "adapter-zipf", 0, "Zipf exponent of the adapters' popularity (default 1)")
	fs.IntVar(&w.prefill, "prefill", 0, "of the --engines, this many are prefill engines (backends[].role prefill): the run is repeated on that disaggregated fleet beside the aggregated one")
	fs.IntVar(&w.decode, "decode", 0, "with --prefill: of the --engines, this many after the prefill ones are decode engines; the rest take whole requests (role both)")
	fs.StringVar(&w.split, "split", sim.SplitConditional, "with --prefill: which requests are split: conditional (the decider: kvroute's, or a P/D policy's own), always, or both (each run twice)")
	fs.BoolVar(&w.trueCoefficients, "true-coefficients", false, "give the router every engine's true cost coefficients up front (its preset's), frozen, instead of learning them from the generic prior: the yardstick of the learned cost model")
	fs.BoolVar(&w.configureLimits, "configure-limits", false, "give the router every engine's max-num-seqs and max-num-batched-tokens as backends[].max_num_seqs and max_num_batched_tokens; without it the router learns the cap from the engines' running and waiting counts (vLLM exports neither)")
}

// fleet is the engines --engines and --preset name, with the
// --max-num-seqs and --max-num-batched-tokens overrides applied.
func (w *fleetFlags) fleet() ([]engine.Preset, error) {
	engines, err := sim.ParseEngines(w.engines, w.preset)
	if err != nil {
		return nil, err
	}
	return w.limits.apply(engines)
}

// check validates the flags that do not depend on the command.
func (w *fleetFlags) check() error {
	if w.workload == "" {
		return errors.New("--workload is required")
	}
	set := 0
	for _, v := range []float64{w.rate, w.speedup, w.load} {
		if v < 0 {
			return errors.New("--rate, --speedup and --load must not be negative")
		}
		if v > 0 {
			set++
		}
	}
	if set > 1 {
		return errors.New("give at most one of --rate, --speedup and --load")
	}
	if w.jitter < 0 {
		return errors.New("--jitter must not be negative")
	}
	if w.window != "" {
		if isBuiltin(w.workload) {
			return fmt.Errorf("--window applies to traces; %q is a built-in workload (use --duration or --limit)", w.workload)
		}
		var err error
		if w.windowStart, w.windowEnd, err = parseWindow(w.window); err != nil {
			return err
		}
	}
	return nil
}

func (w *fleetFlags) options() workload.Options {
	return workload.Options{Rate: w.rate, Speedup: w.speedup, Limit: w.limit, Duration: w.duration, Seed: w.seed,
		WindowStart: w.windowStart, WindowEnd: w.windowEnd, Jitter: w.jitter, Adapters: w.adapters, AdapterZipf: w.adapterZipf}
}

// roles is the fleet's roles (sim.XPYD) and split modes from --prefill,
// --decode and --split; nil roles for an aggregated fleet.
func (w *fleetFlags) roles(engines int) ([]string, []string, error) {
	roles, err := sim.XPYD(engines, w.prefill, w.decode)
	if err != nil || roles == nil {
		return nil, nil, err
	}
	switch w.split {
	case sim.SplitConditional, sim.SplitAlways:
		return roles, []string{w.split}, nil
	case "both":
		return roles, []string{sim.SplitConditional, sim.SplitAlways}, nil
	}
	return nil, nil, fmt.Errorf("--split %q: want conditional, always or both", w.split)
}

// pairPolicies are the policies a disaggregated run compares by default:
// kvroute's pair and the P/D policies (policy.PairDecider).
func pairPolicies() []string {
	out := []string{policy.Default}
	for _, n := range policy.Names() {
		if isPair(n) {
			out = append(out, n)
		}
	}
	return out
}

// isPair reports whether the policy named n is a P/D policy, which runs
// on disaggregated fleets only.
func isPair(n string) bool {
	p, err := policy.New(n, policy.Options{})
	if err != nil {
		return false
	}
	_, ok := p.(policy.PairDecider)
	return ok
}

// parsePolicies parses --policies; empty means every registered policy
// but the P/D ones, with round-robin first since the table's ratios are
// to it.
func parsePolicies(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		names := slices.DeleteFunc(policy.Names(), isPair)
		if i := slices.Index(names, "round-robin"); i > 0 {
			names = append([]string{"round-robin"}, slices.Delete(names, i, i+1)...)
		}
		return names, nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if _, err := policy.New(p, policy.Options{}); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("--policies names no policy")
	}
	return out, nil
}

func parseSweepLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("--sweep: %q is not a positive load", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func runSim(args []string) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	var w fleetFlags
	w.register(fs, "8")
	sweep := fs.String("sweep", "", "comma-separated loads (e.g. 0.3,0.5,0.7,0.9): run each and chart p99 TTFT against load")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "runs to simulate side by side (each run is single-threaded)")
	var kv kvFlags
	kv.register(fs)
	fs.DurationVar(&w.jitter, "jitter", 0, "delay each arrival by a random 0 to `D` (drawn from --seed), as a live client and network do; several seeds show the spread a live compare has")
	fs.IntVar(&w.replicas, "replicas", 1, "router replicas in front of the engines, each request entering one at random (drawn from --seed)")
	fs.DurationVar(&w.syncDelay, "sync-delay", 0, "with --replicas: how long a replica's events take to reach the others, in virtual time")
	fs.BoolVar(&w.noSync, "no-sync", false, "with --replicas: the replicas share nothing")
	fs.BoolVar(&w.tierBlindIndex, "tier-blind-index", false, "with --cpu-kv-blocks: do not tell the router the engines' CPU tiers (its approximate index then does not model their offload)")
	fs.StringVar(&w.requests, "requests", "", "write one CSV row per request of every run to this file: its engine, matched and cached tokens, its TTFT as router hold, engine queue and prefill (with --oracle, its oracle TTFT too), and the router's reason")
	var lb lateFlags
	lb.register(fs)
	table := fs.Bool("table", false, tableFlagUsage)
	traces := fs.String("traces", defaultTraceDir, "with --table: the directory of the real traces")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kvroute sim --workload NAME|FILE [--engines N --preset NAME | --engines 4xA,4xB] [--max-num-seqs N] [--max-loras N --adapters N [--adapter-zipf S]] [--max-num-batched-tokens N [--configure-limits]] [--true-coefficients] [--policies a,b] [--prefill N --decode M [--split conditional|always|both]] [--rate R | --speedup X | --load F | --sweep F,F,...] [--limit N | --window START-END] [--jitter D] [--cpu-kv-blocks N [--tier-blind-index]] [--oracle] [--kv-events [--kv-events-delay D]] [--fault restart|bypass|capacity|kill|hang|rolling[=D|F|X] [--stream-idle-timeout D] [--drain-grace D] [--engine-start D] [--migration-max-attempts N] [--migration-max-context-tokens N]] [--replicas N [--sync-delay D] [--no-sync]] [--late-binding[=both] [--hold-tokens N] [--hold-order fcfs|deadline] [--hold-slack X] [--hold-cap D]] [--json FILE] [--requests FILE] [--out DIR]")
		fmt.Fprintln(fs.Output(), "\nReplays the workload on a simulated fleet in virtual time, with the same scheduler and engine model as kvroute serve and kvroute engine, once per policy.\n\nflags:")
		printDefaults(fs)
		writeBuiltins(fs.Output())
	}
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	if *table {
		if err := simTable(os.Stdout, *traces, w.policies, *parallel); err != nil {
			fmt.Fprintf(os.Stderr, "kvroute sim: %v\n", err)
			return 1
		}
		return 0
	}
	if err := simMain(os.Stdout, &w, &kv, &lb, *sweep, *parallel); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute sim: %v\n", err)
		return 1
	}
	return 0
}

func simMain(stdout io.Writer, w *fleetFlags, kv *kvFlags, lb *lateFlags, sweep string, parallel int) error {
	if err := w.check(); err != nil {
		return err
	}
	if err := kv.check(); err != nil {
		return err
	}
	holds, err := lb.holds()
	if err != nil {
		return err
	}
	variants := kv.variants(w.oracle)
	engines, err := w.fleet()
	if err != nil {
		return err
	}
	roles, splits, err := w.roles(len(engines))
	if err != nil {
		return err
	}
	policies, err := parsePolicies(w.policies)
	if err != nil {
		return err
	}
	if roles != nil && strings.TrimSpace(w.policies) == "" {
		policies = pairPolicies()
	}
	loads := []float64{w.load}
	if sweep != "" {
		if w.rate > 0 || w.speedup > 0 || w.load > 0 {
			return errors.New("--sweep sets the load; do not give --rate, --speedup or --load with it")
		}
		if loads, err = parseSweepLoads(sweep); err != nil {
			return err
		}
	}
	capacity := sim.Capacity(engines)
	fmt.Fprintf(stdout, "fleet: %d engines, prefill capacity %.0f prompt tokens/s\n", len(engines), capacity)
	plan, err := sim.Matrix{
		Base: sim.Config{Engines: engines, KVBlocks: w.kvBlocks, ConfigureLimits: w.configureLimits, TrueCoefficients: w.trueCoefficients, Seed: w.seed,
			Replicas: w.replicas, SyncDelay: w.syncDelay, NoSync: w.noSync, TierBlindIndex: w.tierBlindIndex,
			Faults: kv.faults(), Migration: kv.migration},
		Workload: w.workload, Options: w.options(), Loads: loads, Policies: policies,
		Holds: holds, KV: variants, Oracle: w.oracle, Fault: kv.fault,
		Fleets: sim.FleetVariants(roles, splits),
	}.Plan()
	if err != nil {
		return err
	}
	for i, o := range plan.Oracles {
		printOracle(stdout, loads[i], o, plan.OraclePreset)
	}
	rep := &report.Report{}
	if len(plan.Oracles) == 1 {
		rep.Oracle = plan.Oracles[0]
	}
	start := time.Now()
	total, jobs := plan.Requests(), plan.Jobs
	stop := progressOut().Lines(func(el time.Duration) string {
		return fmt.Sprintf("sim: %d/%d requests routed over %d runs, %v", plan.Routed.Load(), total, len(jobs), el)
	})
	runs, err := plan.Run(parallel)
	stop()
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	perLoad := plan.PerLoad
	rep.Runs = runs

	for i := 0; i < len(runs); i += perLoad {
		group := &report.Report{Runs: runs[i : i+perLoad]}
		if w.oracle {
			group.Oracle = plan.Oracles[i/perLoad]
		}
		fmt.Fprintf(stdout, "\noffered load %.2f of the fleet's prefill capacity (every prompt token counted uncached), %d requests\n",
			group.Runs[0].OfferedLoad, len(jobs[i].Reqs))
		report.WriteTable(stdout, group)
		writePD(stdout, group.Runs)
		writeFaults(stdout, group.Runs)
	}
	fmt.Fprintf(stdout, "\nsimulated %d runs in %.1fs\n", len(runs), elapsed.Seconds())

	// Charts first: they create --out, which --json may point into.
	if w.out != "" {
		notes := []string{fmt.Sprintf("kvroute sim --engines %s --preset %s%s --workload %s --seed %d: %d engines, prefill capacity %.0f prompt tokens/s",
			w.engines, w.preset, &w.limits, w.workload, w.seed, len(engines), capacity)}
		if _, err := writeRunCharts(w.out, rep, perLoad, sweep != "", notes); err != nil {
			return err
		}
	}
	if w.jsonFile != "" {
		if err := writeReportJSON(w.jsonFile, rep); err != nil {
			return err
		}
	}
	if w.requests != "" {
		if err := writeOutputFile(w.requests, func(f io.Writer) error { return report.WriteRequestsCSV(f, runs) }); err != nil {
			return err
		}
	}
	return nil
}

// workloadOracle computes the bounds of reqs (sim.OracleTTFTs) on the
// fleet's fastest preset, which bounds every engine of a mixed fleet, and
// prints them.
func workloadOracle(stdout io.Writer, reqs []workload.Request, engines []engine.Preset, load float64) (*report.Oracle, error) {
	p := sim.FastestPreset(engines)
	o, _, err := sim.OracleTTFTs(reqs, p, request.Options{})
	if err != nil {
		return nil, err
	}
	printOracle(stdout, load, &o, p)
	return &o, nil
}

// printOracle prints a load's bounds, computed on preset p.
func printOracle(stdout io.Writer, load float64, o *report.Oracle, p engine.Preset) {
	fmt.Fprintf(stdout, "oracle at load %.2f: hit rate %.1f%% (one server, infinite cache), TTFT mean >= %.1f ms, p99 >= %.1f ms (cached prefix, no queueing, %s)\n",
		load, 100*o.HitRate, o.MeanTTFTms, o.P99TTFTms, p.Name)
}

func writeReportJSON(path string, rep *report.Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// writeRunCharts writes into dir the TTFT distribution of the last load's
// runs (ttft.svg), for a sweep p99 TTFT against load (sweep_p99_ttft.svg),
// and report.html (report.WriteHTML) of the last load's runs, headed by
// notes; it returns the path of report.html.
func writeRunCharts(dir string, rep *report.Report, perLoad int, sweep bool, notes []string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("charts: %w", err)
	}
	last := &report.Report{Runs: rep.Runs[len(rep.Runs)-perLoad:], Oracle: rep.Oracle}
	if err := writeOutputFile(filepath.Join(dir, "ttft.svg"), func(w io.Writer) error {
		return report.WriteTTFTChart(w, last.Runs)
	}); err != nil {
		return "", err
	}
	opt := report.HTMLOptions{Notes: notes}
	if sweep {
		points := make([]report.SweepPoint, len(rep.Runs))
		for i, r := range rep.Runs {
			points[i] = report.SweepPoint{Policy: r.Policy, Load: r.OfferedLoad, P99ms: r.TTFT.P99}
		}
		if err := writeOutputFile(filepath.Join(dir, "sweep_p99_ttft.svg"), func(w io.Writer) error {
			return report.WriteSweepChart(w, points)
		}); err != nil {
			return "", err
		}
		opt.Sweep = points
	}
	path := filepath.Join(dir, "report.html")
	return path, writeOutputFile(path, func(w io.Writer) error { return report.WriteHTML(w, last, opt) })
}

// writeOutputFile writes a chart, page or table to path and says so on
// stderr.
func writeOutputFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("output %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("output %s: %w", path, err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", path)
	return nil
}

// writePD prints the per-leg figures of the runs on a disaggregated
// fleet, when there are any.
func writePD(w io.Writer, runs []report.Run) {
	head := false
	for _, r := range runs {
		if r.PD == nil {
			continue
		}
		if !head {
			fmt.Fprintf(w, "\n%-34s %6s %20s %20s %20s\n", "prefill/decode legs", "split", "prefill leg p50/p99", "transfer p50/p99", "decode TTFT p50/p99")
			head = true
		}
		fmt.Fprintf(w, "%-34s %5.0f%% %9.1f/%8.1fms %9.1f/%8.1fms %9.1f/%8.1fms\n", r.Policy, 100*r.PD.Split,
			r.PD.Prefill.P50, r.PD.Prefill.P99, r.PD.Transfer.P50, r.PD.Transfer.P99, r.PD.DecodeTTFT.P50, r.PD.DecodeTTFT.P99)
	}
}
