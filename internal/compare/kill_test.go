package compare

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestKillReplica kills the last of three replicas a second into the run:
// the requests that entered the other two all complete, those the dead one
// refused go to another, and its peers forget its load within the peer
// timeout and a heartbeat (the expiry runs on the heartbeat's tick), not
// before the timeout less a heartbeat (it was heard from until the kill).
func TestKillReplica(t *testing.T) {
	engines, reqs := twoEngineChat(t, workload.Options{Duration: 16 * time.Second, Seed: 5}, 0.6)
	const timeScale = 4
	const peerTimeout = 2 * time.Second
	killAt := time.Second
	var kills []Kill
	clock := clocktest.Start(t)
	ctx, cancel := clock.Context(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, reqs, Config{
		Engines: engines, TimeScale: timeScale, Policies: []string{"kvroute"}, Seed: 2, Replicas: 3,
		KillReplicaAt: killAt, PeerTimeout: peerTimeout,
		Killed: func(run string, k Kill) {
			if run != "kvroute x3 kill" {
				t.Errorf("kill reported for run %q", run)
			}
			kills = append(kills, k)
		},
	})
	if err != nil {
		t.Fatalf("%v (%v)", err, context.Cause(ctx))
	}
	if len(rep.Runs) != 2 || len(kills) != 1 {
		t.Fatalf("%d runs, %d kills; want 2 and 1", len(rep.Runs), len(kills))
	}
	k := kills[0]
	t.Logf("%d requests over %v wall; killed replica %d at %v with %d in flight: %d lost, %d failed over; survivors %d completed, %d errors, TTFT p99 %.1f ms (one router %.1f ms); forgotten after %v; peer load left %d",
		len(reqs), reqs[len(reqs)-1].At/timeScale, k.Replica, k.At, k.InFlight, k.Lost, k.FailedOver,
		k.Survivors.Completed, k.Survivors.Errors, k.Survivors.TTFT.P99, rep.Runs[0].TTFT.P99, k.Forgotten, k.PeerLoadLeft)
	if k.Replica != 2 || k.At != killAt {
		t.Errorf("killed replica %d at %v, want 2 at %v", k.Replica, k.At, killAt)
	}
	// Without requests in flight at the kill or after it, nothing below
	// would be tested.
	if k.InFlight == 0 || k.FailedOver == 0 {
		t.Fatalf("the killed replica had %d requests in flight and refused %d later: the workload does not test the kill", k.InFlight, k.FailedOver)
	}
	if k.Survivors.Errors != 0 || k.Survivors.Completed+k.Lost > len(reqs) || k.Survivors.Completed < len(reqs)/2 {
		t.Errorf("survivors: %d completed, %d errors of %d requests (%d lost with the killed replica)", k.Survivors.Completed, k.Survivors.Errors, len(reqs), k.Lost)
	}
	// A replica never forgotten keeps its load: the check below judges that.
	if k.PeerLoadLeft != 0 && k.Forgotten != 0 {
		t.Errorf("the survivors still count %d in-flight requests of peers after the run", k.PeerLoadLeft)
	}
	// The expiry runs on a heartbeat's tick and the peer was last heard on
	// one: each can come late by a wake-up's lateness on a busy machine,
	// and the wait for it stretches with the machine's load. The watch
	// gives up after the peer timeout and three heartbeats (Forgotten 0).
	hb := config.DefaultSyncHeartbeat
	early, late := peerTimeout-hb-clock.Late(), clock.Scale(peerTimeout+hb+500*time.Millisecond)
	if k.Forgotten < early || k.Forgotten > late {
		clock.SkipIfBehind(t, 500*time.Millisecond, "the survivors forgot the killed replica %v after the kill (0: not within the wait)", k.Forgotten)
		t.Errorf("the survivors forgot the killed replica %v after the kill (0: not within the wait), want %v to %v (%s)", k.Forgotten, early, late, clock)
	}
}

// twoEngineChat skips in short mode (the callers are live runs), and
// returns two h100-llama3-8b engines and the chat workload with opts at
// load on them.
func twoEngineChat(t *testing.T, opts workload.Options, load float64) ([]engine.Preset, []workload.Request) {
	t.Helper()
	if testing.Short() {
		t.Skip("live run")
	}
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	engines := []engine.Preset{p, p}
	reqs, _, err := sim.LoadAt("chat", opts, load, sim.Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	return engines, reqs
}
