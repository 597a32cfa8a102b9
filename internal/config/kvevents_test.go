package config

import (
	"strings"
	"testing"
)

func TestKVEventsValidate(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // "" for valid
	}{
		{"endpoint", "backends: [{url: 'http://a:1', kv_events: 'tcp://a:5557'}]", ""},
		{"bind", "backends: [{url: 'http://a:1', kv_events: 'tcp://*:5557', kv_events_bind: true}]", ""},
		{"port for a pool", "backends: [{url: 'http://vllm:8000', discovery: dns, kv_events: '5557', kv_events_replay: '5558'}]", ""},
		{"template", "backends: [{url: 'http://vllm:8000', discovery: dns, kv_events: 'tcp://{host}:5557'}]", ""},
		{"tokenizer URL", "kv_events: {tokenizer: 'http://tok:9000'}\nbackends: [{url: 'http://a:1'}]", ""},
		{"not tcp", "backends: [{url: 'http://a:1', kv_events: 'ipc:///tmp/x'}]", "backends[0].kv_events"},
		{"no port", "backends: [{url: 'http://a:1', kv_events: 'tcp://a'}]", "backends[0].kv_events"},
		{"bad port", "backends: [{url: 'http://a:1', kv_events: '70000'}]", "backends[0].kv_events"},
		{"bind without endpoint", "backends: [{url: 'http://a:1', kv_events_bind: true}]", "need kv_events"},
		{"bad replay", "backends: [{url: 'http://a:1', kv_events: '5557', kv_events_replay: 'tcp://x'}]", "backends[0].kv_events_replay"},
		{"bad tokenizer", "kv_events: {tokenizer: 'vllm'}\nbackends: [{url: 'http://a:1'}]", "kv_events.tokenizer"},
		{"zero timeout", "kv_events: {tokenize_timeout: 0s}\nbackends: [{url: 'http://a:1'}]", "kv_events.tokenize_timeout"},
		{"negative cache", "kv_events: {tokenize_cache: -1}\nbackends: [{url: 'http://a:1'}]", "kv_events.tokenize_cache"},
		{"zero block", "kv_events: {block_tokens: 0}\nbackends: [{url: 'http://a:1'}]", "kv_events.block_tokens"},
		{"zero ttl", "kv_events: {speculative_ttl: 0s}\nbackends: [{url: 'http://a:1'}]", "kv_events.speculative_ttl"},
		{"zero stale", "kv_events: {stale_after: 0s}\nbackends: [{url: 'http://a:1'}]", "kv_events.stale_after"},
		{"zero retrust", "kv_events: {retrust: 0s}\nbackends: [{url: 'http://a:1'}]", "kv_events.retrust"},
		{"zero blocks", "kv_events: {max_blocks_per_backend: 0}\nbackends: [{url: 'http://a:1'}]", "kv_events.max_blocks_per_backend"},
		{"message size", "kv_events: {max_message_bytes: 4MiB}\nbackends: [{url: 'http://a:1'}]", ""},
		{"zero message size", "kv_events: {max_message_bytes: 0}\nbackends: [{url: 'http://a:1'}]", "kv_events.max_message_bytes"},
		{"huge message size", "kv_events: {max_message_bytes: 2GiB}\nbackends: [{url: 'http://a:1'}]", "kv_events.max_message_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parse(t, tt.yaml).Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestKVEndpoint(t *testing.T) {
	tests := []struct {
		kv, host, want string
	}{
		{"", "10.0.0.1", ""},
		{"tcp://a:5557", "10.0.0.1", "tcp://a:5557"},
		{"5557", "10.0.0.1", "tcp://10.0.0.1:5557"},
		{"5557", "fd00::1", "tcp://[fd00::1]:5557"},
		{"tcp://{host}:6000", "10.0.0.2", "tcp://10.0.0.2:6000"},
		{"tcp://{host}:6000", "fd00::2", "tcp://[fd00::2]:6000"},
	}
	for _, tt := range tests {
		e := Entry{Backend: Backend{KVEvents: tt.kv}}
		if got := e.KVEndpoint(tt.host); got != tt.want {
			t.Errorf("KVEndpoint(%q) of %q = %q, want %q", tt.host, tt.kv, got, tt.want)
		}
	}
}

func TestKVEventsDefaults(t *testing.T) {
	c := Default()
	p := c.KVEvents.Precise()
	if p.BlockTokens != 16 || p.MaxBlocks != 65536 || p.SpeculativeTTL.Seconds() != 2 || c.KVEvents.Tokenizer != "backend" {
		t.Errorf("defaults %+v, %+v", c.KVEvents, p)
	}
}
