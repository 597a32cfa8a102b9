package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// Conversations whose turns share nothing but the session key (each turn
// a fresh text, as Responses API turns chained by previous_response_id
// are): only the session table keeps them on one engine, and with several
// replicas that table must say the same thing at every replica, whatever
// load each one holds and whether NATS is up.

// turns records where each turn of each conversation went.
type turns struct {
	order []string
	seen  map[string][]string // key -> "replica backend reason" per turn
	at    map[string][]string // key -> backend per turn
}

func newTurns() *turns {
	return &turns{seen: map[string][]string{}, at: map[string][]string{}}
}

// fresh sends turn k of conversation key to replica i: a text of its own,
// with the session key, and waits for the replicas to share it before it
// returns the backend (as conversation does: a turn that outruns its
// previous turn's events at a peer sees that turn still queued on the
// conversation's engine, a load that can move it once).
func (rs *replicas) fresh(tr *turns, key string, i, k int) string {
	rs.t.Helper()
	i %= len(rs.rigs)
	res := rs.rigs[i].post("/v1/chat/completions", chat("shared", true, words(fmt.Sprintf("%s-turn%d", key, k), 300)), "X-Session-ID", key)
	if res.status != 200 {
		rs.t.Fatalf("replica %d: status %d: %s", i, res.status, res.body)
	}
	got := res.header.Get("X-Kvroute-Backend")
	if _, ok := tr.at[key]; !ok {
		tr.order = append(tr.order, key)
	}
	tr.at[key] = append(tr.at[key], got)
	tr.seen[key] = append(tr.seen[key], fmt.Sprintf("turn %d r%d %s %s", k, i, got, res.header.Get("X-Kvroute-Reason")))
	if rs.ns.Running() { // with NATS down there is nothing to share
		rs.settle()
	}
	return got
}

// oneEngine fails the test for every conversation whose turns (from turn
// from on) went to more than one backend.
func (tr *turns) oneEngine(t *testing.T, from int) {
	t.Helper()
	for _, key := range tr.order {
		count := map[string]int{}
		for _, b := range tr.at[key][from:] {
			count[b]++
		}
		if len(count) > 1 {
			t.Errorf("conversation %s split %v:\n%s", key, count, strings.Join(tr.seen[key], "\n"))
		}
	}
}

// load holds n requests open at replica i until the test ends: streams
// decoding (decode) or prompts in their prefill, of chars characters, and
// waits until every replica sees them.
func (rs *replicas) load(ctx context.Context, wg *sync.WaitGroup, i, n int, decode bool, chars int) {
	rs.t.Helper()
	mark := holdPrefill
	if decode {
		mark = holdDecode
	}
	for k := range n {
		rs.held++
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs.rigs[i].hold(ctx, mark+words(fmt.Sprintf("load-%d-%d-%v", i, k, decode), chars))
		}()
	}
	want := int(rs.held)
	rs.waitFor("every replica to see the held requests", func() bool { return rs.fleetInFlight(want) })
}

