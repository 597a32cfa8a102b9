package sim

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/racetest"
)

// qualityBaseline is the committed figures TestRoutingQuality holds
// kvroute to. It moves only in a commit that says why, with the figures
// before and after: KVROUTE_QUALITY_UPDATE=1 rewrites it from a run.
const qualityBaseline = "testdata/quality.json"

// qualityTolerance is how much worse than its baseline a figure may be.
const qualityTolerance = 0.03

// traceDir is where the real traces are: ../shared/traces beside the
// repository, or $KVROUTE_TRACES.
func traceDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KVROUTE_TRACES"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "traces")
}

// TestRoutingQuality runs kvroute on every case of the routing-quality
// table (QualityCases) in virtual time and fails on any figure more than
// qualityTolerance worse than the committed baseline. The run is
// deterministic: the same code gives the same figures on any machine,
// loaded or not. .ci/run runs it on its own, without the race detector,
// under which it would take many minutes; -short skips the long cases.
func TestRoutingQuality(t *testing.T) {
	racetest.Heavy(t, "the routing-quality table (.ci/run runs it on its own: go test -run TestRoutingQuality ./internal/sim)")
	dir := traceDir(t)
	if _, err := os.Stat(filepath.Join(dir, MooncakeTrace)); err != nil {
		t.Skipf("the Mooncake trace is not at %s (set KVROUTE_TRACES): %v", dir, err)
	}
	base, err := ReadBaseline(qualityBaseline)
	update := os.Getenv("KVROUTE_QUALITY_UPDATE") == "1"
	if err != nil && !update {
		t.Fatal(err)
	}
	var jobs []Job
	var names []string
	for _, c := range QualityCases {
		if c.Long && testing.Short() {
			continue
		}
		m, err := c.Matrix(dir, []string{policy.Default}, false)
		if err != nil {
			t.Fatal(err)
		}
		p, err := m.Plan()
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		jobs = append(jobs, p.Jobs...)
		names = append(names, c.Name)
	}
	runs, err := RunAll(jobs, runtime.GOMAXPROCS(0))
	if err != nil {
		t.Fatal(err)
	}
	got := Baseline{}
	for i, run := range runs {
		f := FiguresOf(run)
		got[names[i]] = f
		b, ok := base[names[i]]
		t.Logf("%-18s p99 %8.1f ms (baseline %8.1f)  mean %8.1f ms (%8.1f)  hit %.2f%% (%.2f%%)",
			names[i], f.P99TTFTms, b.P99TTFTms, f.MeanTTFTms, b.MeanTTFTms, 100*f.HitRate, 100*b.HitRate)
		if update {
			continue
		}
		if !ok {
			t.Errorf("%s: no baseline in %s", names[i], qualityBaseline)
			continue
		}
		if w := b.Worse(f, qualityTolerance); len(w) > 0 {
			t.Errorf("%s: worse than the baseline by more than %.0f%%: %s", names[i], 100*qualityTolerance, strings.Join(w, "; "))
		}
	}
	if update {
		for n, f := range base {
			if _, ran := got[n]; !ran {
				got[n] = f
			}
		}
		if err := WriteBaseline(qualityBaseline, got); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", qualityBaseline)
	}
}

// TestFiguresWorse: the comparison the table fails on.
func TestFiguresWorse(t *testing.T) {
	base := Figures{P99TTFTms: 1000, MeanTTFTms: 100, HitRate: 0.5}
	for _, tc := range []struct {
		name      string
		base, got Figures
		want      int
	}{
		{"same", base, base, 0},
		{"better everywhere", base, Figures{900, 90, 0.6}, 0},
		{"within tolerance", base, Figures{1029, 102.9, 0.486}, 0},
		{"p99 worse", base, Figures{1031, 100, 0.5}, 1},
		{"mean worse", base, Figures{1000, 103.1, 0.5}, 1},
		{"hit rate worse", base, Figures{1000, 100, 0.484}, 1},
		{"all worse", base, Figures{2000, 200, 0.1}, 3},
		{"a tiny hit rate less by under a tenth of a point", Figures{1000, 100, 0.0006}, Figures{1000, 100, 0.0001}, 0},
		{"a tiny hit rate lost", Figures{1000, 100, 0.0016}, Figures{1000, 100, 0.0001}, 1},
	} {
		if got := tc.base.Worse(tc.got, 0.03); len(got) != tc.want {
			t.Errorf("%s: %d findings %v, want %d", tc.name, len(got), got, tc.want)
		}
	}
}
