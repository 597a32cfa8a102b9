package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

func TestFaultFlag(t *testing.T) {
	reqs := []workload.Request{{At: 10 * time.Second}, {At: 30 * time.Second}}
	tests := []struct {
		flag    string
		want    sim.Faults
		wantErr string
	}{
		{"", sim.Faults{}, ""},
		{"restart", sim.Faults{RestartAt: 20 * time.Second}, ""},
		{"restart=5s", sim.Faults{RestartAt: 5 * time.Second}, ""},
		{"bypass", sim.Faults{Bypass: 0.3}, ""},
		{"bypass=0.5", sim.Faults{Bypass: 0.5}, ""},
		{"capacity", sim.Faults{CapacityFactor: 2}, ""},
		{"capacity=0.5", sim.Faults{CapacityFactor: 0.5}, ""},
		{"restart=-1s", sim.Faults{}, "positive duration"},
		{"bypass=1", sim.Faults{}, "share in (0, 1)"},
		{"capacity=x", sim.Faults{}, "positive factor"},
		{"flood", sim.Faults{}, "want restart, bypass or capacity"},
	}
	for _, tt := range tests {
		k := kvFlags{fault: tt.flag}
		got, err := k.faults(reqs)
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

// TestSimKVEvents runs kvroute sim --kv-events --oracle on a small
// workload: each policy gets its precise and truth runs beside it.
func TestSimKVEvents(t *testing.T) {
	var out bytes.Buffer
	w := fleetFlags{engines: "2", preset: "h100-llama3-8b", workload: "chat", policies: "kvroute", limit: 60, seed: 1, oracle: true}
	kv := kvFlags{events: true, delay: 10 * time.Millisecond, fault: "bypass"}
	if err := simMain(&out, &w, &kv, &lateFlags{}, "", 1); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{" kvroute ", " kvroute+precise ", " kvroute+truth "} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("no %q run in:\n%s", name, out.String())
		}
	}
}
