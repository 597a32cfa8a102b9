package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/kvroute/kvroute/internal/sim"
)

// simTable is `kvroute sim --table`: the routing-quality table
// (sim.QualityCases, the configurations TestRoutingQuality holds kvroute
// to) with every given policy beside kvroute and the oracle's bounds, as
// Markdown for docs/benchmarks.md. Traces are read from traceDir.
func simTable(stdout io.Writer, traceDir, policies string, parallel int) error {
	pols, err := parsePolicies(policies)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "| case | policy | p99 TTFT | mean TTFT | hit rate |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|")
	for _, c := range sim.QualityCases {
		m, err := c.Matrix(traceDir, pols, true)
		if err != nil {
			return err
		}
		plan, err := m.Plan()
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		runs, err := plan.Run(parallel)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		for _, r := range runs {
			f := sim.FiguresOf(r)
			fmt.Fprintf(stdout, "| %s | %s | %.0f ms | %.0f ms | %.1f%% |\n", c.Name, r.Policy, f.P99TTFTms, f.MeanTTFTms, 100*f.HitRate)
		}
		if o := plan.Oracles[0]; o != nil {
			fmt.Fprintf(stdout, "| %s | oracle (bound) | >= %.0f ms | >= %.0f ms | <= %.1f%% |\n", c.Name, o.P99TTFTms, o.MeanTTFTms, 100*o.HitRate)
		}
	}
	return nil
}

// defaultTraceDir is where the real traces are from the repository's
// root: ../shared/traces.
var defaultTraceDir = filepath.Join("..", "shared", "traces")

// tableFlagUsage documents --table.
var tableFlagUsage = strings.Join([]string{
	"print the routing-quality table instead of one run: every case of sim.QualityCases",
	"(the configurations the routing-quality test holds kvroute to), with --policies",
	"(default all) and the oracle, as Markdown; traces from --traces",
}, " ")
