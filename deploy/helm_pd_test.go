package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// pdValues is the values file of docs/deploy.md's "Deploy P/D" section, as
// the page writes it.
func pdValues(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "cat > kvroute-pd-values.yaml <<'YAML'\n")
	values, _, ok2 := strings.Cut(rest, "\nYAML\n")
	if !ok || !ok2 {
		t.Fatal("docs/deploy.md has no kvroute-pd-values.yaml block")
	}
	return values + "\n"
}

// TestHelmChartPD renders docs/deploy.md's P/D fleet (two pools found by
// DNS, a prefill and a decode role, KV events and a preset on each) and
// checks that the config the chart renders carries them and passes
// kvroute validate.
func TestHelmChartPD(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	r, err := helmTemplate(t, pdValues(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkConfig(t, r)
	want := []struct{ url, role string }{
		{"http://vllm-prefill.inference.svc.cluster.local:8000", config.RolePrefill},
		{"http://vllm-decode.inference.svc.cluster.local:8000", config.RoleDecode},
	}
	if len(cfg.Backends) != len(want) {
		t.Fatalf("backends %+v, want a prefill and a decode pool", cfg.Backends)
	}
	for i, w := range want {
		b := cfg.Backends[i]
		if b.URL != w.url || b.Discovery != "dns" || b.Role != w.role || b.KVEvents != "5557" || b.Preset != "h100-llama3-8b" {
			t.Errorf("backends[%d] = url %q discovery %q role %q kv_events %q preset %q; want %s, dns, %s, 5557, h100-llama3-8b",
				i, b.URL, b.Discovery, b.Role, b.KVEvents, b.Preset, w.url, w.role)
		}
	}
	if cfg.Disaggregation.Split != config.SplitConditional {
		t.Errorf("disaggregation.split %q", cfg.Disaggregation.Split)
	}

	// kvroute validate, the binary's own check, on the rendered file.
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvroute")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/kvroute").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	file := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(file, []byte(r.configMap.Data["kvroute.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--config", file)
	cmd.Env = append(os.Environ(), config.AdminTokenEnv+"=")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("kvroute validate: %v\n%s\nconfig:\n%s", err, out, r.configMap.Data["kvroute.yaml"])
	}
}