// TestSyncSessionFreshTurns: three replicas over NATS, local load uneven
// (replica 1 holds two decoding streams, replica 2 a long prompt in its
// prefill); conversations whose turns share only the session key go
// round the replicas.
// Every conversation stays on one engine.
func TestSyncSessionFreshTurns(t *testing.T) {
	rs := newReplicas(t, 3, 3, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	rs.load(ctx, &wg, 1, 2, true, 300)
	rs.load(ctx, &wg, 2, 1, false, 40000)
	rs.settle()

	tr := newTurns()
	for s := range 6 {
		for k := range 9 {
			rs.fresh(tr, fmt.Sprintf("fresh-%d", s), s+k, k)
		}
	}
	tr.oneEngine(t, 0)
}

// TestSyncSessionFreshTurnsOutage: the same conversations before, during
// and after a NATS outage long enough for the replicas to forget each
// other, with uneven cheap load (decoding streams) that each replica sees
// alone while NATS is down: conversations begun before it and conversations
// begun while it lasted stay on one engine throughout. And a conversation
// that one replica moved while NATS was down (its engine loaded past the
// session bound there) is on the moved-to engine at every replica once
// NATS is back: the replicas reconcile to one owner.
func TestSyncSessionFreshTurnsOutage(t *testing.T) {
	rs := newReplicas(t, 3, 3, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	rs.load(ctx, &wg, 1, 1, true, 300)
	rs.load(ctx, &wg, 2, 2, true, 300)
	rs.settle()

	tr := newTurns()
	const moved = "moved"
	for k := range 3 {
		rs.fresh(tr, moved, k, k)
	}
	for s := range 4 {
		for k := range 3 {
			rs.fresh(tr, fmt.Sprintf("before-%d", s), s+k, k)
		}
	}
	rs.settle()

	port := rs.ns.Addr().(*net.TCPAddr).Port
	rs.ns.Shutdown()
	rs.waitPeers(0)

	// Down: each replica sees only its own load.
	for s := range 4 {
		for k := 3; k < 6; k++ {
			rs.fresh(tr, fmt.Sprintf("before-%d", s), s+k, k)
		}
	}
	for s := range 6 {
		for k := range 4 {
			rs.fresh(tr, fmt.Sprintf("during-%d", s), s+k, k)
		}
	}
	// Replica 1 holds a long prompt of the moved conversation in its
	// prefill on the conversation's engine; its next turn there leaves.
	r1 := rs.rigs[1].srv.Fleet()
	own := func() map[string]int64 {
		m := map[string]int64{}
		for _, b := range r1.Snapshot().All {
			m[b.Name] = b.OwnLoad().InFlight
		}
		return m
	}
	before := own() // replica 1's decoding stream is among them
	rs.held++       // settle waits for every request but this one
	hctx, hcancel := context.WithCancel(ctx)
	held := make(chan struct{})
	go func() {
		defer close(held)
		postHeld(hctx, rs.rigs[1].base, moved, holdPrefill+words("moved-held", 40000))
	}()
	home := ""
	rs.waitFor("replica 1 to hold the moved conversation's long prompt", func() bool {
		for name, n := range own() {
			if n == before[name]+1 {
				home = name
			}
		}
		return home != ""
	})
	to := rs.fresh(tr, moved, 1, 3)
	hcancel()
	<-held
	rs.waitFor("replica 1's long prompt to end", func() bool { return own()[home] == before[home] })
	rs.held--
	if to == home {
		t.Fatalf("replica 1 kept the moved conversation on %s behind a long prompt: the test did not move it", home)
	}
	if got := rs.fresh(tr, moved, 1, 4); got != to {
		t.Errorf("replica 1 sent the moved conversation's next turn to %s, its last to %s", got, to)
	}
	movedFrom := len(tr.at[moved])

	rs.ns = natsServer(t, port)
	rs.waitFor("every replica to reconnect", func() bool {
		for i := range rs.rigs {
			if !rs.link(i).Connected() {
				return false
			}
		}
		return true
	})
	rs.waitPeers(2)
	for s := range 4 {
		for k := 6; k < 9; k++ {
			rs.fresh(tr, fmt.Sprintf("before-%d", s), s+k, k)
		}
	}
	for s := range 6 {
		for k := 4; k < 7; k++ {
			rs.fresh(tr, fmt.Sprintf("during-%d", s), s+k, k)
		}
	}
	for k := 5; k < 11; k++ {
		if got := rs.fresh(tr, moved, k, k); got != to {
			rs.skipIfCaughtUpLate(fmt.Sprintf("moved conversation's turn %d went to %s", k, got))
			t.Errorf("after NATS returned, the moved conversation's turn %d (replica %d) went to %s; replica 1 moved it to %s", k, k%3, got, to)
		}
	}
	// The moved conversation is checked from its move on; the others
	// throughout.
	movedTurns := tr.at[moved]
	delete(tr.at, moved)
	tr.order = tr.order[1:]
	tr.oneEngine(t, 0)
	if c := countOf(movedTurns[movedFrom-2:]); len(c) > 1 {
		t.Errorf("moved conversation split %v after its move:\n%s", c, strings.Join(tr.seen[moved], "\n"))
	}
}

func countOf(bs []string) map[string]int {
	c := map[string]int{}
	for _, b := range bs {
		c[b]++
	}
	return c
}

// postHeld posts a streamed prompt with session key to base and reads the
// answer until ctx ends.
func postHeld(ctx context.Context, base, session, prompt string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("shared", true, prompt)))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
}
