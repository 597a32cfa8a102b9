package kvevents

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// vllmConfig is vLLM's KVEventsConfig (vllm/config/kv_events.py), the JSON
// of --kv-events-config.
type vllmConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           *string `json:"publisher"`
	Endpoint            *string `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	BufferSteps         *int    `json:"buffer_steps"`
	HWM                 *int    `json:"hwm"`
	MaxQueueSize        *int    `json:"max_queue_size"`
	Topic               string  `json:"topic"`
}

// ParseConfig reads vLLM's --kv-events-config JSON: enable_kv_cache_events
// (default false), publisher ("zmq" or "null"; default "zmq" when enabled,
// else "null"), endpoint (default tcp://*:5557), replay_endpoint (default
// none), topic (default ""), buffer_steps (default 10,000), hwm (default
// 100,000) and max_queue_size (accepted; the publisher has no queue of its
// own to bound). Unknown keys are an error, as in vLLM. on is false when
// events are disabled or the publisher is "null".
func ParseConfig(data []byte) (cfg PublisherConfig, on bool, err error) {
	var v vllmConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return cfg, false, fmt.Errorf("kv events config: %w", err)
	}
	if dec.More() {
		return cfg, false, fmt.Errorf("kv events config: data after the JSON object")
	}
	publisher := "null"
	if v.EnableKVCacheEvents {
		publisher = "zmq"
	}
	if v.Publisher != nil {
		publisher = *v.Publisher
	}
	switch publisher {
	case "zmq", "null":
	default:
		return cfg, false, fmt.Errorf("kv events config: unknown publisher %q (want zmq or null)", publisher)
	}
	cfg = PublisherConfig{Endpoint: "tcp://*:5557", Topic: v.Topic, BufferSteps: 10_000, HWM: 100_000}
	if v.Endpoint != nil {
		cfg.Endpoint = *v.Endpoint
	}
	if v.ReplayEndpoint != nil {
		cfg.ReplayEndpoint = *v.ReplayEndpoint
	}
	for _, f := range []struct {
		name string
		v    *int
		dst  *int
	}{{"buffer_steps", v.BufferSteps, &cfg.BufferSteps}, {"hwm", v.HWM, &cfg.HWM}, {"max_queue_size", v.MaxQueueSize, nil}} {
		if f.v == nil {
			continue
		}
		if *f.v <= 0 {
			return cfg, false, fmt.Errorf("kv events config: %s must be positive, got %d", f.name, *f.v)
		}
		if f.dst != nil {
			*f.dst = *f.v
		}
	}
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return cfg, false, fmt.Errorf("kv events config: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return cfg, false, fmt.Errorf("kv events config: replay: %w", err)
		}
	}
	return cfg, v.EnableKVCacheEvents && publisher == "zmq", nil
}
