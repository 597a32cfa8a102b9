package bench

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestAgentLoops runs the coding-agent sessions against an emulated
// engine in each API: every turn waits for its previous one, a Responses
// turn continues the stored response by its id (the engine answers 404
// otherwise), and the later turns reuse the earlier ones' cache.
func TestAgentLoops(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"coding-agent", "coding-agent-responses", "coding-agent-messages"} {
		t.Run(name, func(t *testing.T) {
			em, err := emulator.New(emulator.Config{Preset: p, TimeScale: 50})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(em.Handler())
			defer func() { srv.CloseClientConnections(); _ = em.Close(); srv.Close() }()
			reqs, err := workload.Load(name, workload.Options{Limit: 2, Rate: 100, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				reqs[i].At /= 1000 // the turns' think time, compressed
			}
			run, err := Run(context.Background(), Config{Target: srv.URL, Requests: reqs})
			if err != nil {
				t.Fatal(err)
			}
			cached := 0
			for i, s := range run.Samples {
				if s.Err != "" || s.PromptTokens == 0 || s.OutputTokens == 0 {
					t.Fatalf("request %d: %+v", i, s)
				}
				if a := reqs[i].After; a > 0 {
					cached += s.CachedTokens
					if s.PromptTokens <= run.Samples[a-1].PromptTokens {
						t.Fatalf("turn %d's prompt (%d tokens) does not hold its previous turn's (%d)", i, s.PromptTokens, run.Samples[a-1].PromptTokens)
					}
				}
			}
			if cached == 0 {
				t.Fatal("the later turns reused nothing of the earlier ones")
			}
		})
	}
}
