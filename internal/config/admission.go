package config

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Admission tunes the router's admission queue. When every healthy backend
// serving a request's model has reached one of the limits below, the
// request waits in the router (ordered by priority, an integer, higher
// first, default 0; round robin across tenants within a priority) instead of being sent to an engine that is already behind. A
// request that waits max_wait, or finds max_queue requests waiting, gets
// 429 with Retry-After. With every limit at 0, the default, admission is
// off and costs nothing.
type Admission struct {
	// MaxInFlightPerBackend saturates a backend with this many requests in
	// flight through this router. Default 0 (off).
	MaxInFlightPerBackend int `yaml:"max_inflight_per_backend"`
	// MaxPendingPrefillTokensPerBackend saturates a backend with this many
	// estimated uncached prompt tokens routed to it and still waiting for
	// their first byte. Default 0 (off).
	MaxPendingPrefillTokensPerBackend int64 `yaml:"max_pending_prefill_tokens_per_backend"`
	// MaxEngineWaiting saturates a backend whose engine reports this many
	// requests waiting in its own queue (whoever sent them), while the
	// report is fresh (see engines.stale_after). Default 0 (off).
	MaxEngineWaiting int `yaml:"max_engine_waiting"`
	// MaxQueue is the most requests that may wait; more get 429 at once.
	// Default 1024.
	MaxQueue int `yaml:"max_queue"`
	// MaxWait is the longest a request waits before it gets 429. Default 30s.
	MaxWait time.Duration `yaml:"max_wait"`
	// TenantHeader names a request header whose value is the tenant for
	// fairness. Default "": the API key (Authorization bearer token), which
	// is only ever kept hashed.
	TenantHeader string `yaml:"tenant_header"`
	// TrustedPriorityCIDRs are the networks (CIDRs or single addresses)
	// of trusted fronts, such as an API gateway that authenticates
	// clients: a request whose TCP peer is in one of them may set its
	// priority with the X-Kvroute-Priority header (an integer in
	// [-1000000, 1000000]). From any other peer the header is ignored,
	// so that a client cannot jump the queue. The front must drop or
	// overwrite the header its own clients send. Default [] (the header
	// is ignored from everyone).
	TrustedPriorityCIDRs []string `yaml:"trusted_priority_cidrs"`
	// KeyPriorities attach a priority to API keys (the bearer token of
	// Authorization): a request with one of these keys gets its
	// priority, unless a trusted front set the header. Default [].
	KeyPriorities []KeyPriority `yaml:"key_priorities"`
	// LateBinding holds a request in the router while every backend has
	// at least max_pending_prefill_tokens_per_backend (32768, four steps of
	// chunked prefill, when that is 0) of prefill routed to it and not
	// yet started, and binds held requests to a backend, through the
	// policy's usual pick, when a first byte or a completion frees one;
	// held requests are taken in deadline order unless order says fcfs.
	// It turns admission on. Default false (docs/routing.md, "Late
	// binding", has the measurements).
	LateBinding bool `yaml:"late_binding"`
	// Order is how the waiters of one tenant at one priority are taken:
	// "fcfs" (first come, first served) or "deadline" (earliest of arrival
	// + min(deadline_slack x the request's own uncached prefill time,
	// deadline_cap) first: a short prompt passes a long one that arrived
	// less than that before it). Default "": deadline with late_binding,
	// else fcfs.
	Order string `yaml:"order"`
	// DeadlineSlack is the deadline order's slack. Default 4.
	DeadlineSlack float64 `yaml:"deadline_slack"`
	// DeadlineCap bounds how far after its arrival a deadline lies, so
	// that requests arriving later than that never pass it. Default 5s.
	DeadlineCap time.Duration `yaml:"deadline_cap"`
}

// KeyPriority is the priority of one API key.
type KeyPriority struct {
	// Key is the key, or better "sha256:<64 hex digits>", its SHA-256
	// digest (as in auth.api_keys_file), so that the config file need
	// not hold the secret.
	Key string `yaml:"key"`
	// Priority is the key's priority, in [-1000000, 1000000].
	Priority int `yaml:"priority"`
}

// MaxPriority bounds a priority's magnitude.
const MaxPriority = 1_000_000

