package config

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLimitsAndAuthValidation(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"defaults", "", ""},
		{"all set", "limits: {max_header_bytes: 64KiB, max_messages: 10, read_header_timeout: 1s, body_timeout: 2s, reject_over_context: false}\nauth: {exempt: [/healthz]}", ""},
		{"zero messages", "limits: {max_messages: 0}", "limits.max_messages"},
		{"zero header timeout", "limits: {read_header_timeout: 0s}", "limits.read_header_timeout"},
		{"negative body timeout", "limits: {body_timeout: -1s}", "limits.body_timeout"},
		{"zero header bytes", "limits: {max_header_bytes: 0}", "limits.max_header_bytes"},
		{"relative exempt", "auth: {exempt: [healthz]}", "auth.exempt[0]"},
		{"unknown auth key", "auth: {api_key: x}", "unknown key api_key"},
		{"budget and bound set", "limits: {max_buffered_bytes: 1GiB, max_bytes_per_token: 64}", ""},
		{"budget below a body", "limits: {max_body_bytes: 32MiB, max_buffered_bytes: 1MiB}", "limits.max_buffered_bytes"},
		{"zero bytes a token", "limits: {max_bytes_per_token: 0}", "limits.max_bytes_per_token"},
		{"client limits set", "limits: {max_buffered_bytes_per_client: 64MiB, min_body_rate: 4KiB, body_rate_grace: 2s, max_connections: 1000, idle_timeout: 30s}", ""},
		{"share below a body", "limits: {max_body_bytes: 32MiB, max_buffered_bytes_per_client: 1MiB}", "limits.max_buffered_bytes_per_client"},
		{"negative rate", "limits: {min_body_rate: -1}", "bad size"},
		{"rate off", "limits: {min_body_rate: 0}", ""},
		{"negative grace", "limits: {body_rate_grace: -1s}", "limits.body_rate_grace"},
		{"negative connections", "limits: {max_connections: -1}", "limits.max_connections"},
		{"zero idle timeout", "limits: {idle_timeout: 0s}", "limits.idle_timeout"},
		{"passthrough set", "passthrough: {allow: [POST /v1/embeddings, GET /v1/files]}", ""},
		{"passthrough none", "passthrough: {allow: []}", ""},
		{"passthrough without method", "passthrough: {allow: [/v1/embeddings]}", "passthrough.allow[0]"},
		{"passthrough odd method", "passthrough: {allow: [BREW /v1/embeddings]}", "passthrough.allow[0]"},
		{"passthrough outside v1", "passthrough: {allow: [POST /admin/x]}", "passthrough.allow[0]"},
		{"passthrough encoded", "passthrough: {allow: [POST /v1/a%2Fb]}", "passthrough.allow[0]"},
		{"passthrough prefix", "passthrough: {allow: [POST /v1/audio/]}", "passthrough.allow[0]"},
		{"passthrough completions", "passthrough: {allow: [POST /v1/completions]}", "passthrough.allow[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("backends: [{url: http://127.0.0.1:1}]\n" + tt.yaml))
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

func TestKeyDigests(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	d := sha256.Sum256([]byte("hashed-key"))
	if err := os.WriteFile(file, []byte("# keys\n\nplain-key\n  sha256:"+hex.EncodeToString(d[:])+"  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVROUTE_TEST_KEYS", "env-a, env-b")
	got, err := Auth{APIKeysFile: file, APIKeysEnv: "KVROUTE_TEST_KEYS"}.KeyDigests()
	if err != nil {
		t.Fatal(err)
	}
	want := [][sha256.Size]byte{sha256.Sum256([]byte("plain-key")), d, sha256.Sum256([]byte("env-a")), sha256.Sum256([]byte("env-b"))}
	if len(got) != len(want) {
		t.Fatalf("%d digests, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("digest %d differs", i)
		}
	}
	if ds, err := (Auth{}).KeyDigests(); err != nil || len(ds) != 0 {
		t.Errorf("no keys configured: %d digests, %v", len(ds), err)
	}
	bad := []Auth{
		{APIKeysFile: filepath.Join(dir, "missing")},
		{APIKeysEnv: "KVROUTE_TEST_UNSET_VARIABLE"},
	}
	if err := os.WriteFile(filepath.Join(dir, "short"), []byte("sha256:abcd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad = append(bad, Auth{APIKeysFile: filepath.Join(dir, "short")})
	for _, a := range bad {
		if _, err := a.KeyDigests(); err == nil {
			t.Errorf("%+v: no error", a)
		}
	}
}

// The defaults of the client limits: headers at 64 KiB, a quarter of the
// body budget a client, connections from the descriptor limit.
func TestClientLimitDefaults(t *testing.T) {
	l := Default().Limits
	if l.MaxHeaderBytes != 64<<10 {
		t.Errorf("max_header_bytes %d, want 64KiB", l.MaxHeaderBytes)
	}
	if got, want := l.BufferedBytesPerClient(), l.BufferedBytes()/4; got != want {
		t.Errorf("share %d, want a quarter of %d", got, l.BufferedBytes())
	}
	l.MaxBufferedBytes = l.MaxBodyBytes // one body: the share is all of it
	if got := l.BufferedBytesPerClient(); got != int64(l.MaxBodyBytes) {
		t.Errorf("share of a one-body budget %d, want %d", got, l.MaxBodyBytes)
	}
	for _, tt := range []struct {
		nofile uint64
		want   int
	}{{1 << 20, 1 << 19}, {1024, 512}, {100, MinConnections}, {0, MinConnections}} {
		if got := l.Connections(tt.nofile); got != tt.want {
			t.Errorf("Connections(%d) = %d, want %d", tt.nofile, got, tt.want)
		}
	}
	l.MaxConnections = 10
	if got := l.Connections(1 << 20); got != 10 {
		t.Errorf("configured max_connections: %d", got)
	}
}
