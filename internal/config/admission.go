package config

import "time"

// Admission tunes the router's admission queue. When every healthy backend
// serving a request's model has reached one of the limits below, the
// request waits in the router (ordered by the X-Kvroute-Priority header,
// an integer, higher first, default 0; round robin across tenants within a
// priority) instead of being sent to an engine that is already behind. A
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
}

// Defaults of the admission section.
const (
	DefaultAdmissionMaxQueue = 1024
	DefaultAdmissionMaxWait  = 30 * time.Second
)

// Enabled reports whether any saturation limit is set.
func (a Admission) Enabled() bool {
	return a.MaxInFlightPerBackend > 0 || a.MaxPendingPrefillTokensPerBackend > 0 || a.MaxEngineWaiting > 0
}

func defaultAdmission() Admission {
	return Admission{MaxQueue: DefaultAdmissionMaxQueue, MaxWait: DefaultAdmissionMaxWait}
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
	if a.MaxQueue <= 0 {
		bad("admission.max_queue: %d must be positive", a.MaxQueue)
	}
	if a.MaxWait <= 0 {
		bad("admission.max_wait: %v must be positive", a.MaxWait)
	}
}
