package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/workload"
)

const testPreset = "h100-llama3-8b"

// fixture loads a small synthetic workload at load on n engines.
// raceScaled is n, or a third of it under the race detector: for the tests
// that run RunAll's workers side by side (which the detector watches) at a
// size it slows too far; .ci/run's pass without it runs the full size.
func raceScaled(n int) int {
	if racetest.Enabled {
		return n / 3
	}
	return n
}

func fixture(t testing.TB, name string, n, limit int, load float64) ([]engine.Preset, []workload.Request) {
	t.Helper()
	engines, err := ParseEngines(fmt.Sprint(n), testPreset)
	if err != nil {
		t.Fatal(err)
	}
	reqs, _, err := LoadAt(name, workload.Options{Limit: limit, Seed: 7}, load, Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	return engines, reqs
}

// baselines are the policies every test runs: the ones users run today
// and the default.
var baselines = []string{"round-robin", "least-request", policy.Default}

func TestDeterminism(t *testing.T) {
	engines, reqs := fixture(t, "chat", 4, raceScaled(300), 0.7)
	encode := func() []byte {
		t.Helper()
		var jobs []Job
		for _, p := range policy.Names() {
			jobs = append(jobs, Job{Reqs: reqs, Config: Config{Engines: engines, Policy: p, Seed: 3}})
		}
		runs, err := RunAll(jobs, 4)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(report.Report{Runs: runs})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := encode(), encode()
	if !bytes.Equal(a, b) {
		t.Fatalf("two runs with the same seed differ:\n%s\n%s", a, b)
	}
}

func TestRunFinishesEverything(t *testing.T) {
	for _, name := range []string{"chat", "agent", "mixed", "rag"} {
		for _, p := range baselines {
			t.Run(name+"/"+p, func(t *testing.T) {
				engines, reqs := fixture(t, name, 3, 60, 0.8)
				s, err := newSim(reqs, Config{Engines: engines, Policy: p, Seed: 1})
				if err != nil {
					t.Fatal(err)
				}
				s.loop()
				run := s.result()
				if run.Completed != len(reqs) || run.Errors != 0 {
					t.Fatalf("completed %d, errors %d, want %d and 0", run.Completed, run.Errors, len(reqs))
				}
				for i, n := range s.nodes {
					if !n.eng.Idle() || n.busy || len(n.out) != 0 {
						t.Errorf("engine %d still busy: idle=%v busy=%v held=%d", i, n.eng.Idle(), n.busy, len(n.out))
					}
					if l := n.b.Load(); l != (fleet.Load{}) {
						t.Errorf("backend %d accounting not back to zero: %+v", i, l)
					}
				}
				share := 0.0
				for _, v := range run.EngineShare {
					share += v
				}
				if math.Abs(share-1) > 1e-9 {
					t.Errorf("engine shares sum to %g", share)
				}
				if run.PrefillUtilisation <= 0 || run.PrefillUtilisation > 1 {
					t.Errorf("prefill utilisation %g out of (0, 1]", run.PrefillUtilisation)
				}
				for _, smp := range run.Samples {
					if smp.TTFT <= 0 || smp.E2E < smp.TTFT {
						t.Fatalf("sample with TTFT %v, E2E %v", smp.TTFT, smp.E2E)
					}
					if len(smp.ITL) != smp.OutputTokens-1 {
						t.Fatalf("%d ITL gaps for %d output tokens", len(smp.ITL), smp.OutputTokens)
					}
				}
			})
		}
	}
}

// writeTrace writes a Mooncake-format trace of n requests, one every
// gapMs, each of in tokens sharing their first block.
func writeTrace(t *testing.T, n, gapMs, in int) string {
	t.Helper()
	var b strings.Builder
	id := 1
	for i := range n {
		blocks := (in + 511) / 512
		ids := []string{"0"}
		for range blocks - 1 {
			ids = append(ids, fmt.Sprint(id))
			id++
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [%s]}`+"\n",
			i*gapMs, in, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadAt(t *testing.T) {
	engines, err := ParseEngines("4", testPreset)
	if err != nil {
		t.Fatal(err)
	}
	capacity := Capacity(engines)
	trace := writeTrace(t, 50, 100, 2048)
	for _, tc := range []struct {
		name string
		load float64
	}{
		{"chat", 0.3}, {"chat", 0.9}, {"rag", 0.5}, {"mixed", 0.7}, {"agent", 0.5},
		{trace, 0.5}, {trace, 2},
	} {
		t.Run(fmt.Sprintf("%s@%g", filepath.Base(tc.name), tc.load), func(t *testing.T) {
			opt := workload.Options{Duration: 20 * time.Second, Seed: 1}
			reqs, offered, err := LoadAt(tc.name, opt, tc.load, capacity)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(offered-tc.load) > 1e-6*tc.load {
				t.Errorf("offered load %g, want %g", offered, tc.load)
			}
			// The arithmetic by hand: prompt tokens over the arrival span.
			var tokens int
			for _, r := range reqs {
				tokens += r.InputTokens
			}
			span := (reqs[len(reqs)-1].At - reqs[0].At).Seconds()
			if got := float64(tokens) / span / capacity; math.Abs(got-tc.load) > 0.05*tc.load {
				t.Errorf("hand-computed offered load %g, want about %g (%d tokens over %.2fs)", got, tc.load, tokens, span)
			}
			if IsBuiltin(tc.name) {
				// A synthetic workload keeps about its duration (the
				// realisation at the new rate differs, and the final
				// scaling absorbs that) rather than being squeezed: at
				// the default rate chat offers these 4 engines less than
				// a tenth of their capacity, so time scaling alone would
				// leave it a burst of a second or two.
				if span < 10 || span > 40 {
					t.Errorf("synthetic workload spans %.1fs, want about 20s", span)
				}
			} else if len(reqs) != 50 {
				t.Errorf("trace has %d requests, want 50", len(reqs))
			}
		})
	}
	if _, _, err := LoadAt("chat", workload.Options{}, -1, capacity); err == nil {
		t.Error("negative load accepted")
	}
}

func TestParseEngines(t *testing.T) {
	for _, tc := range []struct {
		spec, preset string
		want         []string // preset names, or nil for an error
	}{
		{"2", "h100-llama3-8b", []string{"h100-llama3-8b", "h100-llama3-8b"}},
		{"1xh100-llama3-8b,2xa100-llama3-8b", "", []string{"h100-llama3-8b", "a100-llama3-8b", "a100-llama3-8b"}},
		{"a100-llama3-8b", "", []string{"a100-llama3-8b"}},
		{"0", "h100-llama3-8b", nil},
		{"2", "no-such-preset", nil},
		{"2xno-such-preset", "", nil},
		{"0xh100-llama3-8b", "", nil},
	} {
		got, err := ParseEngines(tc.spec, tc.preset)
		if tc.want == nil {
			if err == nil {
				t.Errorf("ParseEngines(%q, %q) = %d engines, want an error", tc.spec, tc.preset, len(got))
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseEngines(%q, %q): %v", tc.spec, tc.preset, err)
			continue
		}
		var names []string
		for _, p := range got {
			names = append(names, p.Name)
		}
		if fmt.Sprint(names) != fmt.Sprint(tc.want) {
			t.Errorf("ParseEngines(%q, %q) = %v, want %v", tc.spec, tc.preset, names, tc.want)
		}
	}
}

func TestOracle(t *testing.T) {
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	// 10 requests of 2048 tokens sharing their first 512-token block: one
	// server with an infinite cache computes the shared block once, so
	// 9 x 512 of the 10 x 2048 prompt tokens are hits.
	path := writeTrace(t, 10, 1000, 2048)
	reqs, err := workload.Load(path, workload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := Oracle(reqs, p, request.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := 9.0 * 512 / (10 * 2048); math.Abs(o.HitRate-want) > 1e-9 {
		t.Errorf("oracle hit rate %g, want %g", o.HitRate, want)
	}
	if o.MeanTTFTms <= 0 || o.P99TTFTms < o.MeanTTFTms {
		t.Errorf("oracle TTFT mean %g ms, p99 %g ms", o.MeanTTFTms, o.P99TTFTms)
	}
	// No policy beats either bound on the same workload.
	for _, pol := range baselines {
		run, err := Run(reqs, Config{Engines: []engine.Preset{p, p}, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		if run.PrefixHitRate > o.HitRate+1e-9 {
			t.Errorf("%s hit rate %g above the oracle's %g", pol, run.PrefixHitRate, o.HitRate)
		}
		if run.TTFT.Mean < o.MeanTTFTms*(1-1e-9) {
			t.Errorf("%s mean TTFT %g ms below the oracle's %g", pol, run.TTFT.Mean, o.MeanTTFTms)
		}
		if run.TTFT.P99 < o.P99TTFTms*(1-1e-9) {
			t.Errorf("%s p99 TTFT %g ms below the oracle's %g", pol, run.TTFT.P99, o.P99TTFTms)
		}
	}
}

func TestEventHeap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h eventHeap
	var want []event
	for i := range 1000 {
		e := event{at: time.Duration(rng.IntN(50)), class: uint8(rng.IntN(3)), seq: uint64(i)}
		h.push(e)
		want = append(want, e)
	}
	var prev event
	for i := range want {
		e := h.pop()
		if i > 0 && e.less(prev) {
			t.Fatalf("pop %d: %+v came after %+v", i, e, prev)
		}
		prev = e
	}
	if len(h) != 0 {
		t.Fatalf("%d events left", len(h))
	}
}

// BenchmarkSim64 measures simulated requests per second of CPU on 64
// engines with each synthetic workload at 70% load, one policy.
func BenchmarkSim64(b *testing.B) {
	for _, name := range []string{"chat", "agent", "mixed", "rag"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			engines, reqs := fixture(b, name, 64, 20000, 0.7)
			b.ResetTimer()
			for range b.N {
				if _, err := Run(reqs, Config{Engines: engines, Policy: policy.Default, Seed: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(reqs)*b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// BenchmarkSimAll64 measures what kvroute sim does by default: every
// policy side by side (RunAll, one goroutine, in lockstep) on 64 engines at
// 70% load, per synthetic workload. req/cpu-s counts every run's requests
// (policies x requests) per second of the process's CPU time (user+sys,
// the garbage collector's included), the figure that holds on a shared
// machine where wall time does not.
func BenchmarkSimAll64(b *testing.B) {
	for _, name := range []string{"chat", "agent", "mixed", "rag"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			engines, reqs := fixture(b, name, 64, 2000, 0.7)
			var jobs []Job
			for _, p := range policy.Names() {
				jobs = append(jobs, Job{Reqs: reqs, Config: Config{Engines: engines, Policy: p, Seed: 1}})
			}
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				if _, err := RunAll(jobs, 1); err != nil {
					b.Fatal(err)
				}
			}
			cpu := cpuTime(b) - cpu0
			b.ReportMetric(float64(len(jobs)*len(reqs)*b.N)/cpu.Seconds(), "req/cpu-s")
		})
	}
}

// cpuTime is the process's user+sys CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestRunAllLockstep checks that runs sharing their requests, which RunAll
// steps together over one parse of each arrival, give exactly the results
// they give alone, however the jobs are split over goroutines.
func TestRunAllLockstep(t *testing.T) {
	engines, reqs := fixture(t, "agent", 3, 120, 0.8)
	_, other := fixture(t, "chat", 3, 100, 0.5)
	var jobs []Job
	// The baselines and a peer with state of its own (its radix tree).
	for _, p := range append(baselines[:len(baselines):len(baselines)], "sglang-cache-aware") {
		jobs = append(jobs, Job{Reqs: reqs, Config: Config{Engines: engines, Policy: p, Seed: 5}})
	}
	jobs = append(jobs, Job{Reqs: other, Config: Config{Engines: engines, Policy: policy.Default, Seed: 5}})
	want := make([]report.Run, len(jobs))
	for i, j := range jobs {
		r, err := Run(j.Reqs, j.Config)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = r
	}
	wantJSON, err := json.Marshal(report.Report{Runs: want})
	if err != nil {
		t.Fatal(err)
	}
	for _, parallel := range []int{1, 3} {
		got, err := RunAll(jobs, parallel)
		if err != nil {
			t.Fatal(err)
		}
		gotJSON, err := json.Marshal(report.Report{Runs: got})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotJSON, wantJSON) {
			t.Errorf("parallel %d: RunAll differs from runs alone:\n%s\n%s", parallel, gotJSON, wantJSON)
		}
	}
}

// TestEngineLimitsReachRouter: the router learns a small cap on running
// sequences from the engines' running and waiting counts, and their time
// per output token from their inter-token latency, as the live monitor
// does from /metrics; with ConfigureLimits it is told the cap and chunk
// from the start. The context length is always the engine's.
func TestEngineLimitsReachRouter(t *testing.T) {
	engines, reqs := fixture(t, "chat", 2, 300, 0.7)
	for i := range engines {
		engines[i], _ = engines[i].WithLimits(4, 512)
	}
	for _, configured := range []bool{false, true} {
		s, err := newSim(reqs, Config{Engines: engines, Policy: policy.Default, Seed: 1, ConfigureLimits: configured})
		if err != nil {
			t.Fatal(err)
		}
		// Before the run nothing is observed: the cold-start cap of one.
		want := fleet.Limits{ContextLen: engines[0].MaxModelLen, PlausibleSeqs: 1}
		if configured {
			want.MaxNumSeqs, want.MaxBatchedTokens, want.PlausibleSeqs = 4, 512, 4
		}
		if got := s.nodes[0].b.Limits(); got != want {
			t.Fatalf("configured %v: limits before the run %+v, want %+v", configured, got, want)
		}
		s.loop()
		want.MaxNumSeqs, want.PlausibleSeqs = 4, 4
		for i := range s.nodes {
			b := s.nodes[i].b
			if got := b.Limits(); got != want {
				t.Errorf("configured %v: engine %d limits after the run %+v, want %+v", configured, i, got, want)
			}
			if b.EngineDecodeTime() <= 0 {
				t.Errorf("engine %d: no decode time learned", i)
			}
		}
	}
}
