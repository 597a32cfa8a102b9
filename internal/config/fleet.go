package config

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
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
	// RejoinGrace is how long a removed backend (gone from DNS, from the
	// config, or from the discovery source) keeps its slot: if a backend
	// of the same name returns within it, it gets its prefix index and
	// learned prefill rate back. After it, the backend's record, metric
	// series and index are deleted and its slot is free for another.
	// At least 1s (fleet.MinGrace: a request routed just before the
	// removal must still find the backend's record). Default 30s.
	RejoinGrace time.Duration `yaml:"rejoin_grace"`
	// ConfigPoll is how often `kvroute serve` checks its config file for a
	// change (modification time, size and content hash) and reloads it.
	// 0 disables the check; SIGHUP still reloads. Default 1s.
	ConfigPoll time.Duration `yaml:"config_poll"`
	// DrainGrace is how long the streams of a draining backend (removed
	// from the config or its pool, a terminating Kubernetes endpoint, an
	// admin drain) may go on there before they are moved to another
	// engine (migration.max_attempts above 0; with it 0 they run to
	// their end, however long). 0 moves them at once. Default 30s.
	DrainGrace time.Duration `yaml:"drain_grace"`
}

// Defaults of the fleet section and of backends' discovery.
const (
	DefaultWarmup      = 30 * time.Second
	DefaultDNSInterval = 10 * time.Second
	DefaultConfigPoll  = time.Second
	DefaultRejoinGrace = fleet.DefaultGrace
	DefaultDrainGrace  = 30 * time.Second
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
	// DiscoveryKubernetes: the endpoints that the entry's kubernetes
	// section names, followed through the Kubernetes API (kubernetes.go).
	DiscoveryKubernetes = "kubernetes"
)

func defaultFleet() Fleet {
	return Fleet{Warmup: DefaultWarmup, DNSInterval: DefaultDNSInterval, ConfigPoll: DefaultConfigPoll, RejoinGrace: DefaultRejoinGrace,
		DrainGrace: DefaultDrainGrace}
}

// Entry is one backends[] entry as the router uses it: the entry as
// written, with its URL parsed once and what it leaves out derived (its
// name, an SRV entry's URL, its discovery mode).
type Entry struct {
	Backend
	// Index is the entry's position in backends[], for messages.
	Index int
	// Base is the parsed URL: the backend itself for a static entry; for a
	// DNS entry, the scheme, port and path its resolved addresses take.
	Base *url.URL
	// EngineKind is the parsed kind (adapter.Unknown: detect it). A
	// discovered backend's role (Backend.Role) may come from its pod's
	// kvroute.io/role label instead of the entry.
	EngineKind adapter.Kind
	// Prior is the cost model prior of the named preset (Backend.Preset),
	// nil for none.
	Prior *costmodel.Prior
}

// DNS reports whether the entry is a pool of DNS-discovered backends.
func (e Entry) DNS() bool { return e.Discovery == DiscoveryDNS }

// Pooled reports whether the entry is a pool whose backends are discovered
// (through DNS or the Kubernetes API) rather than one backend.
func (e Entry) Pooled() bool { return e.DNS() || e.Discovery == DiscoveryKubernetes }

// Key identifies an entry across reloads: an entry whose key changed is a
// different backend (removed, and the new one added), since its URL,
// models, name, kind, KV event stream and role are fixed for a backend's life. Its context length
// is not part of it: a reload updates that in place.
func (e *Entry) Key() string {
	return strings.Join([]string{e.Base.String(), e.Name, strings.Join(e.Models, ","), e.Kind, e.Discovery, e.SRV,
		e.KVEvents, e.KVEventsReplay, strconv.FormatBool(e.KVEventsBind), tlsKey(e.TLS), e.Kubernetes.key(), RoleOf(&e.Backend)}, "\x00")
}

// tlsKey is an entry's TLS settings as part of its Key.
func tlsKey(t *BackendTLS) string {
	if t == nil {
		return ""
	}
	return strings.Join([]string{t.CAFile, t.CertFile, t.KeyFile, t.ServerName}, "\x01")
}

// Entries returns the backends of c with their derived values; the error
// is Validate's for the backends list. It does not change c.
func (c *Config) Entries() ([]Entry, error) {
	var errs []error
	out := c.entries(func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) })
	return out, errors.Join(errs...)
}

