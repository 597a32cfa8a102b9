package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
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
