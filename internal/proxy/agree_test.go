package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/racetest"
)

// TestSyncReplicasAgree: three replicas, two of which hold prompts of
// their own in their prefill (uneven load), take the turns of one
// conversation in turn; the turns stay on one backend whichever replica
// routes them. Then NATS goes down long enough for the replicas to forget
// each other and comes back: the moment every replica has reconnected,
// unrelated requests go where the least held work is, and a new
// conversation stays on one backend, because a replica catches up on its
// peers' load and sessions before it routes. Twenty rounds in a row, each
// on a fresh fleet: about a minute, most of it waiting out the outages, a
// minute and a half under the race detector, which runs two rounds
// (TestSyncReplicasAgreeUnderRace).
func TestSyncReplicasAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("twenty rounds of three replicas and a NATS outage")
	}
	racetest.Heavy(t, "twenty rounds of three replicas and a NATS outage")
	agreeRounds(t, 20)
}

// TestSyncReplicasAgreeUnderRace is TestSyncReplicasAgree's two first
// rounds under the race detector.
func TestSyncReplicasAgreeUnderRace(t *testing.T) {
	racetest.Only(t, "two rounds of TestSyncReplicasAgree's twenty")
	agreeRounds(t, 2)
}

func agreeRounds(t *testing.T, rounds int) {
	for r := range rounds {
		ok := t.Run(fmt.Sprintf("round%d", r), func(t *testing.T) { agreeRound(t, r) })
		if !ok {
			break
		}
	}
}

func agreeRound(t *testing.T, round int) {
	rs := newReplicas(t, 3, 3, nil)
	// Uneven load: replica 1 holds two long prompts in their prefill,
	// replica 2 three.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	total := 0
	for i, n := range map[int]int{1: 2, 2: 3} {
		for k := range n {
			total++
			wg.Add(1)
			go func() {
				defer wg.Done()
				rs.rigs[i].hold(ctx, holdPrefill+words(fmt.Sprintf("held-%d-%d-%d", round, i, k), 40000))
			}()
		}
	}
	rs.held = int64(total)
	rs.waitFor("every replica to see the held prompts", func() bool { return rs.fleetInFlight(total) })
	rs.settle()

	rs.conversation(fmt.Sprintf("before-%d", round), 12)
	rs.settle()
	// The backends the least held work is queued on, as replica 1 sees
	// them with every event applied: where unrelated requests belong.
	var least []string
	minPending := int64(-1)
	for _, b := range rs.rigs[1].srv.Fleet().Snapshot().All {
		switch p := b.KnownLoad().PendingPrefill; {
		case minPending < 0 || p < minPending:
			least, minPending = []string{b.Name}, p
		case p == minPending:
			least = append(least, b.Name)
		}
	}

	// NATS goes down until every replica has forgotten its peers, then
	// comes back on the same port; the next conversation starts the moment
	// every replica has reconnected.
	port := rs.ns.Addr().(*net.TCPAddr).Port
	rs.ns.Shutdown()
	rs.waitPeers(0)
	rs.ns = natsServer(t, port)
	rs.waitFor("every replica to reconnect", func() bool {
		for i := range rs.rigs {
			if !rs.link(i).Connected() {
				return false
			}
		}
		return true
	})
	// Unrelated requests at replica 0, the moment it is back, go where the
	// peers' held work is least, not where replica 0 alone sees none.
	for k := range 6 {
		if got := rs.backendOf(0, chat("shared", true, words(fmt.Sprintf("unrelated-%d-%d", round, k), 300)), ""); !slices.Contains(least, got) {
			rs.skipIfCaughtUpLate(fmt.Sprintf("unrelated request %d went to %s", k, got))
			t.Errorf("unrelated request %d after the outage went to %s; the least held work is on %v", k, got, least)
		}
	}
	rs.conversation(fmt.Sprintf("after-%d", round), 10)
}

// skipIfCaughtUpLate skips the test when a replica's catch-up after the
// reconnection ended by its bound rather than by hearing every peer: the
// machine was too slow for the check, and what failed is not routing.
func (rs *replicas) skipIfCaughtUpLate(what string) {
	rs.t.Helper()
	for i := range rs.rigs {
		if n := rs.link(i).Peers().Stats().CatchUpsCut; n > 0 {
			rs.t.Skipf("%s, but replica %d's catch-up after the reconnection ran out its bound (sync.peer_timeout) %d times: this machine is too slow for the check", what, i, n)
		}
	}
}

// hold streams an answer to prompt until ctx ends.
func (r *rig) hold(ctx context.Context, prompt string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(chat("shared", true, prompt)))
	if err != nil {
		r.t.Error(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			r.t.Errorf("held request: %v", err)
		}
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
}

// fleetInFlight reports whether every replica sees want requests in flight
// over the whole fleet (its own and its peers').
func (rs *replicas) fleetInFlight(want int) bool {
	for _, r := range rs.rigs {
		var n int64
		for _, b := range r.srv.Fleet().Snapshot().All {
			n += b.KnownLoad().InFlight
		}
		if n != int64(want) {
			return false
		}
	}
	return true
}

// conversation sends turns of one conversation (each turn's prompt the
// whole history so far), turn k to replica k mod 3, and fails the test
// unless they all go to one backend. It waits for the replicas to share
// each turn before it sends the next, as a client waits for an answer.
func (rs *replicas) conversation(key string, turns int) {
	rs.t.Helper()
	var history []string
	got := make([]string, turns)
	count := map[string]int{}
	var reasons []string
	for k := range turns {
		history = append(history, words(fmt.Sprintf("%s-u%d", key, k), 300))
		i := k % len(rs.rigs)
		res := rs.rigs[i].post("/v1/chat/completions", chat("shared", true, history...), "X-Session-ID", key)
		if res.status != 200 {
			rs.t.Fatalf("replica %d: status %d: %s", i, res.status, res.body)
		}
		got[k] = res.header.Get("X-Kvroute-Backend")
		reasons = append(reasons, fmt.Sprintf("r%d %s %s", i, got[k], res.header.Get("X-Kvroute-Reason")))
		count[got[k]]++
		history = append(history, words(fmt.Sprintf("%s-a%d", key, k), 100))
		rs.settle()
	}
	if len(count) > 1 {
		rs.skipIfCaughtUpLate(fmt.Sprintf("conversation %s split %v", key, count))
		rs.t.Errorf("conversation %s: %d turns split %v over backends (turn k to replica k mod %d): %s",
			key, turns, count, len(rs.rigs), strings.Join(reasons, "\n"))
	}
}
