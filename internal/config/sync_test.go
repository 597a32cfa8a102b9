package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSyncSection(t *testing.T) {
	c := parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\n")
	if c.Sync.Enabled() || c.Sync.Subject != "kvroute" || c.Sync.Heartbeat != time.Second ||
		c.Sync.PeerTimeout != 5*time.Second || c.Sync.QueueSize != 16384 || c.Sync.FlushInterval != 0 || c.Sync.MaxPeers != 64 || c.Sync.KeyFile != "" {
		t.Errorf("sync defaults: %+v", c.Sync)
	}
	c.Apply(Overrides{Sync: "nats://127.0.0.1:4222"})
	if !c.Sync.Enabled() || c.Validate() != nil {
		t.Errorf("--sync: %+v, %v", c.Sync, c.Validate())
	}
	cases := []struct{ yaml, want string }{
		{"sync: {url: 'nats://a:4222,tls://b:4222', replica_id: r-1, user: u, password: p, tls: {ca_file: ca.pem, cert_file: c.pem, key_file: k.pem}}", ""},
		{"sync: {url: 'http://a:4222'}", "sync.url"},
		{"sync: {url: 'nats://'}", "sync.url"},
		{"sync: {url: 'nats://a:4222', subject: 'a.*'}", "sync.subject"},
		{"sync: {url: 'nats://a:4222', subject: 'a..b'}", "sync.subject"},
		{"sync: {url: 'nats://a:4222', replica_id: 'a.b'}", "sync.replica_id"},
		{"sync: {url: 'nats://a:4222', token: t, user: u}", "sync.token"},
		{"sync: {url: 'nats://a:4222', password: p}", "sync.password"},
		{"sync: {url: 'nats://a:4222', tls: {cert_file: c.pem}}", "sync.tls"},
		{"sync: {url: 'nats://a:4222', heartbeat: 0s}", "sync.heartbeat"},
		{"sync: {url: 'nats://a:4222', heartbeat: 1s, peer_timeout: 1s}", "sync.peer_timeout"},
		{"sync: {url: 'nats://a:4222', flush_interval: -1ms}", "sync.flush_interval"},
		{"sync: {url: 'nats://a:4222', queue_size: 0}", "sync.queue_size"},
		{"sync: {url: 'nats://a:4222', max_peers: 0}", "sync.max_peers"},
		{"sync: {url: 'nats://a:4222', heartbeats: 1s}", "unknown key heartbeats"},
		// Off, the rest is not checked.
		{"sync: {heartbeat: 0s}", ""},
	}
	for _, tc := range cases {
		err := validateYAML("backends: [{url: http://127.0.0.1:1}]\n" + tc.yaml)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// validateYAML parses and validates y; Validate must not change the config.
func validateYAML(y string) error {
	c, err := Parse([]byte(y))
	if err != nil {
		return err
	}
	before := c.Sync
	err = c.Validate()
	if c.Sync != before {
		panic("Validate changed the sync section")
	}
	return err
}

// The shared key comes from KVROUTE_SYNC_KEY, else sync.key_file; a short
// or empty one is an error, none is no key.
func TestSyncKey(t *testing.T) {
	dir := t.TempDir()
	file := func(content string) string {
		p := filepath.Join(dir, "key"+content[:min(len(content), 3)])
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := strings.Repeat("k", MinSyncKeyLen)
	cases := []struct {
		name, env, file string
		want, wantErr   string
	}{
		{name: "none"},
		{name: "file", file: file(long + "\n"), want: long},
		{name: "env wins", env: long + "e", file: file(long), want: long + "e"},
		{name: "short file", file: file("short"), wantErr: "at least 32"},
		{name: "short env", env: "short", wantErr: "KVROUTE_SYNC_KEY"},
		{name: "empty file", file: file(" \n"), wantErr: "is empty"},
		{name: "missing file", file: filepath.Join(dir, "nope"), wantErr: "sync.key_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(SyncKeyEnv, tc.env)
			s := Sync{KeyFile: tc.file}
			k, err := s.ResolveKey()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(k) != tc.want {
				t.Fatalf("key %q, %v; want %q", k, err, tc.want)
			}
		})
	}
}