// TrustedFronts parses trusted_priority_cidrs; a single address is a
// one-address prefix.
func (a Admission) TrustedFronts() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range a.TrustedPriorityCIDRs {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			addr, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("admission.trusted_priority_cidrs[%d]: %q is not a CIDR or an address", i, s)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// KeyPriorityDigests returns the SHA-256 digest of each key_priorities
// key with its priority.
func (a Admission) KeyPriorityDigests() (map[[32]byte]int, error) {
	out := map[[32]byte]int{}
	for i, kp := range a.KeyPriorities {
		where := fmt.Sprintf("admission.key_priorities[%d].key", i)
		d, ok, err := keyDigest(where, kp.Key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: empty", where)
		}
		out[d] = kp.Priority
	}
	return out, nil
}

// Defaults of the admission section.
const (
	DefaultAdmissionMaxQueue = 1024
	DefaultAdmissionMaxWait  = 30 * time.Second
	// DefaultLateBindingTokens is the per-backend bound of queued prefill
	// under late_binding when max_pending_prefill_tokens_per_backend is 0:
	// four steps of chunked prefill of 8,192 tokens (admission.DefaultHoldTokens).
	DefaultLateBindingTokens = 4 * 8192
	DefaultDeadlineSlack     = 4.0             // admission.DefaultSlack
	DefaultDeadlineCap       = 5 * time.Second // admission.DefaultCap
)

// Enabled reports whether any saturation limit is set, or late binding.
func (a Admission) Enabled() bool {
	return a.MaxInFlightPerBackend > 0 || a.MaxPendingPrefillTokensPerBackend > 0 || a.MaxEngineWaiting > 0 || a.LateBinding
}

// PendingPrefillLimit is the per-backend bound of queued prefill tokens in
// force: max_pending_prefill_tokens_per_backend, or under late_binding
// DefaultLateBindingTokens when that is 0.
func (a Admission) PendingPrefillLimit() int64 {
	if a.LateBinding && a.MaxPendingPrefillTokensPerBackend == 0 {
		return DefaultLateBindingTokens
	}
	return a.MaxPendingPrefillTokensPerBackend
}

// QueueOrder is the order in force: order, or its default.
func (a Admission) QueueOrder() string {
	if a.Order == "" && a.LateBinding {
		return "deadline"
	}
	if a.Order == "" {
		return "fcfs"
	}
	return a.Order
}

func defaultAdmission() Admission {
	return Admission{MaxQueue: DefaultAdmissionMaxQueue, MaxWait: DefaultAdmissionMaxWait, DeadlineSlack: DefaultDeadlineSlack, DeadlineCap: DefaultDeadlineCap}
}

// validate reports the admission section's errors through bad.
func (a Admission) validate(bad func(format string, args ...any)) {
	if a.MaxInFlightPerBackend < 0 {
		bad("admission.max_inflight_per_backend: %d must not be negative (0 is off)", a.MaxInFlightPerBackend)
	}
	if a.MaxPendingPrefillTokensPerBackend < 0 {
		bad("admission.max_pending_prefill_tokens_per_backend: %d must not be negative (0 is off)", a.MaxPendingPrefillTokensPerBackend)
	}
	if a.MaxEngineWaiting < 0 {
		bad("admission.max_engine_waiting: %d must not be negative (0 is off)", a.MaxEngineWaiting)
	}
	switch a.Order {
	case "", "fcfs", "deadline":
	default:
		bad("admission.order: %q must be fcfs or deadline", a.Order)
	}
	if !(a.DeadlineSlack > 0) || a.DeadlineSlack > 1e6 {
		bad("admission.deadline_slack: %v must be positive (and at most 1e6)", a.DeadlineSlack)
	}
	if a.DeadlineCap <= 0 {
		bad("admission.deadline_cap: %v must be positive", a.DeadlineCap)
	}
	if a.MaxQueue <= 0 {
		bad("admission.max_queue: %d must be positive", a.MaxQueue)
	}
	if a.MaxWait <= 0 {
		bad("admission.max_wait: %v must be positive", a.MaxWait)
	}
	if _, err := a.TrustedFronts(); err != nil {
		bad("%v", err)
	}
	if _, err := a.KeyPriorityDigests(); err != nil {
		bad("%v", err)
	}
	for i, kp := range a.KeyPriorities {
		if kp.Priority < -MaxPriority || kp.Priority > MaxPriority {
			bad("admission.key_priorities[%d].priority: %d is outside [-%d, %d]", i, kp.Priority, MaxPriority, MaxPriority)
		}
	}
}
