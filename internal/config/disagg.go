package config

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

// Backend roles (backends[].role): which part of a disaggregated request
// an engine serves.
const (
	// RoleBoth serves whole requests, and the decode leg of a split one
	// (the default: today's behaviour).
	RoleBoth = "both"
	// RolePrefill serves prefill legs only: it computes a prompt's KV
	// cache and hands it to a decode engine.
	RolePrefill = "prefill"
	// RoleDecode serves decode legs (and whole requests when no prefill
	// engine can take the prefill).
	RoleDecode = "decode"
)

// Disaggregation protocols (disaggregation.protocol).
const (
	// ProtocolVLLM is vLLM's KV connectors (NixlConnector and those with
	// its fields): a prefill leg with max_tokens 1 whose answer's
	// kv_transfer_params go with the decode leg.
	ProtocolVLLM = "vllm"
	// ProtocolSGLang is SGLang's: one body with bootstrap_host,
	// bootstrap_port and bootstrap_room, sent to both engines at once.
	ProtocolSGLang = "sglang"
)

// Disaggregation is how requests are split over prefill and decode
// engines (backends[].role); it does nothing without a prefill engine.
type Disaggregation struct {
	// Protocol is the engines' KV transfer protocol: vllm or sglang.
	// Default vllm.
	Protocol string `yaml:"protocol"`
	// BootstrapPort is the prefill engines' bootstrap port (SGLang's
	// --disaggregation-bootstrap-port), for protocol sglang. Default 8998.
	BootstrapPort int `yaml:"bootstrap_port"`
	// Split is which requests are split: conditional (those whose split
	// is cheaper than serving them whole, by disagg.Decide) or always
	// (every request a prefill engine can take). Default conditional.
	Split string `yaml:"split"`
	// KVTransferLatency is the fixed time of one request's KV transfer
	// from a prefill to a decode engine (the connector's handshake), and
	// KVTransferTimePerToken the time per prompt token carried: what
	// the conditional split weighs against the stall it saves. Defaults:
	// the DefaultTransferPreset engine preset's (docs/engine.md).
	KVTransferLatency      time.Duration `yaml:"kv_transfer_latency"`
	KVTransferTimePerToken time.Duration `yaml:"kv_transfer_time_per_token"`
	// TransferHosts are the side-channel hosts a vLLM prefill answer's
	// kv_transfer_params may name (remote_host) besides its prefill
	// engine's own host: for engines whose side channel listens on
	// another interface than their HTTP server. Default none.
	TransferHosts []string `yaml:"transfer_hosts"`
}

// Split modes (disaggregation.split).
const (
	// SplitConditional splits a request when disagg.Decide says its split
	// is cheaper than serving it whole.
	SplitConditional = "conditional"
	// SplitAlways splits every request that a prefill engine can take.
	SplitAlways = "always"
)

// DefaultTransferPreset is the engine preset whose KV transfer figures
// are disaggregation's defaults: Llama-3.1-8B on H100s with 400 Gb/s
// NICs, two side-channel round trips of 50 µs (100 µs) and 128 KiB of
// KV cache per token at 80% of the link (3.28 µs a token).
const DefaultTransferPreset = "h100-llama3-8b"

// maxTransferLatency and maxTransferPerToken bound the transfer figures:
// far above any connector's (a 10 s handshake, 10 ms a token: a prompt
// of 8k tokens a minute and a half), they catch a unit mistaken.
const (
	maxTransferLatency  = 10 * time.Second
	maxTransferPerToken = 10 * time.Millisecond
)

// defaultDisaggregation is the section's defaults.
func defaultDisaggregation() Disaggregation {
	d := Disaggregation{Protocol: ProtocolVLLM, BootstrapPort: DefaultBootstrapPort, Split: SplitConditional}
	if p, err := engine.LookupPreset(DefaultTransferPreset); err == nil {
		d.KVTransferLatency, d.KVTransferTimePerToken = p.KVTransferLatency, p.KVTransferPerToken
	}
	return d
}

// DefaultBootstrapPort is SGLang's default bootstrap port.
const DefaultBootstrapPort = 8998

// Split reports whether some backend is a prefill engine: requests are then
// split (routed as a prefill and a decode leg) where they can be.
func (c *Config) Split() bool {
	return slices.ContainsFunc(c.Backends, func(b Backend) bool { return b.Role == RolePrefill })
}

// MaySplit reports whether requests may be split: some backend is a
// prefill engine (Split), or is a Kubernetes pool whose pods' labels
// (kvroute.io/role) may make them prefill engines. Which requests are
// split is then decided per request by the live fleet's roles.
func (c *Config) MaySplit() bool {
	return c.Split() || slices.ContainsFunc(c.Backends, func(b Backend) bool {
		return b.Kubernetes != nil || b.Discovery == DiscoveryKubernetes
	})
}

// RoleOf is an entry's role, both when unset.
func RoleOf(b *Backend) string {
	if b.Role == "" {
		return RoleBoth
	}
	return b.Role
}

// validateRoles checks the backends' roles and the disaggregation section:
// every model a prefill engine serves must have an engine to decode it
// (a decode or both engine serving it, or serving any model).
func (c *Config) validateRoles(bad func(string, ...any)) {
	d := c.Disaggregation
	if d.Protocol != ProtocolVLLM && d.Protocol != ProtocolSGLang {
		bad("disaggregation.protocol: %q must be vllm or sglang", d.Protocol)
	}
	if d.BootstrapPort < 1 || d.BootstrapPort > 65535 {
		bad("disaggregation.bootstrap_port: %d must be a port (1-65535)", d.BootstrapPort)
	}
	if d.Split != SplitConditional && d.Split != SplitAlways {
		bad("disaggregation.split: %q must be conditional or always", d.Split)
	}
	if d.KVTransferLatency < 0 || d.KVTransferLatency > maxTransferLatency {
		bad("disaggregation.kv_transfer_latency: %s must be in [0, %s]", d.KVTransferLatency, maxTransferLatency)
	}
	if d.KVTransferTimePerToken < 0 || d.KVTransferTimePerToken > maxTransferPerToken {
		bad("disaggregation.kv_transfer_time_per_token: %s must be in [0, %s]", d.KVTransferTimePerToken, maxTransferPerToken)
	}
	decodes := func(model string) bool {
		for i := range c.Backends {
			b := &c.Backends[i]
			if RoleOf(b) == RolePrefill {
				continue
			}
			if len(b.Models) == 0 || (model != "" && slices.Contains(b.Models, model)) {
				return true
			}
		}
		return false
	}
	for i := range c.Backends {
		b := &c.Backends[i]
		switch b.Role {
		case "", RoleBoth, RoleDecode:
			continue
		case RolePrefill:
		default:
			bad("backends[%d].role: %q must be prefill, decode or both", i, b.Role)
			continue
		}
		if len(b.Models) == 0 && !decodes("") {
			bad("backends[%d]: a prefill engine serving any model needs a decode (or both) engine serving any model", i)
		}
		for _, m := range b.Models {
			if !decodes(m) {
				bad("backends[%d]: prefill engine for model %q, but no decode (or both) engine serves it", i, m)
			}
		}
	}
}
