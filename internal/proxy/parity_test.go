package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
)

// TestHashParity: when an emulated engine's KV event stream begins, the
// router checks its block keys against the engine's for a known prompt:
// kvroute_kv_hash_parity is 1 when the router's block size is the
// engine's, and 0, with the cause in the log, when it is not.
func TestHashParity(t *testing.T) {
	for _, tt := range []struct {
		name        string
		blockTokens int
		want        string
	}{
		{"matching block size", engine.BlockSize, "1"},
		{"router keys blocks twice the engine's", 2 * engine.BlockSize, "0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newKVEngine(t, "e0")
			r, log := newLoggedRig(t, 0, func(c *config.Config) {
				c.Backends = append(c.Backends, config.Backend{URL: e.srv.URL, Name: e.name, KVEvents: "tcp://" + e.em.KVEventsAddr().String()})
				c.KVEvents.BlockTokens = tt.blockTokens
			})
			want := `kvroute_kv_hash_parity{backend="e0"} ` + tt.want
			clock := clocktest.Start(t)
			defer clock.Stop()
			n := 0
			last := time.Time{}
			ok := clock.Until(10*time.Second, func() bool {
				// The engine's stream starts with its first batch: warm it
				// directly until the check has run.
				if time.Since(last) > 100*time.Millisecond {
					n++
					resp, err := http.Post(e.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat("shared", false, words(fmt.Sprintf("warm-%d", n), 256))))
					if err == nil {
						resp.Body.Close()
					}
					last = time.Now()
				}
				return strings.Contains(string(r.get("/metrics").body), want)
			})
			if !ok {
				t.Fatalf("/metrics never showed %s (%s)\n%s", want, clock, grepLog(log.String(), "parity"))
			}
			if tt.want == "0" && !strings.Contains(log.String(), `"cause":"block_size"`) {
				t.Errorf("the mismatch's log does not name the block size:\n%s", log.String())
			}
		})
	}
}

// grepLog is the lines of log that contain s.
func grepLog(log, s string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
