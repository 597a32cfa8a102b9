package soak

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// script writes an executable shell script that stands for kvroute.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvroute")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStartRouter: the router's address is read from its "listening" log
// line, every line it writes goes to its log file, and its exit is
// reported.
func TestStartRouter(t *testing.T) {
	exe := script(t, `echo "level=INFO msg=\"kv events\" addr=wrong" >&2
echo "level=INFO msg=listening addr=127.0.0.1:4321 tls=false" >&2
exec sleep 60
`)
	log := filepath.Join(t.TempDir(), "router.log")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd, addr, exited, err := startRouter(ctx, exe, "cfg.yaml", log)
	if err != nil {
		t.Fatal(err)
	}
	if addr != "127.0.0.1:4321" {
		t.Errorf("address %q, want 127.0.0.1:4321", addr)
	}
	cancel() // kills the child
	if werr := <-exited; werr == nil {
		t.Error("a killed router reported a clean exit")
	}
	_ = cmd
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "msg=listening") || !strings.Contains(string(b), "addr=wrong") {
		t.Errorf("router log misses lines:\n%s", b)
	}
}

// TestStartRouterExitsEarly: a router that exits before it listens is an
// error naming its log.
func TestStartRouterExitsEarly(t *testing.T) {
	exe := script(t, "echo 'level=ERROR msg=start err=boom' >&2\nexit 1\n")
	log := filepath.Join(t.TempDir(), "router.log")
	_, _, _, err := startRouter(context.Background(), exe, "cfg.yaml", log)
	if err == nil || !strings.Contains(err.Error(), "exited before listening") || !strings.Contains(err.Error(), log) {
		t.Errorf("error %v, want one saying it exited before listening, naming %s", err, log)
	}
}
