package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/config"
)

// chartValues is the part of the chart's values the checks below read.
type chartValues struct {
	ReplicaCount int32 `json:"replicaCount"`
	Sync         struct {
		Enabled        bool   `json:"enabled"`
		URL            string `json:"url"`
		ExistingSecret string `json:"existingSecret"`
		SecretKey      string `json:"secretKey"`
		Key            string `json:"key"`
		Credentials    struct {
			ExistingSecret string `json:"existingSecret"`
			SecretKey      string `json:"secretKey"`
		} `json:"credentials"`
		TLS struct {
			ExistingSecret string `json:"existingSecret"`
			ClientCert     bool   `json:"clientCert"`
		} `json:"tls"`
	} `json:"sync"`
	ServiceAccount struct {
		Create bool   `json:"create"`
		Name   string `json:"name"`
	} `json:"serviceAccount"`
}

// renderedConfig is the part of the rendered kvroute.yaml checked here,
// read without kvroute's loader so that it is checked whatever the loader
// knows.
type renderedConfig struct {
	Backends []struct {
		Discovery  string `json:"discovery"`
		Kubernetes *struct {
			Namespace     string            `json:"namespace"`
			Service       string            `json:"service"`
			Selector      map[string]string `json:"selector"`
			InferencePool string            `json:"inference_pool"`
			Port          string            `json:"port"`
		} `json:"kubernetes"`
	} `json:"backends"`
	Sync *struct {
		URL             string `json:"url"`
		KeyFile         string `json:"key_file"`
		CredentialsFile string `json:"credentials_file"`
		TLS             *struct {
			CAFile   string `json:"ca_file"`
			CertFile string `json:"cert_file"`
			KeyFile  string `json:"key_file"`
		} `json:"tls"`
	} `json:"sync"`
}

// The API resources the router reads, as group/resource.
const (
	pods           = "/pods"
	endpointSlices = "discovery.k8s.io/endpointslices"
	inferencePools = "inference.networking.k8s.io/inferencepools"
)

// TestHelmChartCI renders each of the chart's ci/ values files (the ones
// a chart CI such as chart-testing installs), lints it, and checks what
// API discovery and sync add: a Role per namespace that grants get, list
// and watch on exactly what the rendered config makes the router read
// there, bound to the account the pods run as, and nothing of it with
// DNS discovery; the sync key from its Secret as KVROUTE_SYNC_KEY, the
// NATS credentials and TLS files from theirs, mounted where the config
// looks. The ci/ files must cover API discovery and sync.
func TestHelmChartCI(t *testing.T) {
	if _, err := exec.LookPath("helm"); err != nil {
		t.Skip("helm is not on PATH (CI installs it: go install helm.sh/helm/v4/cmd/helm@v4.3.2); the chart is not checked")
	}
	files, err := filepath.Glob("helm/kvroute/ci/*-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := os.ReadFile("helm/kvroute/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sawAPI, sawSync bool
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			if out, err := exec.Command("helm", "lint", "helm/kvroute", "-f", file).CombinedOutput(); err != nil {
				t.Errorf("helm lint -f %s: %v\n%s", file, err, out)
			}
			values, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var v chartValues
			for _, b := range [][]byte{defaults, values} {
				if err := yaml.Unmarshal(b, &v); err != nil {
					t.Fatal(err)
				}
			}
			r, err := helmTemplate(t, string(values))
			if err != nil {
				t.Fatal(err)
			}
			if r.deployment == nil || r.configMap == nil {
				t.Fatalf("no deployment or config map: %+v", r)
			}
			checkDeployment(t, r, v.ReplicaCount)
			var cfg renderedConfig
			if err := yaml.Unmarshal([]byte(r.configMap.Data["kvroute.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			if checkRBAC(t, r, v, cfg) {
				sawAPI = true
			}
			if v.Sync.Enabled {
				sawSync = true
				checkSync(t, r, v, cfg)
			} else if envRef(r, config.SyncKeyEnv) != nil || cfg.Sync != nil {
				t.Errorf("sync off, yet %s is set or the config has a sync section", config.SyncKeyEnv)
			}
			loadConfig(t, r, v)
		})
	}
	if !sawAPI || !sawSync {
		t.Errorf("the ci/ values files %v cover API discovery: %v, sync: %v; want both", files, sawAPI, sawSync)
	}
}

