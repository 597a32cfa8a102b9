package server

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// TestRestartKeys: what Reload applies is not reported as needing a
// restart, what it does not apply is, by its top-level key.
func TestRestartKeys(t *testing.T) {
	old := config.Default()
	old.Backends = []config.Backend{{URL: "http://127.0.0.1:1"}}
	tests := []struct {
		name string
		mod  func(*config.Config)
		want []string
	}{
		{"unchanged", func(*config.Config) {}, nil},
		{"applied", func(c *config.Config) {
			c.Backends = append(c.Backends, config.Backend{URL: "http://127.0.0.1:2"})
			c.Policy = "round-robin"
			c.Admin.Token = "new"
			c.Admission.KeyPriorities = []config.KeyPriority{{Key: "k", Priority: 1}}
		}, nil},
		{"listen", func(c *config.Config) { c.Listen = "127.0.0.1:1" }, []string{"listen"}},
		{"a section partly applied", func(c *config.Config) { c.Admin.Decisions = 7; c.Sync.Heartbeat = time.Minute }, []string{"admin", "sync"}},
	}
	for _, tt := range tests {
		next := *old
		next.Backends = slices.Clone(old.Backends)
		tt.mod(&next)
		if got := restartKeys(old, &next); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestReloadFirstPrefillRole: a reload that gives a fleet that could not
// split requests its first prefill engine is refused (the role filter is
// built at startup; without it the prefill engine would take whole
// requests), and the configuration in force keeps serving.
func TestReloadFirstPrefillRole(t *testing.T) {
	cfg := config.Default()
	cfg.Backends = []config.Backend{{URL: "http://127.0.0.1:1", Name: "a", Models: []string{"m"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	next := *cfg
	next.Backends = append(slices.Clone(cfg.Backends), config.Backend{URL: "http://127.0.0.1:2", Name: "p", Models: []string{"m"}, Role: config.RolePrefill})
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(&next); err == nil || len(s.Fleet().Snapshot().All) != 1 {
		t.Errorf("reload to a first prefill engine: error %v, %d backends: want refused, the old fleet kept", err, len(s.Fleet().Snapshot().All))
	}
}
