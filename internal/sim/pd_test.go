package sim

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/report"
)

func TestXPYD(t *testing.T) {
	roles, err := XPYD(5, 2, 2)
	if want := []string{"prefill", "prefill", "decode", "decode", "both"}; err != nil || !slices.Equal(roles, want) {
		t.Errorf("XPYD(5, 2, 2) = %v, %v; want %v", roles, err, want)
	}
	if roles, err := XPYD(4, 0, 0); roles != nil || err != nil {
		t.Errorf("XPYD(4, 0, 0) = %v, %v; want an aggregated fleet", roles, err)
	}
	for _, c := range [][3]int{{4, 0, 2}, {4, 3, 2}, {4, 4, 0}, {4, -1, 2}} {
		if _, err := XPYD(c[0], c[1], c[2]); err == nil {
			t.Errorf("XPYD%v: want an error", c)
		}
	}
}

// pdRun runs reqs on engines with roles, and returns the run and the
// sim for its engines' counters.
func pdRun(t *testing.T, policyName, split string, roles []string) (report.Run, *sim) {
	t.Helper()
	engines, reqs := fixture(t, "rag", len(roles), 400, 0.7)
	s, err := newSim(reqs, Config{Engines: engines, Policy: policyName, Seed: 3, Roles: roles, Split: split})
	if err != nil {
		t.Fatal(err)
	}
	s.loop()
	run := s.result()
	if run.Completed != len(reqs) || run.Errors != 0 {
		t.Fatalf("%s %s: %d of %d completed, %d errors", policyName, split, run.Completed, len(reqs), run.Errors)
	}
	if run.PD == nil {
		t.Fatalf("%s %s: no P/D figures", policyName, split)
	}
	return run, s
}

// TestPDAlwaysSplit checks every request of an always-split run goes
// through both legs: the prompt is computed on the prefill engines (the
// decode engines compute one token a request, the last prompt token
// vLLM's decode engine computes itself), the first token comes from a
// decode engine, after the prefill leg and the transfer.
func TestPDAlwaysSplit(t *testing.T) {
	racetest.Heavy(t, "three P/D runs in virtual time")
	roles, _ := XPYD(4, 1, 3)
	for _, pol := range []string{"kvroute", "least-loaded-pair", "dynamo-pd"} {
		run, s := pdRun(t, pol, SplitAlways, roles)
		if run.PD.Split != 1 {
			t.Errorf("%s: split share %.3f, want 1", pol, run.PD.Split)
		}
		if run.PD.Prefill.P50 <= 0 || run.PD.Transfer.P50 <= 0 || run.PD.DecodeTTFT.P50 <= 0 {
			t.Errorf("%s: legs %+v: want every leg's time", pol, run.PD)
		}
		for _, smp := range run.Samples {
			if !strings.HasPrefix(smp.Backend, "engine-") || smp.Backend == "engine-0" {
				t.Fatalf("%s: request %d's tokens came from %s, the prefill engine", pol, smp.Request, smp.Backend)
			}
			if !strings.Contains(smp.Route, " | ") {
				t.Fatalf("%s: request %d's route %q: want both legs' reasons", pol, smp.Request, smp.Route)
			}
		}
		pre := s.nodes[0].eng.Stats()
		for i := 1; i < 4; i++ {
			st := s.nodes[i].eng.Stats()
			if st.PrefillTokensComputed > int64(2*run.Completed) || st.KVTransferTokens == 0 {
				t.Errorf("%s: decode engine %d computed %d prompt tokens and received %d for %d requests", pol, i, st.PrefillTokensComputed, st.KVTransferTokens, run.Completed)
			}
		}
		if pre.PrefillTokensComputed == 0 || pre.Running+pre.Waiting != 0 {
			t.Errorf("%s: prefill engine computed %d tokens, %d left", pol, pre.PrefillTokensComputed, pre.Running+pre.Waiting)
		}
		// The audit hears the prefill engine's cache hits, and nothing
		// from the decode engines, which count the KV they received as
		// cached (a picture checked against that grows without bound).
		audit := s.sched.Audit()
		if n := audit.Backend(0).Totals[pol].Requests; n == 0 {
			t.Errorf("%s: the audit heard no report from the prefill engine", pol)
		}
		for i := 1; i < 4; i++ {
			if b := audit.Backend(i); b.Totals[pol].Requests != 0 {
				t.Errorf("%s: the audit took %d reports of decode engine %d (actions %v): want none", pol, b.Totals[pol].Requests, i, b.Actions)
			}
		}
	}
}

// TestPDConditional checks the decider splits some requests and serves
// others whole on a both engine, and that a P/D policy's own decider is
// the one a conditional run uses.
func TestPDConditional(t *testing.T) {
	racetest.Heavy(t, "two P/D runs in virtual time")
	roles, _ := XPYD(4, 1, 2) // engine-3 is both
	run, s := pdRun(t, "kvroute", SplitConditional, roles)
	if run.PD.Split <= 0 || run.PD.Split >= 1 {
		t.Errorf("kvroute: split share %.3f: want some split and some whole", run.PD.Split)
	}
	if s.nodes[3].eng.Stats().PrefillTokensComputed == 0 {
		t.Errorf("the both engine computed no prompt: no request was served whole")
	}
	// llm-d's decider splits whatever has 16 uncached tokens or more on
	// the decode engine: nearly everything in rag's long prompts.
	llmd, _ := pdRun(t, "llmd-pd", SplitConditional, roles)
	if llmd.PD.Split <= run.PD.Split {
		t.Errorf("llmd-pd split %.3f, kvroute %.3f: want llm-d's prefix decider to split more", llmd.PD.Split, run.PD.Split)
	}
}

// TestPDDeterminism: two runs of the same P/D configurations, side by side
// on RunAll's workers, give the same report. Under the race detector (which
// watches RunAll's workers) on a third of the requests; the full size runs
// in .ci/run's pass without it.
func TestPDDeterminism(t *testing.T) {
	roles, _ := XPYD(4, 1, 3)
	engines, reqs := fixture(t, "rag", 4, raceScaled(300), 0.7)
	encode := func() []byte {
		var jobs []Job
		for _, p := range []string{"kvroute", "llmd-pd", "dynamo-pd", "least-loaded-pair"} {
			jobs = append(jobs, Job{Reqs: reqs, Config: Config{Engines: engines, Policy: p, Seed: 3, Roles: roles, Split: SplitConditional}})
		}
		runs, err := RunAll(jobs, 2)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(report.Report{Runs: runs})
		return b
	}
	if a, b := encode(), encode(); string(a) != string(b) {
		t.Error("two P/D runs of the same config differ")
	}
}

func TestPDRefused(t *testing.T) {
	roles, _ := XPYD(4, 1, 3)
	engines, reqs := fixture(t, "rag", 4, 10, 0.7)
	for _, c := range []Config{
		{Engines: engines, Policy: "kvroute", Roles: roles, Replicas: 2},
		{Engines: engines, Policy: "kvroute", Roles: roles[:3]},
	} {
		if _, err := Run(reqs, c); err == nil {
			t.Errorf("%+v: want an error", c)
		}
	}
	if _, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Roles: []string{config.RoleBoth, config.RoleBoth, config.RoleDecode, config.RoleBoth}}); err != nil {
		t.Errorf("a fleet without prefill engines: %v", err)
	}
}
