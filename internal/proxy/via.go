package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// Hop detection. A backend URL that points back at the router (or at a
// router that points back at it) would forward each request to itself
// again and again, each hop holding a goroutine, a body and a backend
// connection. So every forwarded request carries a Via header (RFC 9110
// section 7.6.3) naming this router by a random id drawn at startup,
//
//	Via: 1.1 kvroute-5f1c9a0e3b7d2c41
//
// appended to any Via it already had, and a request that arrives with the
// router's own id in its Via is answered 508 loop_detected without being
// read further or forwarded. The outer hop, which forwarded it, sees a 5xx
// from that backend, as it should: the backend is misconfigured.

// viaName is a router's name in Via headers: "kvroute-" and 16 hex digits.
func viaName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "kvroute-" + hex.EncodeToString(b[:])
}

// rewrite prepares the outbound request: the shared rewrite, then the
// router's Via entry. It also drops the client's Expect: 100-continue:
// net/http's server answered it already when the exchange read the body,
// and a backend's own 100 Continue would reach the client as a second one
// (the reverse proxy relays 1xx responses).
func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	rewrite(pr)
	pr.Out.Header.Del("Expect")
	pr.Out.Header.Add("Via", "1.1 "+s.via)
}

// looped reports whether h's Via names this router.
func (s *Server) looped(h http.Header) bool {
	for _, v := range h.Values("Via") {
		for entry := range strings.SplitSeq(v, ",") {
			// received-protocol received-by [comment]
			f := strings.Fields(entry)
			if len(f) >= 2 && f[1] == s.via {
				return true
			}
		}
	}
	return false
}

// guardLoop answers a request that already passed this router with 508.
func (s *Server) guardLoop(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.looped(r.Header) {
			next.ServeHTTP(w, r)
			return
		}
		s.limits.hit(limitLoop, r.RemoteAddr)
		w.Header().Set("Connection", "close")
		s.reject(w, r, &openai.Error{Status: http.StatusLoopDetected, Type: openai.TypeServer, Code: "loop_detected",
			Message: "the request has already passed through this router (its Via header names it): a backend URL points back at the router"})
	})
}
