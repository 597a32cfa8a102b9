package compare

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestFaultKill kills one of three engines under the chat workload: no
// client sees an error, the streams it was serving moving to the others.
func TestFaultKill(t *testing.T) {
	racetest.Heavy(t, "three emulated engines and a router under load")
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	engines := []engine.Preset{p, p, p}
	reqs, _, err := sim.LoadAt("chat", workload.Options{Duration: 8 * time.Second, Seed: 3}, 0.4, sim.Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	var res []FaultResult
	_, err = Run(context.Background(), reqs, Config{Engines: engines, TimeScale: 4, Policies: []string{"kvroute"},
		Fault:   &Fault{Kind: FaultKill, At: time.Second},
		Faulted: func(_ string, r FaultResult) { res = append(res, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d fault results", len(res))
	}
	r := res[0]
	t.Logf("%+v", r)
	if r.Requests != len(reqs) || r.Errors != 0 {
		t.Fatalf("%d of %d requests saw an error (%v)", r.Errors, r.Requests, r.Why)
	}
	if r.Moved == 0 {
		t.Skip("the killed engine had no stream in flight: nothing moved (a machine far behind the clock)")
	}
}
