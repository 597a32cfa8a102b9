package main

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFleetFlagsCheck(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		f       fleetFlags
		wantErr string
		lo, hi  time.Duration
	}{
		{name: "no workload", f: fleetFlags{}, wantErr: "--workload is required"},
		{name: "two paces", f: fleetFlags{workload: "chat", rate: 1, load: 0.5}, wantErr: "at most one"},
		{name: "negative", f: fleetFlags{workload: "chat", load: -1}, wantErr: "must not be negative"},
		{name: "negative jitter", f: fleetFlags{workload: "chat", jitter: -time.Millisecond}, wantErr: "--jitter must not be negative"},
		{name: "window on a builtin", f: fleetFlags{workload: "chat", window: "1m-2m"}, wantErr: "applies to traces"},
		{name: "window without dash", f: fleetFlags{workload: trace, window: "10m"}, wantErr: "want START-END"},
		{name: "window backwards", f: fleetFlags{workload: trace, window: "20m-10m"}, wantErr: "end must be after start"},
		{name: "window", f: fleetFlags{workload: trace, window: "10m-20m"}, lo: 10 * time.Minute, hi: 20 * time.Minute},
		{name: "open window", f: fleetFlags{workload: trace, window: "30m-"}, lo: 30 * time.Minute},
		{name: "plain trace", f: fleetFlags{workload: trace, limit: 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.check()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("check() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			o := tc.f.options()
			if o.WindowStart != tc.lo || o.WindowEnd != tc.hi || o.Limit != tc.f.limit {
				t.Errorf("options() = window [%v, %v) limit %d, want [%v, %v) limit %d", o.WindowStart, o.WindowEnd, o.Limit, tc.lo, tc.hi, tc.f.limit)
			}
		})
	}
}

// TestOracleBoundsCompareAndSim runs the same small workload through
// compare (live, loopback) and sim with --oracle and --out: both report the
// bounds, no run beats the p99 TTFT floor or the hit-rate bound, and both
// write report.html.
func TestOracleBoundsCompareAndSim(t *testing.T) {
	w := fleetFlags{engines: "2", preset: "h100-llama3-8b", workload: "chat", policies: "round-robin,kvroute",
		rate: 4, duration: 3 * time.Second, seed: 1, oracle: true, out: t.TempDir()}
	var out strings.Builder
	res, err := compareMain(t.Context(), &out, &w, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, page := res.rep, res.page
	checkReportPage(t, page, w.out)
	if rep.Oracle == nil || rep.Oracle.P99TTFTms < rep.Oracle.MeanTTFTms || rep.Oracle.MeanTTFTms <= 0 {
		t.Fatalf("compare --oracle: oracle %+v", rep.Oracle)
	}
	for _, r := range rep.Runs {
		if r.OfOracle <= 0 || r.OfOracle > 1+1e-9 {
			t.Errorf("%s: hit rate %.3f of the oracle's", r.Policy, r.OfOracle)
		}
		if r.TTFT.P99 < rep.Oracle.P99TTFTms {
			t.Errorf("%s: live p99 TTFT %.1f ms below the floor %.1f ms", r.Policy, r.TTFT.P99, rep.Oracle.P99TTFTms)
		}
	}
	if !strings.Contains(out.String(), "oracle: hit rate") {
		t.Errorf("compare output has no oracle line:\n%s", out.String())
	}

	out.Reset()
	w.out = t.TempDir()
	w.requests = filepath.Join(w.out, "requests.csv")
	if err := simMain(&out, &w, &kvFlags{}, &lateFlags{}, "", 1); err != nil {
		t.Fatal(err)
	}
	checkReportPage(t, filepath.Join(w.out, "report.html"), w.out)
	if !strings.Contains(out.String(), "oracle at load") || !strings.Contains(out.String(), "of oracle") {
		t.Errorf("sim --oracle output lacks the bounds:\n%s", out.String())
	}
	// --requests: a row per request of each policy, with its oracle TTFT
	// (internal/sim checks the rows against the runs).
	b, err := os.ReadFile(w.requests)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	oracle := slices.Index(rows[0], "oracle_ttft_ms")
	perPolicy := map[string]int{}
	for _, row := range rows[1:] {
		if row[oracle] == "" {
			t.Errorf("--requests row without its oracle TTFT: %v", row)
		}
		perPolicy[row[0]]++
	}
	if len(perPolicy) != 2 || perPolicy["kvroute"] == 0 || perPolicy["kvroute"] != perPolicy["round-robin"] {
		t.Errorf("--requests rows per policy: %v", perPolicy)
	}
}

// checkReportPage checks that page is dir's report.html and holds every
// section with the runs' engines (report's tests check the page's shape).
func checkReportPage(t *testing.T, page, dir string) {
	t.Helper()
	if page != filepath.Join(dir, "report.html") {
		t.Errorf("report page %q, want report.html in %s", page, dir)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<!DOCTYPE html>", `id="ttft"`, `id="p99-over-time"`, `id="hit-over-time"`, `id="engine-share"`, "round-robin", "kvroute"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q", page, want)
		}
	}
}

// TestKillReplicaAtNeedsReplicas: --kill-replica-at is refused without a
// replica run to kill one of, and when negative, before anything starts.
func TestKillReplicaAtNeedsReplicas(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		at       time.Duration
	}{{1, time.Second}, {3, -time.Second}} {
		w := fleetFlags{engines: "2", preset: "h100-llama3-8b", workload: "chat", policies: "kvroute",
			rate: 4, duration: 3 * time.Second, seed: 1, replicas: tc.replicas, killReplicaAt: tc.at}
		var out strings.Builder
		if _, err := compareMain(t.Context(), &out, &w, 10, nil); err == nil || !strings.Contains(err.Error(), "--kill-replica-at") {
			t.Errorf("--replicas %d --kill-replica-at %v: err %v, want a --kill-replica-at error", tc.replicas, tc.at, err)
		}
	}
}

// TestFaultFlags: compare's --fault takes kill, hang or restart and a
// positive --fault-at; the other two flags go with it. Refused before
// anything starts.
func TestFaultFlags(t *testing.T) {
	for _, tc := range []struct {
		fault     string
		at, grace time.Duration
		want      string
	}{
		{"crash", time.Second, 0, "--fault"},
		{"kill", 0, 0, "--fault-at"},
		{"restart", time.Second, -time.Second, "--drain-grace"},
		{"", time.Second, 0, "--fault-at"},
	} {
		w := fleetFlags{engines: "2", preset: "h100-llama3-8b", workload: "chat", policies: "kvroute",
			rate: 4, duration: 3 * time.Second, seed: 1, fault: tc.fault, faultAt: tc.at, drainGrace: tc.grace}
		var out strings.Builder
		if _, err := compareMain(t.Context(), &out, &w, 10, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--fault %q --fault-at %v --drain-grace %v: err %v, want one naming %s", tc.fault, tc.at, tc.grace, err, tc.want)
		}
		if out.Len() > 0 {
			t.Errorf("--fault %q: the run started: %s", tc.fault, out.String())
		}
	}
}
