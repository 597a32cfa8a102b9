package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/engine"
)

func TestDiscoveryConfig(t *testing.T) {
	tests := []configCase{
		{"defaults", "backends: [{url: http://a:1}]", "", func(t *testing.T, c *Config) {
			if c.Fleet != (Fleet{Warmup: DefaultWarmup, DNSInterval: DefaultDNSInterval, ConfigPoll: DefaultConfigPoll, RejoinGrace: DefaultRejoinGrace,
				DrainGrace: DefaultDrainGrace}) || firstEntry(t, c).DNS() {
				t.Errorf("fleet %+v, dns %v", c.Fleet, firstEntry(t, c).DNS())
			}
		}},
		{"dns with interval", "backends: [{url: http://vllm.ns.svc:8000, discovery: dns, dns_interval: 2s}]", "", func(t *testing.T, c *Config) {
			if !firstEntry(t, c).DNS() || c.Backends[0].DNSInterval != 2*time.Second {
				t.Errorf("backend %+v", c.Backends[0])
			}
		}},
		{"srv implies dns and a url", "backends: [{srv: _http._tcp.vllm.ns.svc.cluster.local}]", "", func(t *testing.T, c *Config) {
			b := firstEntry(t, c)
			if b.Discovery != DiscoveryDNS || b.URL != "http://vllm.ns.svc.cluster.local" || b.Name != "vllm.ns.svc.cluster.local" {
				t.Errorf("backend %+v", b)
			}
		}},
		{"fleet section", "fleet: {warmup: 0s, dns_interval: 1s, config_poll: 0s, rejoin_grace: 2m}\nbackends: [{url: http://a:1}]", "", func(t *testing.T, c *Config) {
			if c.Fleet != (Fleet{DNSInterval: time.Second, RejoinGrace: 2 * time.Minute, DrainGrace: DefaultDrainGrace}) {
				t.Errorf("fleet %+v", c.Fleet)
			}
		}},
		{"rejoin grace under a second", "fleet: {rejoin_grace: 500ms}\nbackends: [{url: http://a:1}]", "fleet.rejoin_grace", nil},
		{"engine limits", "backends: [{url: http://a:1, max_num_seqs: 8, max_num_batched_tokens: 512}]", "", func(t *testing.T, c *Config) {
			if b := firstEntry(t, c); b.MaxNumSeqs != 8 || b.MaxNumBatchedTokens != 512 {
				t.Errorf("backend %+v", b)
			}
		}},
		{"preset", "backends: [{url: http://a:1, preset: a10g-mistral-7b}, {url: http://b:1}]", "", func(t *testing.T, c *Config) {
			es, err := c.Entries()
			if err != nil {
				t.Fatal(err)
			}
			p, err := engine.LookupPreset("a10g-mistral-7b")
			if err != nil {
				t.Fatal(err)
			}
			if want := p.Costs(); es[0].Prior == nil || *es[0].Prior != want || es[1].Prior != nil {
				t.Errorf("priors %v, %v, want %+v and none", es[0].Prior, es[1].Prior, want)
			}
		}},
		{"cache tiers", "backends: [{url: http://a:1, preset: h100-llama3-8b, cpu_kv_blocks: 65536, disk_load_time_per_token: 20us}, {url: http://b:1, cpu_load_time_per_token: 3us}]", "", func(t *testing.T, c *Config) {
			es, err := c.Entries()
			if err != nil {
				t.Fatal(err)
			}
			// The preset's host load kept beside the configured disk's; a
			// generic prior with the configured host load.
			if p := es[0].Prior; es[0].CPUKVBlocks != 65536 || p == nil || p.HostLoad != 2.56e-6 || p.DiskLoad != 20e-6 {
				t.Errorf("backend 0: %d blocks, prior %+v", es[0].CPUKVBlocks, p)
			}
			if p := es[1].Prior; p == nil || p.HostLoad != 3e-6 || p.Step != costmodel.Generic().Step {
				t.Errorf("backend 1: prior %+v", p)
			}
		}},
		{"negative cpu_kv_blocks", "backends: [{url: http://a:1, cpu_kv_blocks: -1}]", "backends[0].cpu_kv_blocks", nil},
		{"huge load time", "backends: [{url: http://a:1, cpu_load_time_per_token: 2s}]", "backends[0].cpu_load_time_per_token", nil},
		{"unknown preset", "backends: [{url: http://a:1, preset: b200-llama3-405b}]", "backends[0].preset: unknown engine preset \"b200-llama3-405b\" (known: ", nil},
		{"negative max_num_seqs", "backends: [{url: http://a:1, max_num_seqs: -1}]", "backends[0].max_num_seqs", nil},
		{"negative max_num_batched_tokens", "backends: [{url: http://a:1, max_num_batched_tokens: -1}]", "backends[0].max_num_batched_tokens", nil},
		{"bad discovery", "backends: [{url: http://a:1, discovery: consul}]", "backends[0].discovery", nil},
		{"srv on static", "backends: [{url: http://a:1, discovery: static, srv: _x._tcp.a}]", "backends[0].srv", nil},
		{"interval on static", "backends: [{url: http://a:1, dns_interval: 1s}]", "backends[0].dns_interval", nil},
		{"tiny interval", "backends: [{url: http://a:1, discovery: dns, dns_interval: 1ms}]", "backends[0].dns_interval", nil},
		{"srv without labels", "backends: [{srv: vllm.ns, discovery: dns}]", "backends[0].srv", nil},
		{"negative warmup", "fleet: {warmup: -1s}\nbackends: [{url: http://a:1}]", "fleet.warmup", nil},
		{"tiny fleet interval", "fleet: {dns_interval: 1ms}\nbackends: [{url: http://a:1}]", "fleet.dns_interval", nil},
		{"unknown fleet key", "fleet: {warm_up: 1s}\nbackends: [{url: http://a:1}]", "unknown key warm_up", nil},
	}
	runConfigCases(t, tests)
}

