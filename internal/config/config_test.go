package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/scheduler"
)

// parse is a fixture: it parses yaml and fails the test on error.
func parse(t *testing.T, y string) *Config {
	t.Helper()
	c, err := Parse([]byte(y))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestDefaults(t *testing.T) {
	c := parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\n")
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", c.Listen, "127.0.0.1:8080"},
		{"policy", c.Policy, "kvroute"},
		{"session.header", c.Session.Header, "X-Session-ID"},
		{"session.body_field", c.Session.BodyField, ""},
		{"limits.max_body_bytes", c.Limits.MaxBodyBytes, ByteSize(32 << 20)},
		{"prefix.block_chars", c.Prefix.BlockChars, 64},
		{"prefix.capacity_blocks", c.Prefix.CapacityBlocks, 100000},
		{"health.interval", c.Health.Interval, 5 * time.Second},
		{"health.timeout", c.Health.Timeout, 2 * time.Second},
		{"health.path", c.Health.Path, "/health"},
		{"health.eject_after", c.Health.EjectAfter, 3},
		{"retry.attempts", c.Retry.Attempts, 2},
		{"upstream.connect_timeout", c.Upstream.ConnectTimeout, 5 * time.Second},
		{"upstream.response_header_timeout", c.Upstream.ResponseHeaderTimeout, 10 * time.Minute},
		{"upstream.discover_models", c.Upstream.DiscoverModels, true},
		{"log.level", c.Log.Level, "info"},
		{"log.format", c.Log.Format, "text"},
		{"log.access", c.Log.Access, true},
		{"shutdown_grace", c.ShutdownGrace, 30 * time.Second},
		{"backends[0].name", firstEntry(t, c).Name, "127.0.0.1:9000"},
		{"backends[0].kind", c.Backends[0].Kind, ""},
		{"engines.enabled", c.Engines.Enabled, true},
		{"engines.interval", c.Engines.Interval, 250 * time.Millisecond},
		{"engines.timeout", c.Engines.Timeout, time.Second},
		{"engines.stale_after", c.Engines.StaleAfter, 4},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

// The probe interval reaches the scheduler as it takes it: the default,
// a value of its own, or off.
func TestProbeInterval(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", scheduler.DefaultProbeInterval},
		{"policy_options: {probe_interval: 20s}", 20 * time.Second},
		{"policy_options: {probe_interval: 0s}", -1},
	} {
		if got := parse(t, tc.yaml).PolicyOptions.Probes(); got != tc.want {
			t.Errorf("%q: scheduler's probe interval %v, want %v", tc.yaml, got, tc.want)
		}
	}
}

func TestParseValues(t *testing.T) {
	c := parse(t, `
listen: 0.0.0.0:9999
policy: round-robin
backends:
  - url: http://a:8000/
    name: gpu-a
    models: [llama]
    kind: sglang
engines: {enabled: false, interval: 100ms, timeout: 300ms, stale_after: 2}
session: {header: X-Conv, body_field: user}
limits: {max_body_bytes: 1MiB}
prefix: {block_chars: 32, capacity_blocks: 500}
health: {interval: 1s, timeout: 500ms, path: /ping, eject_after: 5}
retry: {attempts: 0}
upstream: {connect_timeout: 1s, response_header_timeout: 0s, discover_models: false}
log: {level: debug, format: json, access: false}
shutdown_grace: 3s
`)
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.Listen != "0.0.0.0:9999" || c.Policy != "round-robin" || firstEntry(t, c).Name != "gpu-a" ||
		c.Backends[0].Models[0] != "llama" || c.Session.Header != "X-Conv" || c.Session.BodyField != "user" ||
		c.Limits.MaxBodyBytes != 1<<20 || c.Prefix.BlockChars != 32 || c.Prefix.CapacityBlocks != 500 ||
		c.Health.Interval != time.Second || c.Health.Timeout != 500*time.Millisecond || c.Health.Path != "/ping" ||
		c.Health.EjectAfter != 5 || c.Retry.Attempts != 0 || c.Upstream.ConnectTimeout != time.Second ||
		c.Upstream.ResponseHeaderTimeout != 0 || c.Upstream.DiscoverModels || c.Log.Level != "debug" ||
		c.Log.Format != "json" || c.Log.Access || c.ShutdownGrace != 3*time.Second || c.Backends[0].Kind != "sglang" ||
		c.Engines.Enabled || c.Engines.Interval != 100*time.Millisecond || c.Engines.Timeout != 300*time.Millisecond ||
		c.Engines.StaleAfter != 2 {
		t.Errorf("values not decoded as written: %+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown top-level key", "backends: [{url: 'http://a:1'}]\nlisten_addr: x\n", []string{"line 2", "unknown key listen_addr"}},
		{"unknown nested key", "health:\n  intervall: 3s\n", []string{"line 2", "unknown key intervall"}},
		{"unknown backend key", "backends:\n  - url: http://a:1\n    weight: 3\n", []string{"line 3", "unknown key weight"}},
		{"bad duration", "health: {interval: soon}\n", []string{"soon"}},
		{"bad size", "limits: {max_body_bytes: lots}\n", []string{"line 1", "bad size \"lots\""}},
		{"two documents", "listen: a:1\n---\nlisten: b:2\n", []string{"more than one YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"no backends", "", "backends: none configured"},
		{"ftp scheme", "backends: [{url: 'ftp://a:1'}]", "scheme must be http or https"},
		{"no scheme", "backends: [{url: 'a:1'}]", "has no scheme; write http://a:1"},
		{"no host", "backends: [{url: 'http:///v1'}]", "no host"},
		{"query", "backends: [{url: 'http://a:1?x=1'}]", "takes no query"},
		{"duplicate url", "backends: [{url: 'http://a:1'}, {url: 'http://a:1/'}]", "is also backends[0]"},
		{"duplicate name", "backends: [{url: 'http://a:1', name: x}, {url: 'http://b:1', name: x}]", "is also the name of backends[0]"},
		{"unknown policy", "policy: nope\nbackends: [{url: 'http://a:1'}]", "unknown policy \"nope\""},
		{"zero body limit", "limits: {max_body_bytes: 0}\nbackends: [{url: 'http://a:1'}]", "limits.max_body_bytes"},
		{"zero block", "prefix: {block_chars: 0}\nbackends: [{url: 'http://a:1'}]", "prefix.block_chars"},
		{"negative capacity", "prefix: {capacity_blocks: -1}\nbackends: [{url: 'http://a:1'}]", "prefix.capacity_blocks"},
		{"zero interval", "health: {interval: 0s}\nbackends: [{url: 'http://a:1'}]", "health.interval"},
		{"relative path", "health: {path: health}\nbackends: [{url: 'http://a:1'}]", "health.path"},
		{"zero eject", "health: {eject_after: 0}\nbackends: [{url: 'http://a:1'}]", "health.eject_after"},
		{"negative retry", "retry: {attempts: -1}\nbackends: [{url: 'http://a:1'}]", "retry.attempts"},
		{"bad level", "log: {level: loud}\nbackends: [{url: 'http://a:1'}]", "log.level"},
		{"bad format", "log: {format: xml}\nbackends: [{url: 'http://a:1'}]", "log.format"},
		{"unknown engine kind", "backends: [{url: 'http://a:1', kind: triton}]", "backends[0].kind: unknown engine kind \"triton\""},
		{"zero engine interval", "engines: {interval: 0s}\nbackends: [{url: 'http://a:1'}]", "engines.interval"},
		{"engine interval beyond report age", "engines: {interval: 5s}\nbackends: [{url: 'http://a:1'}]", "engines.interval: 5s must be positive and below 3s"},
		{"zero engine timeout", "engines: {timeout: 0s}\nbackends: [{url: 'http://a:1'}]", "engines.timeout"},
		{"zero stale_after", "engines: {stale_after: 0}\nbackends: [{url: 'http://a:1'}]", "engines.stale_after"},
		{"low load factor", "policy_options: {load_factor: 0.5}\nbackends: [{url: 'http://a:1'}]", "load_factor"},
		{"negative probe interval", "policy_options: {probe_interval: -1s}\nbackends: [{url: 'http://a:1'}]", "policy_options.probe_interval: -1s must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parse(t, tt.yaml).Validate()
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestOverrides(t *testing.T) {
	tests := []struct {
		name         string
		o            Overrides
		wantListen   string
		wantPolicy   string
		wantBackends []string
	}{
		{"none", Overrides{}, "10.0.0.1:80", "prefix", []string{"http://file:1"}},
		{"listen", Overrides{Listen: ":9"}, ":9", "prefix", []string{"http://file:1"}},
		{"policy", Overrides{Policy: "random"}, "10.0.0.1:80", "random", []string{"http://file:1"}},
		{"backends replace the file's", Overrides{Backends: []string{"http://x:1", "http://y:2"}}, "10.0.0.1:80", "prefix", []string{"http://x:1", "http://y:2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parse(t, "listen: 10.0.0.1:80\npolicy: prefix\nbackends: [{url: 'http://file:1', name: f}]\n")
			c.Apply(tt.o)
			if c.Listen != tt.wantListen || c.Policy != tt.wantPolicy {
				t.Errorf("listen, policy = %q, %q; want %q, %q", c.Listen, c.Policy, tt.wantListen, tt.wantPolicy)
			}
			var got []string
			for _, b := range c.Backends {
				got = append(got, b.URL)
			}
			if strings.Join(got, ",") != strings.Join(tt.wantBackends, ",") {
				t.Errorf("backends = %v, want %v", got, tt.wantBackends)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1024", 1024, true}, {"32MiB", 32 << 20, true}, {"2 KiB", 2048, true},
		{"1GB", 1e9, true}, {"10B", 10, true}, {"-1", 0, false}, {"MiB", 0, false},
		{"1.5MiB", 0, false}, {"99999999999GiB", 0, false},
	}
	for _, tt := range tests {
		got, err := parseByteSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(p, []byte("backends: [{url: 'http://a:1'}]\nbogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "unknown key bogus") {
		t.Errorf("Load error = %v; want the file name and the unknown key", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("Load of a missing file: no error")
	}
}

// The example config shipped in examples/ must stay valid.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../../examples/kvroute.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestHumanErrors: the slips a first config makes get a sentence that says
// what to write, not the URL or YAML library's words.
func TestHumanErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want, not string
	}{
		{"backend without scheme", "backends: [{url: '127.0.0.1:8000'}]", `"127.0.0.1:8000" has no scheme; write http://127.0.0.1:8000`, "first path segment"},
		{"host without scheme", "backends: [{url: 'localhost:8000'}]", "has no scheme; write http://localhost:8000", "scheme must be"},
		{"duration as a bare int", "admission: {max_wait: 30}\nbackends: [{url: 'http://a:1'}]", "line 1: a number `30` is not a duration; use a duration such as 30s", "!!int"},
		{"list for a string", "listen: [a]\nbackends: [{url: 'http://a:1'}]", "line 1: a list where a string is expected", "!!seq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
				t.Errorf("error %v, want one containing %q and not %q", err, tc.want, tc.not)
			}
		})
	}
}

// TestCheckReadsOutside: Check fails on what Validate cannot see, the
// environment and the files the config names.
func TestCheckReadsOutside(t *testing.T) {
	c, err := Parse([]byte("backends: [{url: 'https://a:1', tls: {ca_file: /nonexistent/ca.pem}}]\nlisten_tls: {cert_file: /nonexistent/c.pem, key_file: /nonexistent/k.pem}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	err = c.Check()
	for _, want := range []string{"backends[0].tls.ca_file", "listen_tls"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check: %v, want it to name %s", err, want)
		}
	}
	t.Setenv(AdminTokenEnv, "short")
	c, _ = Parse([]byte("backends: [{url: 'http://a:1'}]"))
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), AdminTokenEnv) {
		t.Errorf("Check with a short %s: %v", AdminTokenEnv, err)
	}
	t.Setenv(AdminTokenEnv, "")
	t.Setenv(SyncKeyEnv, "short")
	c, _ = Parse([]byte("backends: [{url: 'http://a:1'}]\nsync: {url: 'nats://a:4222', replica_id: r-1}"))
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), SyncKeyEnv) {
		t.Errorf("Check with a short %s and sync on: %v", SyncKeyEnv, err)
	}
}
