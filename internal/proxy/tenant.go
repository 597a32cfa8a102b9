package proxy

import (
	"crypto/sha256"
	"net/http"
)

// headerAdminToken carries the admin token on a client request that wants
// the decision headers while API keys are configured. Like every
// X-Kvroute- header it is stripped before forwarding, so the backend
// never sees it.
const headerAdminToken = "X-Kvroute-Admin-Token"

// tenant is what the router knows of who sent a request, as far as
// isolation goes: whether it may see the routing decision headers, and
// the salt of its prefix chain. Without API keys the router serves one
// tenant: every request sees the headers, and nothing is salted.
type tenant struct {
	// reveal: the response carries X-Kvroute-Backend and X-Kvroute-Reason,
	// whose prefix match tells what the backends' caches hold (a tenant
	// probing another's prompt block by block reads it from prefix=N/M).
	reveal bool
	// salt is the key's part of the prefix salt under auth.isolate_prefix:
	// a fixed-length prefix (so that no cache_salt completes another
	// key's), "" otherwise.
	salt string
}

// tenantOf reads r's tenant. It runs after the API key check.
func (s *Server) tenantOf(r *http.Request) tenant {
	c := s.creds.Load()
	if c.keys == nil {
		return tenant{reveal: true}
	}
	var t tenant
	if tok, ok := bearer(r.Header.Get("Authorization")); ok {
		d := sha256.Sum256([]byte(tok))
		t.reveal = c.reveal[d]
		if c.isolate {
			t.salt = "key\x00" + string(d[:]) + "\x00"
		}
	}
	if !t.reveal && s.adminAPI != nil {
		t.reveal = s.adminAPI.Authorized(r.Header.Get(headerAdminToken))
	}
	return t
}

// prefixSalt is the salt of a prompt's chain for this tenant: the key's
// salt, then the request's own (vLLM's cache_salt).
func (t tenant) prefixSalt(cacheSalt string) string {
	if t.salt == "" {
		return cacheSalt
	}
	return t.salt + cacheSalt
}

// metricsPage is /metrics on the client listener. A tenant that may not
// see the decision headers does not see the families that would tell it
// the same (cacheFamilies): the rest of the page is open as before. The
// whole page goes to the scrapes that may see them: with no API key
// configured, a key of auth.decision_header_keys, or the admin token, as
// "Authorization: Bearer" (as Prometheus's scrape authorization sends it)
// or in X-Kvroute-Admin-Token. A wrong admin token in the header is a
// failed check (adminHeaderOK), and a client out of failures gets 429.
// A wrong bearer token is not: on an open page it may be any API key.
// admin.listen's copy of /metrics, off the clients' network, is whole.
func (s *Server) metricsPage() http.Handler {
	full, open := s.metrics.handler(), s.metrics.openHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := s.creds.Load().keys
		if k == nil {
			full.ServeHTTP(w, r)
			return
		}
		// Off the exempt paths requireKey has counted the header.
		if k.isExempt(r.URL.Path) && r.Header.Get(headerAdminToken) != "" {
			if e := s.failures.blocked(r); e != nil {
				s.reject(w, r, e)
				return
			}
			if !s.adminHeaderOK(r) {
				s.failures.failed(r)
			}
		}
		reveal := s.tenantOf(r).reveal
		if tok, ok := bearer(r.Header.Get("Authorization")); ok && !reveal && s.adminAPI != nil {
			reveal = s.adminAPI.Authorized(tok)
		}
		if reveal {
			full.ServeHTTP(w, r)
			return
		}
		open.ServeHTTP(w, r)
	})
}
