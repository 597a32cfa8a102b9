package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/netip"
	"path"
	"strings"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// credentials are what the router trusts a request by: the API keys, and
// where a priority may come from. They are built from the configuration
// at startup and on every reload, and swapped whole (Server.creds).
type credentials struct {
	// keys is nil when no API key is configured.
	keys *apiKeys
	prio priorities
	// reveal are the digests of the keys whose requests get the decision
	// headers (auth.decision_header_keys); isolate salts each key's
	// prefix chain (auth.isolate_prefix). See tenant.go.
	reveal  map[[sha256.Size]byte]bool
	isolate bool
	// objectives are the default latency objectives (objectives.go).
	objectives *objectives
}

// newCredentials reads the auth and admission sections.
func newCredentials(cfg *config.Config) (*credentials, error) {
	keys, err := newAPIKeys(cfg.Auth)
	if err != nil {
		return nil, err
	}
	fronts, err := cfg.Admission.TrustedFronts()
	if err != nil {
		return nil, err
	}
	kp, err := cfg.Admission.KeyPriorityDigests()
	if err != nil {
		return nil, err
	}
	reveal, err := cfg.Auth.DecisionHeaderDigests()
	if err != nil {
		return nil, err
	}
	obj, err := newObjectives(cfg.Objectives)
	if err != nil {
		return nil, err
	}
	return &credentials{keys: keys, prio: priorities{fronts: fronts, keys: kp}, reveal: reveal, isolate: cfg.Auth.IsolatePrefix,
		objectives: obj}, nil
}

// priorities decides a request's admission priority from trusted sources
// only: the X-Kvroute-Priority header of a request whose TCP peer is a
// trusted front (admission.trusted_priority_cidrs), else the priority of
// its API key (admission.key_priorities), else 0. Anyone else's header is
// ignored, so that a client cannot jump the queue; X-Forwarded-For is not
// looked at, since a client writes it.
type priorities struct {
	fronts []netip.Prefix
	keys   map[[sha256.Size]byte]int
}

// of returns r's priority; a trusted front's malformed header is a 400.
func (p *priorities) of(r *http.Request) (int, *openai.Error) {
	if len(p.fronts) > 0 && r.Header.Get(admission.PriorityHeader) != "" && p.fromFront(r.RemoteAddr) {
		return admission.ParsePriority(r.Header)
	}
	if len(p.keys) > 0 {
		if tok, ok := openai.ClientKey(r.Header); ok {
			if prio, ok := p.keys[sha256.Sum256([]byte(tok))]; ok {
				return prio, nil
			}
		}
	}
	return 0, nil
}

// fromFront reports whether remote, a request's "ip:port", is in a
// trusted front's network.
func (p *priorities) fromFront(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	for _, f := range p.fronts {
		if f.Contains(a) {
			return true
		}
	}
	return false
}

// apiKeys is the router's own API key check: the SHA-256 digests of the
// accepted keys, and the paths that need none.
type apiKeys struct {
	digests [][sha256.Size]byte
	exempt  []string
}

// newAPIKeys reads the configured keys; nil when none is configured.
func newAPIKeys(c config.Auth) (*apiKeys, error) {
	d, err := c.KeyDigests()
	if err != nil || len(d) == 0 {
		return nil, err
	}
	return &apiKeys{digests: d, exempt: c.Exempt}, nil
}

// isExempt reports whether p, once cleaned (so that "/healthz/../v1/..."
// is not taken for a probe), is an exempt path.
func (k *apiKeys) isExempt(p string) bool {
	c := path.Clean("/" + p)
	for _, e := range k.exempt {
		if prefix, ok := strings.CutSuffix(e, "/"); ok {
			if c == prefix || strings.HasPrefix(c, prefix+"/") {
				return true
			}
		} else if c == e {
			return true
		}
	}
	return false
}

// valid reports whether the request's bearer token is one of the keys.
// The token is hashed and compared with every digest in constant time,
// so that neither the comparison nor the number of keys tried tells a
// caller how close a guess was.
func (k *apiKeys) valid(r *http.Request) bool {
	tok, ok := openai.ClientKey(r.Header)
	if !ok {
		return false
	}
	d := sha256.Sum256([]byte(tok))
	match := 0
	for i := range k.digests {
		match |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return match == 1
}

// adminHeaderOK reports whether r's X-Kvroute-Admin-Token, if it carries
// one, is the admin token. A wrong one is a failed token check like a
// wrong token on the admin API: it takes from the same bucket
// (authFailures), so the header is no cheaper an oracle than the API. The
// request is still served, without the decision headers (tenantOf).
func (s *Server) adminHeaderOK(r *http.Request) bool {
	tok := r.Header.Get(headerAdminToken)
	return tok == "" || (s.adminAPI != nil && s.adminAPI.Authorized(tok))
}

// requireKey wraps next with the API key check, which applies while keys
// are configured (they may come and go with a reload), and which a client
// that failed it too often does not get to try (authFailures). The Authorization
// header is left as it is: the backend sees it unchanged.
func (s *Server) requireKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := s.creds.Load().keys
		if k == nil || k.isExempt(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		if e := s.failures.blocked(r); e != nil {
			s.reject(w, r, e)
			return
		}
		if k.valid(r) {
			if !s.adminHeaderOK(r) {
				s.failures.failed(r)
			}
			next.ServeHTTP(w, r)
			return
		}
		s.failures.failed(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
		s.reject(w, r, &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeAuthentication, Code: "invalid_api_key",
			Message: "a valid API key is required: send it as \"Authorization: Bearer <key>\" (or \"x-api-key: <key>\")"})
	})
}
