package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
)

// TestMain lets the test binary run as kvroute itself when
// KVROUTE_TEST_MAIN=1, so that tests exercise the real command (signals,
// exit codes) in a child process without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("KVROUTE_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// gatedBackend streams one event at once and the rest when gate closes.
func gatedBackend(t *testing.T, gate chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		ev := `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}` + "\n\n"
		_, _ = io.WriteString(w, ev)
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, ev+"data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// startServe runs `kvroute serve --config` in a child process and returns
// it, its address, and a channel that receives its exit.
func startServe(t *testing.T, config string) (*exec.Cmd, string, <-chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "serve", "--config", path)
	cmd.Env = append(os.Environ(), "KVROUTE_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	addr := make(chan string, 1)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			t.Log(line)
			if strings.Contains(line, "msg=listening") {
				for _, f := range strings.Fields(line) {
					if a, ok := strings.CutPrefix(f, "addr="); ok {
						addr <- a
					}
				}
			}
		}
		exited <- cmd.Wait()
	}()
	select {
	case a := <-addr:
		return cmd, a, exited
	case err := <-exited:
		t.Fatalf("kvroute serve exited before listening: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("kvroute serve did not listen within 10s")
	}
	return nil, "", nil
}

// TestServeGracefulShutdown sends SIGTERM to a kvroute serve process while
// a stream runs through it. It must stop accepting connections at once,
// let the stream finish (exit 0) when it does so within shutdown_grace,
// and otherwise cut it at the end of the grace period (exit 1, the stream
// ends without [DONE]).
func TestServeGracefulShutdown(t *testing.T) {
	tests := []struct {
		name     string
		grace    time.Duration
		finish   bool // the backend finishes the stream during the grace period
		wantCode int
	}{
		{"stream finishes within the grace period", 10 * time.Second, true, 0},
		{"grace period runs out", 500 * time.Millisecond, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := make(chan struct{})
			backend := gatedBackend(t, gate)
			cmd, addr, exited := startServe(t, fmt.Sprintf(`listen: 127.0.0.1:0
shutdown_grace: %v
engines:
  enabled: false
backends:
  - url: %s
    name: b0
`, tt.grace, backend.URL))
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatalf("first event: %v", err)
			}
			clock := clocktest.Start(t)
			signalled := time.Now()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// New connections are refused once the listener is closed.
			for {
				c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
				if err != nil {
					break
				}
				_ = c.Close()
				if took := time.Since(signalled); !clock.Within(t, took, 2*time.Second, "closing the listener") {
					t.Fatalf("still accepting connections %v after SIGTERM (%s)", took, clock)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("connections refused %v after SIGTERM", time.Since(signalled).Round(time.Millisecond))
			select {
			case err := <-exited:
				t.Fatalf("exited (%v) with a stream in flight and grace left", err)
			case <-time.After(min(tt.grace/2, 200*time.Millisecond)):
			}
			if tt.finish {
				close(gate)
			}
			rest, rerr := io.ReadAll(br)
			done := strings.HasSuffix(string(rest), "data: [DONE]\n\n")
			if tt.finish && (rerr != nil || !done) {
				t.Errorf("stream cut by the shutdown: %v %q", rerr, rest)
			}
			if !tt.finish && done {
				t.Errorf("stream ended with [DONE] though the backend never finished it")
			}
			var err2 error
			select {
			case err2 = <-exited:
			case <-time.After(clock.Scale(tt.grace + 5*time.Second)):
				t.Fatalf("kvroute serve still running after the grace period (%s)", clock)
			}
			code := 0
			if ee, ok := errors.AsType[*exec.ExitError](err2); ok {
				code = ee.ExitCode()
			} else if err2 != nil {
				t.Fatal(err2)
			}
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			t.Logf("exited %d, %v after SIGTERM", code, time.Since(signalled).Round(time.Millisecond))
			if !tt.finish {
				close(gate)
			}
		})
	}
}
