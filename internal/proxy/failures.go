package proxy

import (
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/openai"
)

// authFailures limits how often one client may fail the API key or admin
// token check (limits.auth_failures_per_minute): a token bucket per client
// address, one token taken by each failure. A client whose bucket is empty
// gets 429 before its credentials are even looked at, so that a correct
// guess is no faster to find than a wrong one. Clients are keyed by IPv4
// address or IPv6 /64 (one host's whole allocation). The table is bounded:
// full buckets (clients that have not failed for a minute) are forgotten
// first, and past that every new client shares one overflow bucket.
type authFailures struct {
	perMinute int
	now       func() time.Time // stubbed in tests

	mu       sync.Mutex
	clients  map[netip.Prefix]*rate.Limiter
	overflow *rate.Limiter
}

// maxFailingClients bounds the table of authFailures.
const maxFailingClients = 1 << 16

// newAuthFailures returns the limiter, nil (no limit) for perMinute 0.
func newAuthFailures(perMinute int) *authFailures {
	if perMinute <= 0 {
		return nil
	}
	f := &authFailures{perMinute: perMinute, now: time.Now, clients: map[netip.Prefix]*rate.Limiter{}}
	f.overflow = f.bucket()
	return f
}

func (f *authFailures) bucket() *rate.Limiter {
	return rate.NewLimiter(rate.Limit(float64(f.perMinute)/60), f.perMinute)
}

// clientOf is the bucket key of a request's "ip:port" remote address.
func clientOf(remote string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// limiter returns the bucket of client, creating it when create is set;
// the caller holds mu.
func (f *authFailures) limiter(client netip.Prefix, create bool) *rate.Limiter {
	if l, ok := f.clients[client]; ok {
		return l
	}
	if !create {
		return nil
	}
	if len(f.clients) >= maxFailingClients {
		now := f.now()
		for k, l := range f.clients {
			if l.TokensAt(now) >= float64(f.perMinute) {
				delete(f.clients, k)
			}
		}
		if len(f.clients) >= maxFailingClients {
			return f.overflow
		}
	}
	l := f.bucket()
	f.clients[client] = l
	return l
}

// blocked returns the 429 of a client that has no failure left, else
// nil; a nil limiter never blocks.
func (f *authFailures) blocked(r *http.Request) *openai.Error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	l := f.limiter(clientOf(r.RemoteAddr), false)
	tokens := math.Inf(1)
	if l != nil {
		tokens = l.TokensAt(f.now())
	}
	f.mu.Unlock()
	if tokens >= 1 {
		return nil
	}
	wait := max(int(math.Ceil((1-tokens)*60/float64(f.perMinute))), 1)
	return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: "too_many_auth_failures",
		Message: "too many failed authentications from this address; retry after " + strconv.Itoa(wait) + "s", RetryAfter: wait}
}

// failed takes one token from r's client's bucket.
func (f *authFailures) failed(r *http.Request) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limiter(clientOf(r.RemoteAddr), true).AllowN(f.now(), 1)
}

// guardAdmin applies the limiter to the admin API, whose token check is
// the admin package's: a 401 it answers counts as a failure.
func (f *authFailures) guardAdmin(next http.Handler) http.Handler {
	if f == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := f.blocked(r); e != nil {
			e.Write(w)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == http.StatusUnauthorized {
			f.failed(r)
		}
	})
}

// statusWriter notes the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // not an informational 1xx
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