// checkRBAC checks the ServiceAccount, Roles and RoleBindings against the
// rendered config's kubernetes backends, and reports whether there were
// any.
func checkRBAC(t *testing.T, r *rendered, v chartValues, cfg renderedConfig) bool {
	t.Helper()
	need := map[string]map[string]bool{} // namespace -> resources
	for i, b := range cfg.Backends {
		k := b.Kubernetes
		if b.Discovery != "kubernetes" || k == nil {
			if k != nil || b.Discovery != "dns" {
				t.Errorf("backends[%d]: discovery %q with kubernetes %+v", i, b.Discovery, k)
			}
			continue
		}
		if k.Namespace == "" {
			t.Errorf("backends[%d].kubernetes has no namespace: the Role would be in the release's and the router would watch its own", i)
		}
		if need[k.Namespace] == nil {
			need[k.Namespace] = map[string]bool{}
		}
		// Pods for their labels (a Service's endpoints) or as the
		// backends themselves (a selector, an InferencePool's).
		need[k.Namespace][pods] = true
		switch {
		case k.Service != "":
			need[k.Namespace][endpointSlices] = true
		case k.InferencePool != "":
			need[k.Namespace][inferencePools] = true
		}
	}
	pod := r.deployment.Spec.Template.Spec
	if len(need) == 0 {
		if len(r.roles)+len(r.roleBindings)+len(r.serviceAccounts) != 0 {
			t.Errorf("DNS discovery only, yet %d roles, %d bindings, %d service accounts", len(r.roles), len(r.roleBindings), len(r.serviceAccounts))
		}
		if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
			t.Errorf("DNS discovery only: the pods mount an API token (automountServiceAccountToken %v)", pod.AutomountServiceAccountToken)
		}
		return false
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken || pod.ServiceAccountName == "" {
		t.Errorf("API discovery: service account %q, automount %v", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	if v.ServiceAccount.Create != (len(r.serviceAccounts) == 1) {
		t.Errorf("serviceAccount.create %v, %d rendered", v.ServiceAccount.Create, len(r.serviceAccounts))
	}
	for _, sa := range r.serviceAccounts {
		if sa.Name != pod.ServiceAccountName {
			t.Errorf("service account %q, the pods run as %q", sa.Name, pod.ServiceAccountName)
		}
	}
	if v.ServiceAccount.Name != "" && pod.ServiceAccountName != v.ServiceAccount.Name {
		t.Errorf("the pods run as %q, serviceAccount.name is %q", pod.ServiceAccountName, v.ServiceAccount.Name)
	}
	granted := map[string]map[string]bool{}
	for _, role := range r.roles {
		if granted[role.Namespace] != nil {
			t.Errorf("two roles in %s", role.Namespace)
		}
		granted[role.Namespace] = map[string]bool{}
		for _, rule := range role.Rules {
			if verbs := slices.Sorted(slices.Values(rule.Verbs)); !slices.Equal(verbs, []string{"get", "list", "watch"}) {
				t.Errorf("role %s/%s grants %v on %v: want get, list and watch only", role.Namespace, role.Name, rule.Verbs, rule.Resources)
			}
			if len(rule.ResourceNames) != 0 || len(rule.NonResourceURLs) != 0 {
				t.Errorf("role %s/%s: rule %+v", role.Namespace, role.Name, rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					granted[role.Namespace][g+"/"+res] = true
				}
			}
		}
		bound := false
		for _, b := range r.roleBindings {
			if b.Namespace != role.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != role.Name || b.RoleRef.APIGroup != "rbac.authorization.k8s.io" {
				continue
			}
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == pod.ServiceAccountName && s.Namespace == releaseNamespace {
					bound = true
				}
			}
		}
		if !bound {
			t.Errorf("role %s/%s is not bound to the pods' service account %s/%s", role.Namespace, role.Name, releaseNamespace, pod.ServiceAccountName)
		}
	}
	if len(r.roleBindings) != len(r.roles) {
		t.Errorf("%d roles, %d bindings", len(r.roles), len(r.roleBindings))
	}
	if !reflect.DeepEqual(granted, need) {
		t.Errorf("the roles grant %v; the config reads %v", granted, need)
	}
	return true
}

// checkSync checks the sync key's Secret and environment variable, the
// NATS URL, and that the credentials and TLS files the config names are
// in mounts of their Secrets.
func checkSync(t *testing.T, r *rendered, v chartValues, cfg renderedConfig) {
	t.Helper()
	if cfg.Sync == nil || cfg.Sync.URL != v.Sync.URL || cfg.Sync.KeyFile != "" {
		t.Fatalf("config sync %+v, want url %q and the key from %s", cfg.Sync, v.Sync.URL, config.SyncKeyEnv)
	}
	ref := envRef(r, config.SyncKeyEnv)
	secret := v.Sync.ExistingSecret
	if secret == "" {
		secret = "r-kvroute-sync"
		sec := r.secret(secret)
		if sec == nil || ref == nil || sec.StringData[ref.Key] != v.Sync.Key {
			t.Errorf("%s %+v is not the chart's Secret %q holding sync.key", config.SyncKeyEnv, ref, secret)
		}
	} else if r.secret(secret) != nil {
		t.Errorf("sync.existingSecret %q, yet the chart renders a Secret of that name", secret)
	}
	if ref == nil || ref.Name != secret || ref.Key != v.Sync.SecretKey {
		t.Errorf("%s comes from %+v, want Secret %q key %q", config.SyncKeyEnv, ref, secret, v.Sync.SecretKey)
	}
	if r.deployment.Spec.Template.Annotations["checksum/sync-secret"] == "" {
		t.Error("no checksum/sync-secret: a new key would not roll the pods")
	}
	files := map[string]string{}
	if v.Sync.Credentials.ExistingSecret != "" {
		files[cfg.Sync.CredentialsFile] = v.Sync.Credentials.ExistingSecret
		if filepath.Base(cfg.Sync.CredentialsFile) != v.Sync.Credentials.SecretKey {
			t.Errorf("credentials_file %q is not the Secret's key %q", cfg.Sync.CredentialsFile, v.Sync.Credentials.SecretKey)
		}
	} else if cfg.Sync.CredentialsFile != "" {
		t.Errorf("credentials_file %q without sync.credentials", cfg.Sync.CredentialsFile)
	}
	if v.Sync.TLS.ExistingSecret != "" {
		if cfg.Sync.TLS == nil || (cfg.Sync.TLS.CertFile != "") != v.Sync.TLS.ClientCert {
			t.Fatalf("sync.tls %+v, client certificate %v", cfg.Sync.TLS, v.Sync.TLS.ClientCert)
		}
		for _, f := range []string{cfg.Sync.TLS.CAFile, cfg.Sync.TLS.CertFile, cfg.Sync.TLS.KeyFile} {
			if f != "" {
				files[f] = v.Sync.TLS.ExistingSecret
			}
		}
	}
	for file, secret := range files {
		if !inSecretMount(r, file, secret) {
			t.Errorf("%s is not in a mount of the Secret %s", file, secret)
		}
	}
}

// envRef is the Secret reference of the router container's variable name.
func envRef(r *rendered, name string) *corev1.SecretKeySelector {
	for _, e := range r.deployment.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// inSecretMount reports whether file is in the directory where the router
// container mounts the Secret.
func inSecretMount(r *rendered, file, secret string) bool {
	pod := r.deployment.Spec.Template.Spec
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, vol := range pod.Volumes {
			if vol.Name == m.Name && vol.Secret != nil && vol.Secret.SecretName == secret && filepath.Dir(file) == m.MountPath {
				return true
			}
		}
	}
	return false
}

// loadConfig loads the rendered config with kvroute's own loader, the
// sync key set as the Secret would set it. A config with kubernetes
// backends needs a loader that knows backends[].kubernetes.
func loadConfig(t *testing.T, r *rendered, v chartValues) {
	t.Helper()
	if _, ok := reflect.TypeFor[config.Backend]().FieldByName("Kubernetes"); !ok &&
		strings.Contains(r.configMap.Data["kvroute.yaml"], "kubernetes:") {
		t.Log("this build's config has no backends[].kubernetes: the rendered config is checked above, not loaded")
		return
	}
	if v.Sync.Enabled {
		key := v.Sync.Key
		if key == "" {
			key = strings.Repeat("k", config.MinSyncKeyLen) // the existing Secret's
		}
		t.Setenv(config.SyncKeyEnv, key)
	}
	cfg := checkConfig(t, r)
	if cfg.Sync.Enabled() != v.Sync.Enabled {
		t.Errorf("sync on %v, want %v", cfg.Sync.Enabled(), v.Sync.Enabled)
	}
}
