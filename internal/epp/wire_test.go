package epp

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/request"
)

// TestKindOf: the path names the kind; a data plane that sends none has
// it told from the body.
func TestKindOf(t *testing.T) {
	for _, tt := range []struct {
		path, body string
		want       request.Kind
	}{
		{"/v1/chat/completions", `{}`, request.Chat},
		{"/v1/completions?x=1", `{"messages":[]}`, request.Completion},
		{"/v1/responses", `{}`, request.Responses},
		{"/v1/messages", `{}`, request.Messages},
		{"", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, request.Chat},
		{"", `{"model":"m","prompt":"hi"}`, request.Completion},
		{"", `{"model":"m","input":"hi"}`, request.Responses},
		{"", `{"input":"x","messages":[]}`, request.Chat},
		{"", `not json`, request.Completion},
		{"/other", `{"messages":[]}`, request.Chat},
	} {
		if got := kindOf(tt.path, []byte(tt.body)); got != tt.want {
			t.Errorf("kindOf(%q, %s) = %v, want %v", tt.path, tt.body, got, tt.want)
		}
	}
}

// TestMetadata: the subset hint and the served endpoint as the protocol
// writes them, and what is not them.
func TestMetadata(t *testing.T) {
	md := func(ns string, fields map[string]any) *corev3.Metadata {
		s, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: s}}
	}
	for _, tt := range []struct {
		name   string
		md     *corev3.Metadata
		subset []string
		hinted bool
		served string
	}{
		{"none", nil, nil, false, ""},
		{"subset", md(MetadataSubset, map[string]any{KeySubset: []any{"10.0.0.1:8000", "10.0.0.2:8000"}}), []string{"10.0.0.1:8000", "10.0.0.2:8000"}, true, ""},
		{"empty subset", md(MetadataSubset, map[string]any{KeySubset: []any{}}), nil, true, ""},
		{"subset not a list", md(MetadataSubset, map[string]any{KeySubset: "10.0.0.1:8000"}), nil, true, ""},
		{"served", md(MetadataLB, map[string]any{KeyServed: "10.0.0.3:8000"}), nil, false, "10.0.0.3:8000"},
		{"served elsewhere", md(MetadataSubset, map[string]any{KeyServed: "10.0.0.3:8000"}), nil, false, ""},
	} {
		subset, hinted := subsetOf(tt.md)
		if len(subset) != len(tt.subset) || hinted != tt.hinted || servedOf(tt.md) != tt.served {
			t.Errorf("%s: subset %v (%v), served %q; want %v (%v), %q", tt.name, subset, hinted, servedOf(tt.md), tt.subset, tt.hinted, tt.served)
		}
	}
}

// TestHeaderValue: raw_value (Envoy) wins over value (a minimal data
// plane).
func TestHeaderValue(t *testing.T) {
	if v := headerValue(&corev3.HeaderValue{Key: "a", RawValue: []byte("raw"), Value: "v"}); v != "raw" {
		t.Errorf("raw and value: %q", v)
	}
	if v := headerValue(&corev3.HeaderValue{Key: "a", Value: "v"}); v != "v" {
		t.Errorf("value only: %q", v)
	}
}
