package monitor

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// TestLongQueueAvoided: a backend whose vLLM metrics report a long queue,
// put there by someone other than this router, gets no traffic from the
// kvroute policy while the report is fresh, and gets its share again once
// its metrics fail and the report goes stale. The control phase, before
// the monitor runs, shows that without the engine's report the two
// backends share the traffic.
func TestLongQueueAvoided(t *testing.T) {
	busy := newEngine(t, vllmMetrics(0, 50, 0.9, 16, 27000))
	// The idle engine reports a tiny cache: 8 blocks of 16 tokens is 8
	// router blocks of 64 characters, which the prefix index must adopt.
	idle := newEngine(t, vllmMetrics(0, 0, 0.05, 16, 8))

	f := fleet.New()
	for _, s := range []string{busy.URL, idle.URL} {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		f.Add(u.Host, u, nil)
	}
	p, err := policy.New("kvroute", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.New(f, p, scheduler.Config{BlockChars: 64})
	snap := f.Snapshot()
	busyB, idleB := snap.All[0], snap.All[1]

	// route sends n requests of distinct 4,000-character prompts (no
	// prefix to share), each finishing before the next, and counts where
	// they went.
	seq := 0
	route := func(n int) [2]int {
		t.Helper()
		var got [2]int
		for range n {
			seq++
			prompt := fmt.Sprintf("request %d: ", seq) + strings.Repeat("lorem ipsum ", 333)
			v := &request.View{Kind: request.Completion, Model: "m", Prompt: prompt, PromptTokens: request.EstimateTokens(prompt), MaxTokens: 64}
			now := time.Now()
			a, err := sched.Route(v, nil, now)
			if err != nil {
				t.Fatal(err)
			}
			got[a.Backend.ID]++
			a.FirstByte(now)
			a.Done(now)
		}
		return got
	}

	const n = 40
	if got := route(n); got[busyB.ID] == 0 || got[idleB.ID] == 0 {
		t.Fatalf("control without engine reports: %v, want both backends used", got)
	}

	cfg := fastConfig()
	cfg.Interval = 10 * time.Millisecond
	cfg.SetCapacity = sched.SetKVCapacity
	m := New(f, cfg, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "both engine reports", func() bool {
		return busyB.Engine() != nil && idleB.Engine() != nil && idleB.Engine().KVBlocks == 8
	})

	if got := route(n); got[busyB.ID] != 0 {
		t.Fatalf("with the busy engine's queue of 50 reported: %v, want none on backend %d", got, busyB.ID)
	}
	if l := sched.Index().Len(idleB.ID); l > 8 {
		t.Fatalf("idle backend holds %d prefix blocks, beyond the 8 its engine reported", l)
	}

	busy.status.Store(http.StatusInternalServerError)
	waitFor(t, "busy report stale", func() bool { return busyB.Engine() == nil })
	if got := route(n); got[busyB.ID] == 0 {
		t.Fatalf("after the busy engine's report went stale: %v, want it used again", got)
	}
}
