package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// The routing-quality table: a fixed set of configurations on which
// kvroute's figures (p99 TTFT, mean TTFT, hit rate) are held against a
// committed baseline (quality_test.go), and which `kvroute sim --table`
// prints beside the peers and the oracle. Virtual time is deterministic,
// so the table is a test, not a timing. It covers what a slice would
// miss: the whole Mooncake trace, where eviction pressure is real, as
// well as the built-in workloads and the demo's configuration.

// MooncakeTrace is the name of the real trace a case may replay, looked
// up in the trace directory given to the table (../shared/traces from the
// repository).
const MooncakeTrace = "mooncake_conversation.jsonl"

// QualityCase is one configuration of the routing-quality table.
type QualityCase struct {
	// Name keys the case in the baseline file.
	Name string
	// Workload is a built-in workload's name, or MooncakeTrace.
	Workload string
	Engines  int
	Preset   string
	Load     float64
	// Limit keeps the first Limit requests (0: all); Duration bounds a
	// synthetic workload's arrivals.
	Limit    int
	Duration time.Duration
	// KVBlocks overrides every engine's KV cache (0: the preset's).
	KVBlocks int
	// Long marks the cases that take tens of CPU-seconds each.
	Long bool
}

// QualityCases is the table, in its order. The demo's configuration is
// `kvroute demo`'s (cmd/kvroute/demo.go) in virtual time.
var QualityCases = []QualityCase{
	{Name: "mooncake-8x0.7", Workload: MooncakeTrace, Engines: 8, Preset: "h100-llama3-8b", Load: 0.7, Long: true},
	{Name: "mooncake-32x0.7", Workload: MooncakeTrace, Engines: 32, Preset: "h100-llama3-8b", Load: 0.7, Long: true},
	{Name: "mooncake600-4x0.7", Workload: MooncakeTrace, Engines: 4, Preset: "h100-llama3-8b", Load: 0.7, Limit: 600},
	{Name: "chat-8x0.9", Workload: "chat", Engines: 8, Preset: "h100-llama3-8b", Load: 0.9},
	{Name: "rag-8x0.7", Workload: "rag", Engines: 8, Preset: "h100-llama3-8b", Load: 0.7},
	{Name: "agentic-8x0.7", Workload: "agentic", Engines: 8, Preset: "h100-llama3-8b", Load: 0.7},
	{Name: "mixed-8x0.7", Workload: "mixed", Engines: 8, Preset: "h100-llama3-8b", Load: 0.7},
	{Name: "demo", Workload: "chat-docs", Engines: 4, Preset: "h100-llama3-8b", Load: 1, Duration: 64 * time.Second, KVBlocks: 16384},
}

// Matrix is the case's runs of policies (with the oracle's bounds when
// oracle is set), seed 1; traces are read from traceDir.
func (c QualityCase) Matrix(traceDir string, policies []string, oracle bool) (Matrix, error) {
	engines, err := ParseEngines(fmt.Sprint(c.Engines), c.Preset)
	if err != nil {
		return Matrix{}, err
	}
	name := c.Workload
	if name == MooncakeTrace {
		name = filepath.Join(traceDir, MooncakeTrace)
	}
	opts := workload.Options{Limit: c.Limit, Duration: c.Duration, Seed: 1}
	return Matrix{
		Base:     Config{Engines: engines, KVBlocks: c.KVBlocks, Seed: 1},
		Workload: name, Options: opts, Loads: []float64{c.Load}, Policies: policies, Oracle: oracle,
	}, nil
}

// Figures are the figures the table holds a policy to on one case.
type Figures struct {
	P99TTFTms  float64 `json:"p99_ttft_ms"`
	MeanTTFTms float64 `json:"mean_ttft_ms"`
	// HitRate is the engines' reported prefix hit rate (0 to 1).
	HitRate float64 `json:"hit_rate"`
}

// FiguresOf is run's figures.
func FiguresOf(run report.Run) Figures {
	return Figures{P99TTFTms: run.TTFT.P99, MeanTTFTms: run.TTFT.Mean, HitRate: run.PrefixHitRate}
}

// Baseline is the committed figures of kvroute on each case, by name.
type Baseline map[string]Figures

// ReadBaseline reads a baseline file.
func ReadBaseline(path string) (Baseline, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out Baseline
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// WriteBaseline writes b to path, one case a line in name order.
func WriteBaseline(path string, b Baseline) error {
	names := make([]string, 0, len(b))
	for n := range b {
		names = append(names, n)
	}
	slices.Sort(names)
	out := []byte("{\n")
	for i, n := range names {
		f := b[n]
		line := fmt.Sprintf("  %q: {\"p99_ttft_ms\": %.3f, \"mean_ttft_ms\": %.3f, \"hit_rate\": %.6f}", n, f.P99TTFTms, f.MeanTTFTms, f.HitRate)
		if i < len(names)-1 {
			line += ","
		}
		out = append(out, line+"\n"...)
	}
	out = append(out, "}\n"...)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// Worse lists how got is worse than base by more than tol (a share: 0.03
// is 3%): a latency higher, or a hit rate lower, by more than tol of the
// baseline's figure (a hit rate also by more than a tenth of a point:
// on a workload with next to no shared prefix, 3% of its 0.06% is noise of
// the rounding).
func (base Figures) Worse(got Figures, tol float64) []string {
	var out []string
	check := func(what string, b, g float64, higherIsWorse bool) {
		worse := g > b*(1+tol)
		if !higherIsWorse {
			worse = g < b*(1-tol) && b-g > 0.001
		}
		if worse || math.IsNaN(g) {
			out = append(out, fmt.Sprintf("%s %.4g, baseline %.4g (%+.1f%%)", what, g, b, 100*(g-b)/b))
		}
	}
	check("p99 TTFT ms", base.P99TTFTms, got.P99TTFTms, true)
	check("mean TTFT ms", base.MeanTTFTms, got.MeanTTFTms, true)
	check("hit rate", base.HitRate, got.HitRate, false)
	return out
}