// configCase is a config file and what Parse and Validate make of it.
type configCase struct {
	name    string
	yaml    string
	wantErr string // "" means valid
	check   func(t *testing.T, c *Config)
}

func runConfigCases(t *testing.T, tests []configCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml))
			if err == nil {
				err = c.Validate()
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				tt.check(t, c)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: a\n")
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Watch(ctx, path, 5*time.Millisecond, func() { n.Add(1) }) }()
	defer func() { cancel(); <-done }()
	wait := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for n.Load() < want && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(30 * time.Millisecond) // no extra calls either
		if got := n.Load(); got != want {
			t.Fatalf("%d changes seen, want %d", got, want)
		}
	}
	wait(0)
	write("listen: b\n") // same size, new content
	wait(1)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	wait(1) // a missing file is no change
	write("listen: bb\n")
	wait(2)
}

// firstEntry is c's first backend entry with its derived values.
func firstEntry(t *testing.T, c *Config) Entry {
	t.Helper()
	es, err := c.Entries()
	if err != nil || len(es) == 0 {
		t.Fatalf("entries: %v (%d)", err, len(es))
	}
	return es[0]
}

// TestValidateDoesNotChange: what an entry leaves out is derived by
// Entries, never written back into the configuration, so that a config
// reads the same before and after Validate (a reload compares entries as
// written).
func TestValidateDoesNotChange(t *testing.T) {
	c, err := Parse([]byte("backends: [{url: 'http://a:1/'}, {srv: _http._tcp.vllm.ns.svc.cluster.local}]"))
	if err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprintf("%+v", *c)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if after := fmt.Sprintf("%+v", *c); after != before {
		t.Errorf("Validate changed the config:\n%s\n%s", before, after)
	}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if es[0].Name != "a:1" || es[0].Base.String() != "http://a:1" || es[1].URL != "http://vllm.ns.svc.cluster.local" || !es[1].DNS() {
		t.Errorf("entries %+v", es)
	}
}

func TestBackendTLSValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"backends: [{url: 'http://a:1', tls: {server_name: x}}]", "backends[0].tls: http://a:1 is not https"},
		{"backends: [{url: 'https://a:1', tls: {cert_file: c.pem}}]", "backends[0].tls: set both cert_file and key_file"},
		{"upstream: {tls: {key_file: k.pem}}\nbackends: [{url: 'https://a:1'}]", "upstream.tls: set both"},
		{"listen_tls: {cert_file: c.pem}\nbackends: [{url: 'https://a:1'}]", "listen_tls: set both"},
	} {
		c, err := Parse([]byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestKubernetesConfig: a kubernetes section implies discovery:
// kubernetes and a URL; exactly one source, a valid port and names, and
// no DNS keys are accepted; every key of the section is in the entry's
// Key, so that changing what it watches restarts the pool.
func TestKubernetesConfig(t *testing.T) {
	entry := func(check func(t *testing.T, e Entry)) func(t *testing.T, c *Config) {
		return func(t *testing.T, c *Config) { check(t, firstEntry(t, c)) }
	}
	runConfigCases(t, []configCase{
		{"service implies kubernetes and a url", "backends: [{kubernetes: {namespace: llm, service: vllm, port: 8000}}]", "", entry(func(t *testing.T, e Entry) {
			if e.Discovery != DiscoveryKubernetes || !e.Pooled() || e.DNS() || e.URL != "http://vllm.llm" || e.Name != "vllm.llm" || e.Kubernetes.Port != "8000" {
				t.Errorf("entry %+v", e.Backend)
			}
		})},
		{"selector with a port name, https url", "backends: [{url: https://vllm.llm.svc/, name: v, kubernetes: {selector: {app: vllm, kvroute.io/role: decode}, port: http}}]", "", entry(func(t *testing.T, e Entry) {
			if e.Base.Scheme != "https" || e.Kubernetes.Selector["kvroute.io/role"] != "decode" {
				t.Errorf("entry %+v", e.Backend)
			}
		})},
		{"inference pool", "backends: [{discovery: kubernetes, kubernetes: {inference_pool: llama, kubeconfig: /k}}]", "", entry(func(t *testing.T, e Entry) {
			if e.URL != "http://llama" || e.Kubernetes.Kubeconfig != "/k" {
				t.Errorf("entry %+v", e.Backend)
			}
		})},
		{"no source", "backends: [{kubernetes: {namespace: llm}}]", "exactly one of service, selector and inference_pool", nil},
		{"two sources", "backends: [{kubernetes: {service: a, inference_pool: b}}]", "exactly one", nil},
		{"selector without port", "backends: [{kubernetes: {selector: {app: a}}}]", "port: required with selector", nil},
		{"port with a pool", "backends: [{kubernetes: {inference_pool: a, port: 8000}}]", "leave it out", nil},
		{"port out of range", "backends: [{kubernetes: {service: a, port: 70000}}]", "not a port number", nil},
		{"bad port name", "backends: [{kubernetes: {service: a, port: Http_Port}}]", "not a port number or name", nil},
		{"bad namespace", "backends: [{kubernetes: {namespace: LLM, service: a}}]", "namespace", nil},
		{"bad label", "backends: [{kubernetes: {selector: {'a b': c}, port: 1}}]", "selector", nil},
		{"discovery without section", "backends: [{url: http://a:1, discovery: kubernetes}]", "needs a kubernetes section", nil},
		{"section on dns", "backends: [{url: http://a:1, discovery: dns, kubernetes: {service: a}}]", "needs discovery: kubernetes", nil},
		{"section on static", "backends: [{url: http://a:1, discovery: static, kubernetes: {service: a}}]", "needs discovery: kubernetes", nil},
		{"srv with kubernetes", "backends: [{discovery: kubernetes, srv: _a._tcp.b, kubernetes: {service: a}}]", "srv and dns_interval", nil},
		{"unknown key", "backends: [{kubernetes: {service: a, namespaces: b}}]", "unknown key namespaces", nil},
	})
	base := Kubernetes{Namespace: "a", Service: "s", Port: "1", Kubeconfig: "k"}
	for _, change := range []func(*Kubernetes){
		func(k *Kubernetes) { k.Namespace = "b" }, func(k *Kubernetes) { k.Service = "t" },
		func(k *Kubernetes) { k.Selector = map[string]string{"a": "b"} }, func(k *Kubernetes) { k.InferencePool = "p" },
		func(k *Kubernetes) { k.Port = "2" }, func(k *Kubernetes) { k.Kubeconfig = "l" },
	} {
		k := base
		change(&k)
		if k.key() == base.key() {
			t.Errorf("%+v and %+v have one key", k, base)
		}
	}
}
