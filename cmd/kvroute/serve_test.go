package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/server"
)

// serveLoader parses args as serve does (flags, then the environment)
// and returns its config loader.
func serveLoader(t *testing.T, args ...string) func() (*config.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	load := configFlags(fs)
	if code, ok := parseConfigFlags(fs, args); !ok {
		t.Fatalf("parse %v: code %d", args, code)
	}
	return load
}

// TestValidateRunsServeChecks: an admin token under 16 characters from the
// environment stops serve from starting; validate, which runs the same
// loader, says so and exits 1.
func TestValidateRunsServeChecks(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(file, []byte("backends: [{url: 'http://127.0.0.1:8000'}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"validate", "--config", file}); code != 0 {
		t.Fatalf("validate of a good config: exit %d", code)
	}
	t.Setenv(config.AdminTokenEnv, "short")
	_, err := serveLoader(t, "--config", file)()
	if err == nil || !strings.Contains(err.Error(), config.AdminTokenEnv) || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("serve's loader with a short %s: %v", config.AdminTokenEnv, err)
	}
	if code := run([]string{"validate", "--config", file}); code != 1 {
		t.Errorf("validate with a short %s: exit %d, want 1", config.AdminTokenEnv, code)
	}
}

// TestEnvOverrides: KVROUTE_* variables set serve's flags the command line
// left out; a flag given explicitly wins over its variable, and both win
// over the file.
func TestEnvOverrides(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:7000\npolicy: random\nbackends: [{url: 'http://127.0.0.1:8000'}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVROUTE_CONFIG", file)
	t.Setenv("KVROUTE_BACKEND", "http://10.0.0.1:8000, http://10.0.0.2:8000")
	t.Setenv("KVROUTE_LISTEN", "0.0.0.0:9000")
	t.Setenv("KVROUTE_POLICY", "least-request")
	t.Setenv("KVROUTE_LOG_FORMAT", "json")
	t.Setenv("KVROUTE_LOG_LEVEL", "debug")
	c, err := serveLoader(t, "--policy", "round-robin")()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 2 || c.Backends[0].URL != "http://10.0.0.1:8000" || c.Backends[1].URL != "http://10.0.0.2:8000" {
		t.Errorf("backends %+v, want KVROUTE_BACKEND's two", c.Backends)
	}
	if c.Listen != "0.0.0.0:9000" {
		t.Errorf("listen %q, want KVROUTE_LISTEN's over the file's", c.Listen)
	}
	if c.Policy != "round-robin" {
		t.Errorf("policy %q, want the flag's over KVROUTE_POLICY", c.Policy)
	}
	if c.Log.Format != "json" || c.Log.Level != "debug" {
		t.Errorf("log %+v, want KVROUTE_LOG_FORMAT and KVROUTE_LOG_LEVEL", c.Log)
	}
	t.Setenv("KVROUTE_LOG_FORMAT", "xml")
	if _, err := serveLoader(t)(); err == nil || !strings.Contains(err.Error(), "log.format") {
		t.Errorf("KVROUTE_LOG_FORMAT=xml: %v", err)
	}
}

// TestLogFlags: --log-level and --log-format set the log section.
func TestLogFlags(t *testing.T) {
	c, err := serveLoader(t, "--backend", "http://127.0.0.1:8000", "--log-level", "warn", "--log-format", "json")()
	if err != nil {
		t.Fatal(err)
	}
	if c.Log.Level != "warn" || c.Log.Format != "json" {
		t.Errorf("log %+v", c.Log)
	}
}

// TestHelpShowsDoubleDash: -h lists flags as the usage line writes them.
func TestHelpShowsDoubleDash(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configFlags(fs)
	var b strings.Builder
	fs.SetOutput(&b)
	printDefaults(fs)
	out := b.String()
	for _, f := range []string{"--backend", "--listen", "--log-level", "--log-format"} {
		if !strings.Contains(out, "\n  "+f+" ") && !strings.HasPrefix(out, "  "+f+" ") {
			t.Errorf("help does not list %s:\n%s", f, out)
		}
	}
	if strings.Contains(out, "\n  -backend") || strings.HasPrefix(out, "  -backend") {
		t.Errorf("help lists -backend with one dash:\n%s", out)
	}
}

// TestReloadWatchesCertFiles: a renewed listener certificate (the files
// rewritten in place, as kubelet does for a cert-manager Secret) reloads
// the router as a changed config file does.
func TestReloadWatchesCertFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Backends = []config.Backend{{URL: "http://127.0.0.1:1"}}
	cfg.Upstream.DiscoverModels = false
	cfg.ListenTLS = config.ListenTLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	for _, f := range []string{cfg.ListenTLS.CertFile, cfg.ListenTLS.KeyFile} {
		if err := os.WriteFile(f, []byte("v0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plain := config.Default() // the router itself serves plain HTTP: only its reload is driven
	plain.Backends, plain.Upstream.DiscoverModels = cfg.Backends, false
	srv, err := server.New(plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	loads := make(chan struct{}, 100)
	load := func() (*config.Config, error) {
		loads <- struct{}{}
		return nil, errors.New("not applied in this test")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go watchReloads(ctx, watchedFiles("", cfg), time.Millisecond, srv, load, slog.New(slog.DiscardHandler))
	// Rewrite the certificate until the watcher, which may not have read
	// it yet, sees a change: bounded in rewrites, not in time.
	for i := 1; ; i++ {
		if err := os.WriteFile(cfg.ListenTLS.CertFile, []byte(fmt.Sprint("v", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-loads:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if i == 1000 {
			t.Fatal("1000 rewrites of the listener's certificate and no reload")
		}
	}
}
