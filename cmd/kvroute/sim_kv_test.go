package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/migrate"
)

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

// TestSimFault runs kvroute sim --fault kill: the fault's table follows
// the run's, with the figures of report.FaultRun.
func TestSimFault(t *testing.T) {
	var out bytes.Buffer
	w := fleetFlags{engines: "3", preset: "h100-llama3-8b", workload: "chat", policies: "kvroute", limit: 90, seed: 1, load: 0.7}
	kv := kvFlags{fault: "kill", streamIdle: time.Second, migration: migrate.Limits{MaxAttempts: 2}}
	if err := simMain(&out, &w, &kv, &lateFlags{}, "", 1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nkill at ", "engine fault", "added p50/p99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
}
