package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAdmissionDefaultsOff(t *testing.T) {
	c := parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\n")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Admission.Enabled() {
		t.Error("admission must be off by default")
	}
	if c.Admission.MaxQueue != 1024 || c.Admission.MaxWait != 30*time.Second || c.Admission.TenantHeader != "" {
		t.Errorf("defaults %+v", c.Admission)
	}
}

func TestAdmissionParse(t *testing.T) {
	c := parse(t, `backends: [{url: 'http://127.0.0.1:9000'}]
admission:
  max_inflight_per_backend: 8
  max_pending_prefill_tokens_per_backend: 32000
  max_engine_waiting: 4
  max_queue: 50
  max_wait: 5s
  tenant_header: X-Team
  trusted_priority_cidrs: [10.1.0.0/16, 192.0.2.7]
  key_priorities: [{key: "sha256:8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", priority: 10}]
  late_binding: true
  order: fcfs
  deadline_slack: 4
  deadline_cap: 2s
`)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Admission{MaxInFlightPerBackend: 8, MaxPendingPrefillTokensPerBackend: 32000, MaxEngineWaiting: 4, MaxQueue: 50, MaxWait: 5 * time.Second, TenantHeader: "X-Team",
		TrustedPriorityCIDRs: []string{"10.1.0.0/16", "192.0.2.7"},
		KeyPriorities:        []KeyPriority{{Key: "sha256:8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4", Priority: 10}},
		LateBinding:          true, Order: "fcfs", DeadlineSlack: 4, DeadlineCap: 2 * time.Second}
	if !reflect.DeepEqual(c.Admission, want) || !c.Admission.Enabled() {
		t.Errorf("got %+v, want %+v", c.Admission, want)
	}
}

func TestAdmissionValidate(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"max_inflight_per_backend: -1", "admission.max_inflight_per_backend"},
		{"max_pending_prefill_tokens_per_backend: -5", "admission.max_pending_prefill_tokens_per_backend"},
		{"max_engine_waiting: -2", "admission.max_engine_waiting"},
		{"max_queue: 0", "admission.max_queue"},
		{"max_wait: 0s", "admission.max_wait"},
		{"order: wspt", "admission.order"},
		{"deadline_slack: 0", "admission.deadline_slack"},
		{"deadline_slack: -1", "admission.deadline_slack"},
		{"deadline_slack: .nan", "admission.deadline_slack"},
		{"deadline_cap: 0s", "admission.deadline_cap"},
		{"trusted_priority_cidrs: [10.0.0.0/33]", "admission.trusted_priority_cidrs[0]"},
		{"trusted_priority_cidrs: [gateway]", "admission.trusted_priority_cidrs[0]"},
		{"key_priorities: [{key: 'sha256:abc', priority: 1}]", "admission.key_priorities[0].key"},
		{"key_priorities: [{key: '', priority: 1}]", "admission.key_priorities[0].key"},
		{"key_priorities: [{key: k, priority: 1000001}]", "admission.key_priorities[0].priority"},
	} {
		c := parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\nadmission: {"+tc.yaml+"}\n")
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.yaml, err, tc.want)
		}
	}
	if _, err := Parse([]byte("admission: {max_inflight: 3}\n")); err == nil || !strings.Contains(err.Error(), "max_inflight") {
		t.Errorf("misspelt key: %v", err)
	}
}

// TestLateBindingDefaults: late_binding alone turns admission on with a
// bound of four prefill steps and the deadline order; an explicit bound and
// order win.
func TestLateBindingDefaults(t *testing.T) {
	c := parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\nadmission: {late_binding: true}\n")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a := c.Admission
	if !a.Enabled() || a.PendingPrefillLimit() != 32768 || a.QueueOrder() != "deadline" || a.DeadlineSlack != 4 || a.DeadlineCap != 5*time.Second {
		t.Errorf("late_binding alone: enabled %v, bound %d, order %q, slack %v", a.Enabled(), a.PendingPrefillLimit(), a.QueueOrder(), a.DeadlineSlack)
	}
	c = parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\nadmission: {late_binding: true, max_pending_prefill_tokens_per_backend: 4096, order: fcfs}\n")
	if a := c.Admission; a.PendingPrefillLimit() != 4096 || a.QueueOrder() != "fcfs" {
		t.Errorf("explicit: bound %d, order %q", a.PendingPrefillLimit(), a.QueueOrder())
	}
	c = parse(t, "backends: [{url: 'http://127.0.0.1:9000'}]\nadmission: {max_inflight_per_backend: 2}\n")
	if a := c.Admission; a.PendingPrefillLimit() != 0 || a.QueueOrder() != "fcfs" {
		t.Errorf("without late binding: bound %d, order %q", a.PendingPrefillLimit(), a.QueueOrder())
	}
}
