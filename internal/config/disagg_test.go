package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
)

func TestDisaggregationConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		wantErr    string // "" means valid
		split      bool
	}{
		{"no roles: both, no split", "backends: [{url: http://a:1}]", "", false},
		{"prefill and decode", "backends: [{url: http://p:1, role: prefill, models: [m]}, {url: http://d:1, role: decode, models: [m]}]", "", true},
		{"a both engine decodes", "backends: [{url: http://p:1, role: prefill, models: [m]}, {url: http://d:1, role: both}]", "", true},
		{"an any-model decode engine decodes m", "backends: [{url: http://p:1, role: prefill, models: [m]}, {url: http://d:1, role: decode}]", "", true},
		{"dns pool with a role", "backends: [{url: http://prefill.ns.svc:8000, discovery: dns, role: prefill}, {url: http://d:1, role: decode}]", "", true},
		{"no decode engine", "backends: [{url: http://p:1, role: prefill, models: [m]}]", `prefill engine for model "m", but no decode`, true},
		{"decode engine for another model", "backends: [{url: http://p:1, role: prefill, models: [m]}, {url: http://d:1, role: decode, models: [n]}]", `model "m"`, true},
		{"any-model prefill, one-model decode", "backends: [{url: http://p:1, role: prefill}, {url: http://d:1, role: decode, models: [n]}]", "serving any model needs", true},
		{"unknown role", "backends: [{url: http://p:1, role: prefil}]", `backends[0].role: "prefil"`, false},
		{"sglang", "disaggregation: {protocol: sglang, bootstrap_port: 9000}\nbackends: [{url: http://a:1}]", "", false},
		{"unknown protocol", "disaggregation: {protocol: mooncake}\nbackends: [{url: http://a:1}]", `disaggregation.protocol: "mooncake"`, false},
		{"bad port", "disaggregation: {bootstrap_port: 70000}\nbackends: [{url: http://a:1}]", "disaggregation.bootstrap_port: 70000", false},
		{"split always", "disaggregation: {split: always}\nbackends: [{url: http://a:1}]", "", false},
		{"unknown split", "disaggregation: {split: sometimes}\nbackends: [{url: http://a:1}]", `disaggregation.split: "sometimes"`, false},
		{"transfer figures", "disaggregation: {kv_transfer_latency: 2ms, kv_transfer_time_per_token: 5us}\nbackends: [{url: http://a:1}]", "", false},
		{"negative latency", "disaggregation: {kv_transfer_latency: -1ms}\nbackends: [{url: http://a:1}]", "disaggregation.kv_transfer_latency: -1ms", false},
		{"per token in seconds", "disaggregation: {kv_transfer_time_per_token: 3s}\nbackends: [{url: http://a:1}]", "disaggregation.kv_transfer_time_per_token: 3s", false},
		{"unknown key", "disaggregation: {kv_transfer_per_token: 3us}\nbackends: [{url: http://a:1}]", "kv_transfer_per_token", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml))
			if err == nil {
				err = c.Validate()
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			if c != nil && c.Split() != tt.split {
				t.Errorf("Split() = %v, want %v", c.Split(), tt.split)
			}
		})
	}
}

func TestDisaggregationDefaults(t *testing.T) {
	c, err := Parse([]byte("backends: [{url: http://a:1}]"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := engine.LookupPreset(DefaultTransferPreset)
	if err != nil {
		t.Fatal(err)
	}
	want := Disaggregation{Protocol: ProtocolVLLM, BootstrapPort: DefaultBootstrapPort, Split: SplitConditional,
		KVTransferLatency: p.KVTransferLatency, KVTransferTimePerToken: p.KVTransferPerToken}
	if !reflect.DeepEqual(c.Disaggregation, want) || RoleOf(&c.Backends[0]) != RoleBoth {
		t.Errorf("disaggregation %+v, role %q: want %+v", c.Disaggregation, RoleOf(&c.Backends[0]), want)
	}
	if want.KVTransferLatency <= 0 || want.KVTransferTimePerToken <= 0 {
		t.Errorf("preset %s has no transfer figures: %+v", DefaultTransferPreset, p)
	}
}

// TestRoleInKey: a backend whose role changes on a reload is a different
// backend (the role decides which legs it may take).
func TestRoleInKey(t *testing.T) {
	a := firstEntry(t, &Config{Backends: []Backend{{URL: "http://a:1"}}})
	b := firstEntry(t, &Config{Backends: []Backend{{URL: "http://a:1", Role: RolePrefill}}})
	both := firstEntry(t, &Config{Backends: []Backend{{URL: "http://a:1", Role: RoleBoth}}})
	if a.Key() == b.Key() || a.Key() != both.Key() {
		t.Errorf("keys: unset %q, prefill %q, both %q", a.Key(), b.Key(), both.Key())
	}
}
