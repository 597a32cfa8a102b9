package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// limitBody bounds the time a client takes to send its body (slowloris on
// the body) in two ways: the whole body within limits.body_timeout, and,
// once limits.body_rate_grace has passed, an average of at least
// limits.min_body_rate bytes a second since the headers ended (a client
// that sends one byte now and then is cut long before body_timeout). Both
// are the connection's read deadline, set when the handler starts and
// pushed forward as bytes arrive. It must not outlive the body, or it
// would cut long responses: net/http clears it when the body hits EOF
// (before its background read of the connection), and deadlineBody clears
// it on any other end as well.
func (s *Server) limitBody(next http.Handler) http.Handler {
	l := s.cfg.Limits
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		d := &deadlineBody{ReadCloser: r.Body, rc: http.NewResponseController(w), start: time.Now(),
			timeout: l.BodyTimeout, rate: float64(l.MinBodyRate), grace: l.BodyRateGrace}
		if d.extend() != nil {
			next.ServeHTTP(w, r)
			return
		}
		r.Body = d
		next.ServeHTTP(w, r)
		d.linger(w)
	})
}

// lingerTime bounds how long the router reads and discards the rest of a
// body it refused before closing the connection (a lingering close, as
// nginx's lingering_time): a client that sends its whole body before it
// reads the answer (most HTTP client libraries) then reads the 413, 429 or
// 503 instead of a reset connection.
const lingerTime = 5 * time.Second

// linger sends the answer to a request whose body was left unread and
// whose connection is to be closed, then discards what comes of the body
// for at most lingerTime.
func (d *deadlineBody) linger(w http.ResponseWriter) {
	if d.done || !strings.EqualFold(w.Header().Get("Connection"), "close") {
		return
	}
	if d.rc.Flush() != nil || d.rc.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	_, _ = io.Copy(io.Discard, d.ReadCloser)
}

// deadlineBody keeps the connection's read deadline at the body's
// deadline, clears it when the body ends, and turns a deadline expiry into
// errBodyTimeout or errBodyTooSlow. After an expiry the deadline stays:
// the server would otherwise wait for the rest of the slow body before
// closing the connection.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
	// start is the end of the headers, got the body bytes read since.
	start time.Time
	got   int64
	// timeout is limits.body_timeout; rate (bytes a second, 0 for none)
	// and grace are limits.min_body_rate and limits.body_rate_grace.
	timeout time.Duration
	rate    float64
	grace   time.Duration
	// byRate is set while the deadline is the rate's, not body_timeout's.
	byRate bool
}

// errBodyTimeout is the body read error of a client that sent its body too
// slowly; errBodyTooSlow, one of them, of a client under the minimum rate.
var (
	errBodyTimeout = errors.New("the client sent its request body too slowly")
	errBodyTooSlow = fmt.Errorf("%w: under limits.min_body_rate", errBodyTimeout)
)

// extend sets the read deadline for the bytes got so far: the time by
// which they would have arrived at the minimum rate after the grace, or
// the end of body_timeout if that comes first.
func (d *deadlineBody) extend() error {
	end := d.start.Add(d.timeout)
	d.byRate = false
	if d.rate > 0 {
		byRate := d.start.Add(d.grace + time.Duration(float64(d.got)/d.rate*float64(time.Second)))
		if byRate.Before(end) {
			end, d.byRate = byRate, true
		}
	}
	return d.rc.SetReadDeadline(end)
}

func (d *deadlineBody) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	d.got += int64(n)
	if err == nil || d.done {
		if n > 0 && d.byRate && !d.done {
			_ = d.extend() // a body that kept up with the rate earns its time
		}
		return n, err
	}
	d.done = true
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		if d.byRate {
			return n, errBodyTooSlow
		}
		return n, errBodyTimeout
	}
	_ = d.rc.SetReadDeadline(time.Time{})
	return n, err
}

// bodyTimeout is the client error of a body sent too slowly (err is
// errBodyTimeout or errBodyTooSlow), counted as a limit hit. The
// connection is closed after it, since the rest of the body may still be
// on its way.
func (s *Server) bodyTimeout(w http.ResponseWriter, r *http.Request, err error) *openai.Error {
	w.Header().Set("Connection", "close")
	l := s.cfg.Limits
	msg := fmt.Sprintf("the request body did not arrive within limits.body_timeout (%v)", l.BodyTimeout)
	limit := limitBodyTimeout
	if errors.Is(err, errBodyTooSlow) {
		msg = fmt.Sprintf("the request body arrived slower than limits.min_body_rate (%d bytes a second after %v)", l.MinBodyRate, l.BodyRateGrace)
		limit = limitBodyRate
	}
	s.limits.hit(limit, r.RemoteAddr)
	return &openai.Error{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest, Code: "body_timeout", Message: msg}
}
