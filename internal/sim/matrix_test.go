package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestParseFault: --fault's forms, their defaults and their errors.
func TestParseFault(t *testing.T) {
	reqs := []workload.Request{{At: 10 * time.Second}, {At: 30 * time.Second}}
	tests := []struct {
		flag    string
		want    Faults
		wantErr string
	}{
		{"", Faults{}, ""},
		{"restart", Faults{RestartAt: 20 * time.Second}, ""},
		{"restart=5s", Faults{RestartAt: 5 * time.Second}, ""},
		{"bypass", Faults{Bypass: 0.3}, ""},
		{"bypass=0.5", Faults{Bypass: 0.5}, ""},
		{"capacity", Faults{CapacityFactor: 2}, ""},
		{"capacity=0.5", Faults{CapacityFactor: 0.5}, ""},
		{"restart=-1s", Faults{}, "positive duration"},
		{"bypass=1", Faults{}, "share in (0, 1)"},
		{"capacity=x", Faults{}, "positive factor"},
		{"kill", Faults{KillAt: 20 * time.Second}, ""},
		{"hang=3s", Faults{HangAt: 3 * time.Second}, ""},
		{"rolling=1m", Faults{RollingAt: time.Minute}, ""},
		{"kill=0s", Faults{}, "positive duration"},
		{"flood", Faults{}, "want restart, bypass, capacity, kill, hang or rolling"},
	}
	for _, tt := range tests {
		got, err := ParseFault(tt.flag, reqs)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("--fault %s: error %v, want %q", tt.flag, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("--fault %s: %+v, %v; want %+v", tt.flag, got, err, tt.want)
		}
	}
}

// TestMatrixPlan: every load x policy x hold x KV variant is one job,
// named for its variants, the runs of one load on the same requests.
func TestMatrixPlan(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	holds, err := HoldVariants(LateBoth, Hold{Tokens: 1000, Slack: 1, Cap: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := Matrix{Base: Config{Engines: []engine.Preset{p, p}, Seed: 1}, Workload: "chat", Options: workload.Options{Limit: 20, Seed: 1},
		Loads: []float64{0.3, 0.6}, Policies: []string{"round-robin", "kvroute"}, Holds: holds,
		KV: KVVariants(true, time.Millisecond, true), Oracle: true}
	plan, err := m.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if plan.PerLoad != 2*2*3 || len(plan.Jobs) != 2*plan.PerLoad || len(plan.Oracles) != 2 {
		t.Fatalf("%d jobs, %d per load, %d oracles; want 24, 12, 2", len(plan.Jobs), plan.PerLoad, len(plan.Oracles))
	}
	want := []string{"round-robin", "round-robin+precise", "round-robin+truth", "round-robin+late", "round-robin+late+precise", "round-robin+late+truth"}
	for i, name := range want {
		if got := plan.Jobs[i].Config.Name; got != name {
			t.Errorf("job %d named %q, want %q", i, got, name)
		}
	}
	for i, j := range plan.Jobs {
		first := plan.Jobs[i/plan.PerLoad*plan.PerLoad]
		if &j.Reqs[0] != &first.Reqs[0] || j.Config.OfferedLoad != first.Config.OfferedLoad {
			t.Errorf("job %d does not share its load's requests", i)
		}
		if (j.Config.Hold != nil) != strings.Contains(j.Config.Name, "+late") || (j.Config.KVEvents != nil) != (strings.Contains(j.Config.Name, "+precise") || strings.Contains(j.Config.Name, "+truth")) {
			t.Errorf("job %d (%s): hold %v, kv %v", i, j.Config.Name, j.Config.Hold, j.Config.KVEvents)
		}
	}
	if plan.Jobs[0].Config.OfferedLoad >= plan.Jobs[plan.PerLoad].Config.OfferedLoad {
		t.Errorf("offered loads %v, %v: want the second load higher", plan.Jobs[0].Config.OfferedLoad, plan.Jobs[plan.PerLoad].Config.OfferedLoad)
	}
}
