package config

import (
	"strings"
	"testing"
)

// TestDidYouMean: an unknown key gets the nearest known key of its own
// mapping when it is a likely typo, and no guess when nothing is near.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		yaml, want string // want "" for no guess
	}{
		{"polcy: kvroute", "unknown key polcy (did you mean policy?)"},
		{"lsiten: 127.0.0.1:8080", "unknown key lsiten (did you mean listen?)"},
		{"health: {intervall: 5s}", "unknown key intervall (did you mean interval?)"},
		{"admission: {max_wiat: 5s}", "unknown key max_wiat (did you mean max_wait?)"},
		{"backends: [{url: 'http://a:1', modles: [m]}]", "unknown key modles (did you mean models?)"},
		{"backends: [{url: 'http://a:1', role: decode, kv_event: 'tcp://a:5557'}]", "unknown key kv_event (did you mean kv_events?)"},
		{"sync: {tls: {ca_fle: x}}", "unknown key ca_fle (did you mean ca_file?)"},
		{"disagregation: {split: always}", "unknown key disagregation (did you mean disaggregation?)"},
		{"frobnicate: 1", ""},
		{"max_wait: 30s", ""}, // admission's key, not a typo of a top-level one
		{"health: {xy: 1}", ""},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil {
			t.Errorf("%s: no error", tc.yaml)
			continue
		}
		msg := err.Error()
		if tc.want == "" {
			if strings.Contains(msg, "did you mean") {
				t.Errorf("%s: %q, want no guess", tc.yaml, msg)
			}
			continue
		}
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %q, want %q", tc.yaml, msg, tc.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"listen", "listen", 0},
		{"lsiten", "listen", 1}, {"intervall", "interval", 1}, {"polcy", "policy", 1},
		{"kitten", "sitting", 3}, {"ab", "ba", 1}, {"abc", "ca", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.b, tc.a, got, tc.want)
		}
	}
}