// entries derives and checks every entry, reporting problems to bad; it
// returns the entries that passed.
func (c *Config) entries(bad func(string, ...any)) []Entry {
	out := make([]Entry, 0, len(c.Backends))
	names := map[string]int{}
	urls := map[string]int{}
	for i := range c.Backends {
		e := Entry{Backend: c.Backends[i], Index: i}
		e.Models = append([]string(nil), e.Models...)
		e.derive()
		e.validateDiscovery(i, bad)
		u, err := ParseBackendURL(e.URL)
		if err != nil {
			bad("backends[%d].url: %v", i, err)
			continue
		}
		e.Base = u
		e.TLS.validate(fmt.Sprintf("backends[%d].tls", i), bad)
		if e.TLS != nil && u.Scheme != "https" {
			bad("backends[%d].tls: %s is not https; TLS settings apply to https URLs only", i, u)
		}
		if j, dup := urls[u.String()]; dup {
			bad("backends[%d].url: %s is also backends[%d]", i, u, j)
		}
		urls[u.String()] = i
		if e.Name == "" {
			e.Name = u.Host
		}
		if j, dup := names[e.Name]; dup {
			bad("backends[%d].name: %q is also the name of backends[%d]", i, e.Name, j)
		}
		names[e.Name] = i
		k, err := adapter.ParseKind(e.Kind)
		if err != nil {
			bad("backends[%d].kind: %v", i, err)
		}
		e.EngineKind = k
		for k, m := range e.Models {
			if m == "" {
				bad("backends[%d].models[%d]: empty model name", i, k)
			}
		}
		if e.MaxModelLen < 0 {
			bad("backends[%d].max_model_len: %d must not be negative", i, e.MaxModelLen)
		}
		if e.MaxNumSeqs < 0 {
			bad("backends[%d].max_num_seqs: %d must not be negative", i, e.MaxNumSeqs)
		}
		if e.MaxNumBatchedTokens < 0 {
			bad("backends[%d].max_num_batched_tokens: %d must not be negative", i, e.MaxNumBatchedTokens)
		}
		if e.Preset != "" {
			if p, err := engine.LookupPreset(e.Preset); err != nil {
				bad("backends[%d].preset: %v", i, err)
			} else {
				c := p.Costs()
				e.Prior = &c
			}
		}
		e.validateTiers(i, bad)
		e.validateKVEvents(i, bad)
		out = append(out, e)
	}
	return out
}

// derive fills in what an SRV entry leaves out (its URL, from the SRV
// name without its _service._proto labels, so that logs and names read
// well; only its scheme and path are used) and the discovery mode an SRV
// name implies.
func (e *Entry) derive() {
	if e.SRV != "" && e.URL == "" {
		host := e.SRV
		for range 2 {
			if strings.HasPrefix(host, "_") {
				if i := strings.IndexByte(host, '.'); i >= 0 {
					host = host[i+1:]
				}
			}
		}
		e.URL = "http://" + host
	}
	if e.SRV != "" && e.Discovery == "" {
		e.Discovery = DiscoveryDNS
	}
	if e.Kubernetes != nil {
		if e.URL == "" {
			e.URL = "http://" + e.Kubernetes.host()
		}
		if e.Discovery == "" {
			e.Discovery = DiscoveryKubernetes
		}
	}
	if e.Discovery == "" {
		e.Discovery = DiscoveryStatic
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
	if f.RejoinGrace < fleet.MinGrace {
		bad("fleet.rejoin_grace: %v must be at least %v", f.RejoinGrace, fleet.MinGrace)
	}
	if f.DrainGrace < 0 {
		bad("fleet.drain_grace: %v must not be negative", f.DrainGrace)
	}
}

// validateDiscovery checks backends[i]'s discovery keys.
func (b *Entry) validateDiscovery(i int, bad func(string, ...any)) {
	switch b.Discovery {
	case "", DiscoveryStatic:
		if b.SRV != "" {
			bad("backends[%d].srv: needs discovery: dns", i)
		}
		if b.DNSInterval != 0 {
			bad("backends[%d].dns_interval: needs discovery: dns", i)
		}
		if b.Kubernetes != nil {
			bad("backends[%d].kubernetes: needs discovery: kubernetes", i)
		}
	case DiscoveryKubernetes:
		if b.SRV != "" || b.DNSInterval != 0 {
			bad("backends[%d]: srv and dns_interval need discovery: dns, not kubernetes", i)
		}
		if b.Kubernetes == nil {
			bad("backends[%d].kubernetes: discovery: kubernetes needs a kubernetes section (service, selector or inference_pool)", i)
		}
		b.Kubernetes.validate(fmt.Sprintf("backends[%d].kubernetes", i), bad)
	case DiscoveryDNS:
		if b.DNSInterval != 0 && b.DNSInterval < MinDNSInterval {
			bad("backends[%d].dns_interval: %v must be at least %v", i, b.DNSInterval, MinDNSInterval)
		}
		if b.SRV != "" && !strings.HasPrefix(b.SRV, "_") {
			bad("backends[%d].srv: %q must be a full SRV name such as _http._tcp.vllm.ns.svc.cluster.local", i, b.SRV)
		}
		if b.Kubernetes != nil {
			bad("backends[%d].kubernetes: needs discovery: kubernetes", i)
		}
	default:
		bad("backends[%d].discovery: %q is not static, dns or kubernetes", i, b.Discovery)
	}
}
