package deploy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
)

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) the chart writes; decoding into it strictly
// fails on any field the chart writes that is not in the CRD's schema.
type serviceMonitor struct {
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
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is one helm template run, decoded.
type rendered struct {
	deployment      *appsv1.Deployment
	service         *corev1.Service
	configMap       *corev1.ConfigMap
	pdb             *policyv1.PodDisruptionBudget
	secrets         []*corev1.Secret
	monitor         *serviceMonitor
	inferencePool   *inferencePool
	serviceAccounts []*corev1.ServiceAccount
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
}

// secret returns the rendered Secret of that name, or nil.
func (r *rendered) secret(name string) *corev1.Secret {
	for _, s := range r.secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// releaseNamespace is the namespace the tests install the chart in.
const releaseNamespace = "inference"

// helmTemplate renders the chart with the given values file content and
// decodes every object strictly into its Kubernetes API type.
func helmTemplate(t *testing.T, values string) (*rendered, error) {
	t.Helper()
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(vf, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("helm", "template", "r", "helm/kvroute", "--namespace", releaseNamespace, "-f", vf)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &helmError{err: err, stderr: stderr.String()}
	}
	r := &rendered{}
	for doc := range strings.SplitSeq(string(out), "\n---") {
		if strings.TrimSpace(strings.ReplaceAll(doc, "---", "")) == "" {
			continue
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		var obj any
		switch head.Kind {
		case "Deployment":
			r.deployment = &appsv1.Deployment{}
			obj = r.deployment
		case "Service":
			r.service = &corev1.Service{}
			obj = r.service
		case "ConfigMap":
			r.configMap = &corev1.ConfigMap{}
			obj = r.configMap
		case "PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			obj = r.pdb
		case "Secret":
			sec := &corev1.Secret{}
			r.secrets = append(r.secrets, sec)
			obj = sec
		case "ServiceAccount":
			sa := &corev1.ServiceAccount{}
			r.serviceAccounts = append(r.serviceAccounts, sa)
			obj = sa
		case "Role":
			role := &rbacv1.Role{}
			r.roles = append(r.roles, role)
			obj = role
		case "RoleBinding":
			b := &rbacv1.RoleBinding{}
			r.roleBindings = append(r.roleBindings, b)
			obj = b
		case "ServiceMonitor":
			r.monitor = &serviceMonitor{}
			obj = r.monitor
		case "InferencePool":
			r.inferencePool = &inferencePool{}
			obj = r.inferencePool
		default:
			t.Fatalf("the chart renders a %q the test does not know:\n%s", head.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", head.Kind, err, doc)
		}
	}
	return r, nil
}

type helmError struct {
	err    error
	stderr string
}

func (e *helmError) Error() string { return "helm template: " + e.err.Error() + ": " + e.stderr }

// TestHelmChart renders the chart with its defaults and with everything
// on, decodes every object strictly, checks that they fit together, and
// loads the rendered kvroute config with the router's own loader.
func TestHelmChart(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	tests := []struct {
		name, values string
		replicas     int32
		backends     []config.Backend
		secret       bool
		monitor      bool
	}{
		{name: "defaults", replicas: 2, backends: []config.Backend{
			{URL: "http://vllm.inference.svc.cluster.local:8000", Discovery: "dns", Kind: "vllm"},
		}},
		{name: "everything on", replicas: 3, secret: true, monitor: true, values: `
replicaCount: 3
engines:
  - {service: vllm-llama, port: 8000, models: [meta-llama/Llama-3.1-8B-Instruct], name: llama, dnsInterval: 2s}
  - {service: sglang-qwen, namespace: models, srv: true, portName: api, kind: sglang, models: [Qwen/Qwen2.5-7B-Instruct]}
config:
  policy: kvroute
  admission: {max_inflight_per_backend: 64, max_queue: 512}
  health: {eject_after: 5}
  fleet: {warmup: 1m}
admin: {enabled: true, token: not-a-real-token}
extraEnv:
  - {name: KVROUTE_API_KEYS, valueFrom: {secretKeyRef: {name: keys, key: keys}}}
podDisruptionBudget: {maxUnavailable: 1}
serviceMonitor: {enabled: true, labels: {release: prometheus}}
preStopSleepSeconds: 0
`, backends: []config.Backend{
			// No kind: a list in the values replaces the default one whole, so auto.
			{Name: "llama", URL: "http://vllm-llama.inference.svc.cluster.local:8000", Discovery: "dns",
				Models: []string{"meta-llama/Llama-3.1-8B-Instruct"}},
			{URL: "http://sglang-qwen.models.svc.cluster.local", SRV: "_api._tcp.sglang-qwen.models.svc.cluster.local",
				Discovery: "dns", Kind: "sglang", Models: []string{"Qwen/Qwen2.5-7B-Instruct"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := helmTemplate(t, tt.values)
			if err != nil {
				t.Fatal(err)
			}
			if r.deployment == nil || r.service == nil || r.configMap == nil || r.pdb == nil {
				t.Fatalf("missing objects: %+v", r)
			}
			if (len(r.secrets) != 0) != tt.secret || (r.monitor != nil) != tt.monitor {
				t.Errorf("secret %v, service monitor %v; want %v, %v", len(r.secrets) != 0, r.monitor != nil, tt.secret, tt.monitor)
			}
			checkDeployment(t, r, tt.replicas)
			cfg := checkConfig(t, r)
			for i := range cfg.Backends {
				cfg.Backends[i].DNSInterval = 0 // compared apart
			}
			if len(cfg.Backends) != len(tt.backends) {
				t.Fatalf("backends %+v, want %+v", cfg.Backends, tt.backends)
			}
			for i, want := range tt.backends {
				got := cfg.Backends[i]
				if want.Name == "" {
					got.Name = "" // the loader names unnamed backends after their host
				}
				if got.URL != want.URL || got.SRV != want.SRV || got.Discovery != want.Discovery || got.Kind != want.Kind ||
					got.Name != want.Name || !slices.Equal(got.Models, want.Models) {
					t.Errorf("backends[%d] = %+v, want %+v", i, got, want)
				}
			}
			if r.monitor != nil {
				ep := r.monitor.Spec.Endpoints
				if len(ep) != 1 || ep[0].Port != r.service.Spec.Ports[0].Name || ep[0].Path != "/metrics" {
					t.Errorf("service monitor endpoints %+v do not scrape the service's port %q at /metrics", ep, r.service.Spec.Ports[0].Name)
				}
				if !subset(r.monitor.Spec.Selector.MatchLabels, r.service.Labels) || r.monitor.Metadata.Labels["release"] != "prometheus" {
					t.Errorf("service monitor %+v does not select the service %v or lacks its labels", r.monitor.Spec.Selector, r.service.Labels)
				}
			}
		})
	}
}

// checkDeployment checks the router pods against the other objects.
func checkDeployment(t *testing.T, r *rendered, replicas int32) {
	t.Helper()
	d := r.deployment
	if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
		t.Errorf("replicas %v, want %d", d.Spec.Replicas, replicas)
	}
	pod := d.Spec.Template
	if !subset(d.Spec.Selector.MatchLabels, pod.Labels) || !subset(r.service.Spec.Selector, pod.Labels) ||
		!subset(r.pdb.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("the deployment's, service's or budget's selector does not match the pods' labels %v", pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v, want GET /healthz", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v, want GET /readyz", c.ReadinessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v, want cpu and memory", c.Resources.Requests)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || r.service.Spec.Ports[0].TargetPort.StrVal != "http" {
		t.Errorf("container ports %+v and service target %+v do not meet", c.Ports, r.service.Spec.Ports[0].TargetPort)
	}
	if !slices.Equal(c.Args, []string{"serve", "--config", "/etc/kvroute/kvroute.yaml"}) {
		t.Errorf("args %v", c.Args)
	}
	configMounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if m.Name == v.Name && m.MountPath == "/etc/kvroute" && m.SubPath == "" && v.ConfigMap != nil && v.ConfigMap.Name == r.configMap.Name {
				configMounted = true
			}
		}
	}
	if !configMounted {
		t.Errorf("the config map %q is not mounted as the directory /etc/kvroute: %+v %+v", r.configMap.Name, c.VolumeMounts, pod.Spec.Volumes)
	}
	// The checksum annotation is the config's, so that a changed config
	// rolls the pods.
	sum := sha256.Sum256([]byte(strings.TrimSuffix(r.configMap.Data["kvroute.yaml"], "\n")))
	if got := pod.Annotations["checksum/config"]; got != hex.EncodeToString(sum[:]) {
		t.Errorf("checksum/config %q is not the sha256 of the rendered config (%x)", got, sum)
	}
	if sec := r.secret("r-kvroute-admin"); sec != nil {
		var ref *corev1.SecretKeySelector
		for _, e := range c.Env {
			if e.Name == "KVROUTE_ADMIN_TOKEN" && e.ValueFrom != nil {
				ref = e.ValueFrom.SecretKeyRef
			}
		}
		if ref == nil || ref.Name != sec.Name || sec.StringData[ref.Key] == "" {
			t.Errorf("KVROUTE_ADMIN_TOKEN %+v does not come from the chart's secret %q", ref, sec.Name)
		}
	}
}

// checkConfig loads the rendered config file as kvroute serve does.
func checkConfig(t *testing.T, r *rendered) *config.Config {
	t.Helper()
	data, ok := r.configMap.Data["kvroute.yaml"]
	if !ok {
		t.Fatalf("config map keys %v, want kvroute.yaml", r.configMap.Data)
	}
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, data)
	}
	if want := fmt.Sprintf("0.0.0.0:%d", r.deployment.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort); cfg.Listen != want {
		t.Errorf("listen %q, want %q", cfg.Listen, want)
	}
	return cfg
}

// TestHelmChartRefuses checks that the chart fails to render, with a
// message naming the value, rather than render a router that cannot start.
func TestHelmChartRefuses(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	for values, want := range map[string]string{
		"engines: []":             "engines: at least one engine pool is required",
		"engines: [{port: 8000}]": "engines[0].service",
		"admin: {enabled: true}":  "admin.enabled needs admin.existingSecret or admin.token",
		// values.schema.json: what the router would refuse at start, and
		// wrong types.
		"admin: {enabled: true, token: fifteen-chars-x}":    "/admin/token",
		"admin: {enabled: true, token: '  short-token   '}": "/admin/token",
		"replicaCount: two":                        "/replicaCount",
		"engines: [{service: vllm, port: '8000'}]": "/engines/0/port",
		"engines: [{service: vllm, scheme: tcp}]":  "/engines/0/scheme",
		"goMemLimitRatio: 1.5":                     "/goMemLimitRatio",
		"admin: {enabled: yes-please}":             "/admin/enabled",
		// API discovery and sync.
		"discovery: consul": "/discovery",
		"engines: [{service: vllm, selector: {app: 1}}]":                "/engines/0/selector/app",
		"engines: [{service: vllm, discovery: k8s}]":                    "/engines/0/discovery",
		"rbac: {create: 'no'}":                                          "/rbac/create",
		"sync: {enabled: 'true'}":                                       "/sync/enabled",
		"sync: {url: 'http://nats:4222'}":                               "/sync/url",
		"sync: {url: 'nats://a:4222;nats://b:4222'}":                    "/sync/url",
		"sync: {key: a-key-of-31-characters-is-short}":                  "/sync/key",
		"sync: {credentials: {secret: creds}}":                          "/sync/credentials",
		"sync: {enabled: true, key: ci-only-not-a-secret-0123456789ab}": "sync.enabled needs sync.url",
		"sync: {enabled: true, url: 'nats://nats:4222'}":                "sync.enabled needs sync.existingSecret or sync.key",
		"sync: {enabled: true, url: 'nats://nats:4222', existingSecret: s}\nconfig: {sync: {url: 'nats://other:4222'}}":      "config.sync.url",
		"sync: {enabled: true, url: 'nats://nats:4222', existingSecret: s}\nconfig: {sync: {token: t}}":                      "config.sync.token",
		"replicaCount: 3\nsync: {enabled: true, url: 'nats://nats:4222', existingSecret: s}\nconfig: {sync: {max_peers: 2}}": "config.sync.max_peers",
		"discovery: kubernetes\nengines: [{service: vllm, selector: {app: vllm}}]":                                           "exactly one of service",
		"discovery: kubernetes\nengines: [{port: 8000}]":                                                                     "exactly one of service",
		"discovery: kubernetes\nengines: [{inferencePool: p, port: 8000}]":                                                   "leave port and portName out with inferencePool",
		"discovery: kubernetes\nengines: [{selector: {app: vllm}}]":                                                          "port or portName is required with selector",
		"discovery: kubernetes\nengines: [{service: vllm, srv: true}]":                                                       "engines[0].srv",
		"engines: [{service: vllm, selector: {app: vllm}}]":                                                                  "selector and inferencePool need discovery: kubernetes",
	} {
		_, err := helmTemplate(t, values)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: error %v, want one saying %q", values, err, want)
		}
		// helm lint, which a CI of the chart runs, refuses them too.
		if !strings.HasPrefix(want, "/") {
			continue
		}
		vf := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(vf, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("helm", "lint", "helm/kvroute", "-f", vf).CombinedOutput(); err == nil {
			t.Errorf("helm lint accepts %q:\n%s", values, out)
		}
	}
	if _, err := helmTemplate(t, "admin: {enabled: true, token: sixteen-chars-ok}"); err != nil {
		t.Errorf("a 16-character token: %v", err)
	}
	if _, err := helmTemplate(t, "sync: {enabled: true, url: 'nats://nats:4222', key: a-key-of-32-characters-is-enough}"); err != nil {
		t.Errorf("a 32-character sync key: %v", err)
	}
}

// TestHelmChartRuntime: GOMEMLIMIT is goMemLimitRatio of the memory
// limit; the replicas spread over nodes and zones by default, selecting
// the router's pods; a rotated admin token changes the pod template; the
// TLS Secrets are mounted and named in the config.
func TestHelmChartRuntime(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	envOf := func(r *rendered, name string) (string, bool) {
		for _, e := range r.deployment.Spec.Template.Spec.Containers[0].Env {
			if e.Name == name {
				return e.Value, true
			}
		}
		return "", false
	}
	for _, tc := range []struct {
		values string
		ratio  float64
	}{
		{"", 0.9},
		{"resources: {limits: {memory: 3G}}", 0.9},
		{"resources: {limits: {memory: 1536Mi}}\ngoMemLimitRatio: 0.8", 0.8},
		{"goMemLimitRatio: 0", 0},
		{"resources: {limits: null}", 0},
	} {
		r, err := helmTemplate(t, tc.values)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := envOf(r, "GOMEMLIMIT")
		lim := r.deployment.Spec.Template.Spec.Containers[0].Resources.Limits.Memory()
		if tc.ratio == 0 || lim.IsZero() {
			if ok {
				t.Errorf("values %q: GOMEMLIMIT %q, want none", tc.values, got)
			}
			continue
		}
		if want := fmt.Sprint(int64(tc.ratio * float64(lim.Value()))); got != want {
			t.Errorf("values %q: GOMEMLIMIT %q, want %s (%g of %s)", tc.values, got, want, tc.ratio, lim)
		}
	}

	r, err := helmTemplate(t, "")
	if err != nil {
		t.Fatal(err)
	}
	pod := r.deployment.Spec.Template
	keys := map[string]bool{}
	for _, c := range pod.Spec.TopologySpreadConstraints {
		keys[c.TopologyKey] = true
		if c.LabelSelector == nil || !subset(c.LabelSelector.MatchLabels, pod.Labels) || c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("spread constraint %+v does not select the router pods %v, or is not ScheduleAnyway", c, pod.Labels)
		}
	}
	if !keys["kubernetes.io/hostname"] || !keys["topology.kubernetes.io/zone"] {
		t.Errorf("default spread over %v, want nodes and zones", keys)
	}
	if _, ok := pod.Annotations["checksum/admin-secret"]; ok {
		t.Error("checksum/admin-secret without the admin API")
	}

	sums := map[string]bool{}
	for _, tok := range []string{"first-token-0123456789", "second-token-0123456789"} {
		r, err := helmTemplate(t, "admin: {enabled: true, token: "+tok+"}")
		if err != nil {
			t.Fatal(err)
		}
		sum := r.deployment.Spec.Template.Annotations["checksum/admin-secret"]
		if sum == "" || sums[sum] {
			t.Errorf("token %s: checksum/admin-secret %q, want one of its own", tok, sum)
		}
		sums[sum] = true
	}

	r, err = helmTemplate(t, "tls: {existingSecret: router-tls}\nengineTLS: {existingSecret: engines-ca, clientCert: true, serverName: vllm.inference.svc}\nconfig: {upstream: {connect_timeout: 2s}}")
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkConfig(t, r)
	if !cfg.ListenTLS.Enabled() || cfg.Upstream.TLS == nil || cfg.Upstream.TLS.CertFile == "" || cfg.Upstream.TLS.ServerName != "vllm.inference.svc" ||
		cfg.Upstream.ConnectTimeout.String() != "2s" {
		t.Errorf("listen_tls %+v, upstream %+v, want both from the Secrets and the values' upstream keys kept", cfg.ListenTLS, cfg.Upstream)
	}
	for file, secret := range map[string]string{cfg.ListenTLS.CertFile: "router-tls", cfg.ListenTLS.KeyFile: "router-tls",
		cfg.Upstream.TLS.CAFile: "engines-ca", cfg.Upstream.TLS.KeyFile: "engines-ca"} {
		if !inSecretMount(r, file, secret) {
			t.Errorf("%s is not in a mount of the Secret %s: %+v", file, secret, r.deployment.Spec.Template.Spec.Volumes)
		}
	}
	c := r.deployment.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("probes %+v %+v, want HTTPS on a TLS listener", c.ReadinessProbe.HTTPGet, c.LivenessProbe.HTTPGet)
	}
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}
