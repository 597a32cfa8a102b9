package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// inferencePool is the part of the Inference Extension's InferencePool
// (inference.networking.k8s.io/v1) the chart writes; decoding into it
// strictly fails on any field the chart writes that is not in its schema.
type inferencePool struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Name string `json:"name"`
			Port struct {
				Number int32 `json:"number"`
			} `json:"port"`
			FailureMode string `json:"failureMode"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

// docValues is the values file docs/deploy.md writes with
// "cat > name <<'YAML'".
func docValues(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "cat > "+name+" <<'YAML'\n")
	values, _, ok2 := strings.Cut(rest, "\nYAML\n")
	if !ok || !ok2 {
		t.Fatalf("docs/deploy.md has no %s block", name)
	}
	return values + "\n"
}

// TestHelmChartEPP renders docs/deploy.md's Endpoint Picker values: the
// config carries epp on 9002 and 9003 and passes kvroute validate, the
// pod and the Service carry both ports, the Role lets the router watch
// the InferencePool and its pods, and the InferencePool the chart creates
// names the Service's ext_proc port as its picker.
func TestHelmChartEPP(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	r, err := helmTemplate(t, docValues(t, "kvroute-epp-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkConfig(t, r)
	if cfg.EPP.Listen != "0.0.0.0:9002" || cfg.EPP.HealthListen != "0.0.0.0:9003" || cfg.EPP.Fallbacks != 0 {
		t.Errorf("epp %+v, want listen :9002, health :9003, no fallbacks", cfg.EPP)
	}
	ports := map[string]int32{}
	for _, p := range r.deployment.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	svc := map[string]int32{}
	for _, p := range r.service.Spec.Ports {
		svc[p.Name] = p.Port
		if p.Name != "http" && (p.AppProtocol == nil || *p.AppProtocol != "http2") {
			t.Errorf("Service port %s: appProtocol %v, want http2 (gRPC)", p.Name, p.AppProtocol)
		}
	}
	for name, want := range map[string]int32{"grpc-ext-proc": 9002, "grpc-health": 9003} {
		if ports[name] != want || svc[name] != want {
			t.Errorf("port %s: container %d, Service %d; want %d", name, ports[name], svc[name], want)
		}
	}
	watches := false
	for _, role := range r.roles {
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				watches = watches || res == "inferencepools"
			}
		}
	}
	if !watches {
		t.Error("no Role lets the router watch InferencePools")
	}
	ip := r.inferencePool
	if ip == nil {
		t.Fatal("no InferencePool rendered")
	}
	ref := ip.Spec.EndpointPickerRef
	if ip.APIVersion != "inference.networking.k8s.io/v1" || ip.Metadata.Name != "llama" || ref.Name != r.service.Name || ref.Port.Number != 9002 ||
		ref.FailureMode != "FailClose" || ip.Spec.Selector.MatchLabels["app"] != "vllm-llama" || len(ip.Spec.TargetPorts) != 1 || ip.Spec.TargetPorts[0].Number != 8000 {
		t.Errorf("InferencePool %+v", ip)
	}
	if len(cfg.Backends) != 1 || cfg.Backends[0].Kubernetes == nil || cfg.Backends[0].Kubernetes.InferencePool != "llama" {
		t.Errorf("backends %+v, want the pool llama", cfg.Backends)
	}

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
