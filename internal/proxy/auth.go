package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"path"
	"strings"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

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
	tok, ok := bearer(r.Header.Get("Authorization"))
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

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// requireKey wraps next with the API key check when keys are configured.
// The Authorization header is left as it is: the backend sees it
// unchanged.
func (s *Server) requireKey(next http.Handler) http.Handler {
	k := s.auth
	if k == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k.isExempt(r.URL.Path) || k.valid(r) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
		s.reject(w, &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeAuthentication, Code: "invalid_api_key",
			Message: "a valid API key is required: send it as \"Authorization: Bearer <key>\""})
	})
}
