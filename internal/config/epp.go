package config

import "net"

// EPP serves kvroute as a Gateway API Inference Extension Endpoint Picker:
// an Envoy external processor (ext_proc) that a gateway asks where each
// request goes, the gateway forwarding the bytes itself. Off without
// listen.
type EPP struct {
	// Listen is the ext_proc gRPC listener's address (conventionally
	// ":9002"); "" turns the picker off.
	Listen string `yaml:"listen"`
	// HealthListen is the gRPC health service's address (conventionally
	// ":9003"): liveness, readiness and the ext_proc service. Default:
	// health is served on listen only.
	HealthListen string `yaml:"health_listen"`
	// Fallbacks is how many further endpoints the picker names after its
	// pick, in order, for a data plane that retries down the list. Default
	// 0: some data planes take only one endpoint.
	Fallbacks int `yaml:"fallbacks"`
}

// MaxEPPFallbacks bounds epp.fallbacks.
const MaxEPPFallbacks = 16

func (e *EPP) validate(bad func(string, ...any)) {
	for _, a := range []struct{ key, addr string }{{"epp.listen", e.Listen}, {"epp.health_listen", e.HealthListen}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			bad("%s: %q is not host:port: %v", a.key, a.addr, err)
		}
	}
	if e.HealthListen != "" && e.Listen == "" {
		bad("epp.health_listen: set without epp.listen")
	}
	if e.Fallbacks < 0 || e.Fallbacks > MaxEPPFallbacks {
		bad("epp.fallbacks: %d must be between 0 and %d", e.Fallbacks, MaxEPPFallbacks)
	}
}
