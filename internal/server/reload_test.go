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
