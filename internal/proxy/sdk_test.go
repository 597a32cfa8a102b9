package proxy

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestSDKs runs testdata/sdk/sdk.mjs against a router over emulated
// engines: the official OpenAI Node SDK (responses.create, continued by
// previous_response_id, streamed and not, retrieve, an unknown id's
// NotFoundError) and Anthropic TypeScript SDK (messages.create,
// messages.stream, an error in Anthropic's shape), unchanged but for
// their base URL. Round robin over 3 engines: the continuations reach the
// engine holding their response only by the router's table.
func TestSDKs(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; the SDK test needs Node.js (.ci/run installs it)")
	}
	dir, err := filepath.Abs("testdata/sdk")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", m)); err != nil {
			msg := m + " is not installed: run npm ci in internal/proxy/testdata/sdk"
			if os.Getenv("CI") != "" {
				t.Fatal(msg) // CI installs it, so its absence is a broken CI
			}
			t.Skip(msg)
		}
	}
	r := emulatedRig(t, "round-robin", 3, nil)
	r.waitReady(http.StatusOK)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sdk.mjs", "--url", r.base)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	t.Logf("node sdk.mjs:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
