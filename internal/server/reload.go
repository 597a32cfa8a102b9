package server

import (
	"errors"
	"reflect"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// Reload applies a new, validated configuration while the router serves,
// without touching a request in flight:
//   - backends: entries that are gone are drained and removed once idle,
//     new ones are added with warm-up, unchanged ones keep their state;
//     DNS pools start and stop likewise;
//   - policy and policy_options: a new policy routes the requests that
//     start after Reload returns (the prefix index and load carry over);
//   - fleet: warmup and dns_interval apply to what is added from now on;
//   - credentials: the API keys (auth: the keys file and variable are
//     read again), the admin token (admin.token, admin.token_file or
//     KVROUTE_ADMIN_TOKEN, read again) and the sources of priority
//     (admission.trusted_priority_cidrs, admission.key_priorities) apply
//     to the requests that start after Reload returns;
//   - TLS: the listen_tls certificate and key are read again and serve
//     new connections; upstream.tls and backends[].tls apply to new
//     connections to the backends.
//
// Every other setting is read once at startup; a change to it is logged as
// needing a restart and otherwise ignored. A configuration that makes a
// fleet that could not split requests able to (its first prefill role, or
// Kubernetes pool, whose pods' labels may name prefill engines) is refused:
// that takes a restart.
func (s *Server) Reload(cfg *config.Config) error {
	entries, err := cfg.Entries()
	if err != nil {
		return err
	}
	applyProxy, err := s.proxy.PrepareReload(cfg)
	if err != nil {
		return err
	}
	token, err := cfg.Admin.ResolveToken()
	if err != nil {
		return err
	}
	cert, err := s.nextCert(cfg)
	if err != nil {
		return err
	}
	s.reload.Lock()
	defer s.reload.Unlock()
	old := s.last
	if cfg.MaySplit() && !old.MaySplit() {
		// The role filter is built at startup: without it a prefill
		// engine would take whole requests.
		return errors.New("reload: the configuration names the fleet's first prefill engine (backends[].role) or Kubernetes pool: splitting requests takes a restart")
	}
	if cfg.Policy != old.Policy || cfg.PolicyOptions != old.PolicyOptions ||
		cfg.Disaggregation.KVTransferTimePerToken != old.Disaggregation.KVTransferTimePerToken {
		p, err := policy.New(cfg.Policy, policyOptions(cfg))
		if err != nil {
			return err
		}
		s.sched.SetPolicy(p)
		s.sched.SetProbeInterval(cfg.PolicyOptions.Probes())
		s.log.Info("reload: policy changed", "from", old.Policy, "to", cfg.Policy)
	}
	for _, k := range restartKeys(old, cfg) {
		s.log.Warn("reload: setting changed; it takes effect after a restart", "key", k)
	}
	applyProxy()
	s.adminAPI.SetToken(token)
	s.upstreamTLS.Store(cfg.Upstream.TLS)
	if cert != nil {
		s.cert.Store(cert)
	}
	s.set.Apply(entries, cfg.Fleet)
	s.last = cfg
	s.log.Info("reload: applied", "backends", len(s.fleet.Snapshot().All), "policy", cfg.Policy)
	return nil
}

// ReloadWith loads a configuration with load (which reads and validates
// it: `kvroute serve` passes the same loader as at startup, flags
// included) and applies it. A configuration that fails to load or to
// validate is logged and ignored: the one in force keeps serving.
func (s *Server) ReloadWith(load func() (*config.Config, error)) error {
	cfg, err := load()
	if err == nil && cfg == nil {
		err = errors.New("no configuration")
	}
	if err != nil {
		s.log.Error("reload: invalid configuration ignored; the previous one keeps serving", "err", err)
		return err
	}
	return s.Reload(cfg)
}

// restartKeys names the top-level keys that differ between old and next
// and that Reload cannot apply (a section of which Reload applies some
// keys counts when another of its keys differs).
func restartKeys(old, next *config.Config) []string {
	applied := map[string]bool{"backends": true, "policy": true, "policy_options": true, "fleet": true, "auth": true}
	n := *next
	n.Admin.Token, n.Admin.TokenFile = old.Admin.Token, old.Admin.TokenFile
	n.Upstream.TLS = old.Upstream.TLS
	if old.ListenTLS.Enabled() == next.ListenTLS.Enabled() {
		n.ListenTLS = old.ListenTLS // a new pair is applied; on or off is not
	}
	n.Admission.TrustedPriorityCIDRs, n.Admission.KeyPriorities = old.Admission.TrustedPriorityCIDRs, old.Admission.KeyPriorities
	var keys []string
	ov, nv := reflect.ValueOf(old).Elem(), reflect.ValueOf(&n).Elem()
	for i := range ov.NumField() {
		f := ov.Type().Field(i)
		k := f.Tag.Get("yaml")
		if k == "" || k == "-" || applied[k] {
			continue
		}
		if !reflect.DeepEqual(ov.Field(i).Interface(), nv.Field(i).Interface()) {
			keys = append(keys, k)
		}
	}
	return keys
}
