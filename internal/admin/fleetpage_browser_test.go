package admin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/server"
)

// TestFleetPageInBrowser serves the fleet page from a live router over
// emulated engines and has testdata/browser/fleet.mjs drive it in headless
// Chromium: the login, the tables against /admin/backends and
// /admin/decisions (a split request's legs and TTFT), a reload that adds a backend, a phone's viewport, and
// the time to show 64 backends. Screenshots go to $KVROUTE_SCREENSHOTS,
// else to a temporary directory.
func TestFleetPageInBrowser(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; the fleet page's browser test needs Node.js and Chromium (.ci/run installs them)")
	}
	chromium := os.Getenv("CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("no Chromium at %s (apt-get install chromium, or set CHROMIUM); the fleet page's browser test needs it", chromium)
	}
	dir, err := filepath.Abs("testdata/browser")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		msg := "playwright-core is not installed: run npm ci in internal/admin/testdata/browser"
		if os.Getenv("CI") != "" {
			t.Fatal(msg) // CI installs it, so its absence is a broken CI
		}
		t.Skip(msg)
	}

	// 64 emulated engines, fast-forwarded; the router starts with 3, and
	// scrapes them every 2s, so that 64 of them load the machine little.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	preset := engine.Presets()[0]
	engines := make([]string, 64)
	for i := range engines {
		em, err := emulator.Start(ctx, emulator.Config{Preset: preset, TimeScale: 20, Logger: slog.New(slog.DiscardHandler)}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = em.Close() })
		engines[i] = em.URL
	}
	const token = "fleet-page-test-token"
	t.Setenv("KVROUTE_ADMIN_TOKEN", token)
	configFor := func(n int) (*config.Config, error) {
		var b strings.Builder
		// engine-00 is a prefill engine and every request is split, so
		// that decisions have legs (the emulated engines take either leg).
		b.WriteString("listen: 127.0.0.1:0\nengines: {interval: 2s}\nfleet: {warmup: 0s}\ndisaggregation: {split: always}\nbackends:\n")
		for i := range n {
			role := "both"
			if i == 0 {
				role = "prefill"
			}
			fmt.Fprintf(&b, "  - {name: engine-%02d, url: %s, kind: vllm, role: %s}\n", i, engines[i], role)
		}
		cfg, err := config.Parse([]byte(b.String()))
		if err == nil {
			err = cfg.Validate()
		}
		return cfg, err
	}
	cfg, err := configFor(3)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	base := "http://" + srv.Addr()

	// Some traffic, so that decisions and hit rates have something to
	// show: three conversations of two turns each, split, the second
	// turn streamed (a TTFT in its decision).
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() {
			system := strings.Repeat("You answer questions about conversation "+strconv.Itoa(c)+". ", 40)
			for turn := range 2 {
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}],"max_tokens":8,"stream":%t}`,
					preset.Model, system, turn, turn == 1)
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("X-Session-ID", fmt.Sprintf("conversation-%d", c))
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("completion: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("completion: status %d", resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// The script's hook to reload the router with the first n engines.
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 1 || n > len(engines) || r.Method != http.MethodPost {
			http.Error(w, "POST ?n=1..64", http.StatusBadRequest)
			return
		}
		cfg, err := configFor(n)
		if err == nil {
			err = srv.Reload(cfg)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	t.Cleanup(hook.Close)

	shots := os.Getenv("KVROUTE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	meter := clocktest.Start(t)
	cmdCtx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()
	cmd := exec.CommandContext(cmdCtx, node, "fleet.mjs", "--url", base, "--token", token,
		"--reload", hook.URL+"/reload", "--shots", shots, "--chromium", chromium)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	t.Logf("node fleet.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the fleet page failed in the browser: %v", err)
	}
	t.Logf("screenshots in %s", shots)
	// The page's own work drawing 64 backends (tables, style and layout),
	// as the script measured it in the browser: 200 ms on a quiet machine,
	// scaled by how far this process fell behind meanwhile (Chromium shares
	// the same cores).
	_, after, ok := strings.Cut(string(out), "render-ms=")
	ms, err := strconv.ParseFloat(strings.Fields(after + " x")[0], 64)
	if !ok || err != nil {
		t.Fatalf("the script printed no render-ms= line")
	}
	if took := time.Duration(ms * float64(time.Millisecond)); !meter.Within(t, took, 200*time.Millisecond, "rendering 64 backends") {
		t.Errorf("rendering 64 backends took %v, over 200 ms scaled to %v (%s)", took, meter.Scale(200*time.Millisecond), meter)
	}
}
