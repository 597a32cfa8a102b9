package config

import (
	"strings"
	"time"
)

// Fleet tunes how the set of backends changes while the router serves:
// backends discovered through DNS, backends added or removed by a reload,
// and the warm-up of a newcomer.
type Fleet struct {
	// Warmup is how long a backend added while the router serves (by a
	// reload or by DNS discovery) takes to reach its full share of
	// requests: its share rises linearly from 0 over this period, while
	// its prefill rate and cache are learned. Backends present at startup
	// take their full share at once. 0 disables warm-up. Default 30s.
	Warmup time.Duration `yaml:"warmup"`
	// DNSInterval is how often the names of backends with discovery: dns
	// are re-resolved, unless the backend sets its own dns_interval.
	// Default 10s.
	DNSInterval time.Duration `yaml:"dns_interval"`
	// ConfigPoll is how often `kvroute serve` checks its config file for a
	// change (modification time, size and content hash) and reloads it.
	// 0 disables the check; SIGHUP still reloads. Default 1s.
	ConfigPoll time.Duration `yaml:"config_poll"`
}

// Defaults of the fleet section and of backends' discovery.
const (
	DefaultWarmup      = 30 * time.Second
	DefaultDNSInterval = 10 * time.Second
	DefaultConfigPoll  = time.Second
	// MinDNSInterval keeps a typo from turning the router into a DNS
	// load generator.
	MinDNSInterval = 100 * time.Millisecond
)

// Discovery modes of a backend entry.
const (
	// DiscoveryStatic: the URL is one backend. The default.
	DiscoveryStatic = "static"
	// DiscoveryDNS: the URL's host is a DNS name re-resolved every
	// dns_interval; each of its A/AAAA addresses is a backend on the
	// URL's port (or, with srv, each SRV target and port is one).
	DiscoveryDNS = "dns"
)

func defaultFleet() Fleet {
	return Fleet{Warmup: DefaultWarmup, DNSInterval: DefaultDNSInterval, ConfigPoll: DefaultConfigPoll}
}

// IsDNS reports whether the entry is a DNS-discovered pool.
func (b *Backend) IsDNS() bool { return b.Discovery == DiscoveryDNS || b.SRV != "" }

// prepareDiscovery fills in what an SRV entry leaves out (its URL, from the
// SRV name without its _service._proto labels, so that logs and names read
// well; only its scheme and path are used) before the URL is checked.
func (b *Backend) prepareDiscovery() {
	if b.SRV != "" && b.URL == "" {
		host := b.SRV
		for range 2 {
			if strings.HasPrefix(host, "_") {
				if i := strings.IndexByte(host, '.'); i >= 0 {
					host = host[i+1:]
				}
			}
		}
		b.URL = "http://" + host
	}
	if b.SRV != "" && b.Discovery == "" {
		b.Discovery = DiscoveryDNS
	}
}

// validate checks the fleet section.
func (f *Fleet) validate(bad func(string, ...any)) {
	if f.Warmup < 0 {
		bad("fleet.warmup: %v must not be negative", f.Warmup)
	}
	if f.DNSInterval < MinDNSInterval {
		bad("fleet.dns_interval: %v must be at least %v", f.DNSInterval, MinDNSInterval)
	}
	if f.ConfigPoll < 0 {
		bad("fleet.config_poll: %v must not be negative", f.ConfigPoll)
	}
}

// validateDiscovery checks backends[i]'s discovery keys.
func (b *Backend) validateDiscovery(i int, bad func(string, ...any)) {
	switch b.Discovery {
	case "", DiscoveryStatic:
		if b.SRV != "" {
			bad("backends[%d].srv: needs discovery: dns", i)
		}
		if b.DNSInterval != 0 {
			bad("backends[%d].dns_interval: needs discovery: dns", i)
		}
	case DiscoveryDNS:
		if b.DNSInterval != 0 && b.DNSInterval < MinDNSInterval {
			bad("backends[%d].dns_interval: %v must be at least %v", i, b.DNSInterval, MinDNSInterval)
		}
		if b.SRV != "" && !strings.HasPrefix(b.SRV, "_") {
			bad("backends[%d].srv: %q must be a full SRV name such as _http._tcp.vllm.ns.svc.cluster.local", i, b.SRV)
		}
	default:
		bad("backends[%d].discovery: %q is not static or dns", i, b.Discovery)
	}
}
