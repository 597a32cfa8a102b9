package proxy

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/openai"
)

// The router reads every request body whole before routing it (for the
// parse and for retries), so bodies are memory a client decides to use.
// Three bounds keep a client from holding that memory hostage:
//
//   - a body is refused (413) on its declared length alone when that is
//     over limits.max_body_bytes, before a byte of it is read;
//   - room in the budget of buffered bodies (limits.max_buffered_bytes,
//     shared by every request) is taken as the bytes arrive, never on the
//     declared length: a client that announces 32 MiB and sends one byte
//     holds one buffer of at most 16 KiB, and a client that sends slowly is cut by
//     the minimum body rate (limitBody);
//   - the part of the budget held by one client's bodies still arriving
//     is bounded by limits.max_buffered_bytes_per_client (a client is its
//     API key, else its address), so that clients that do send their
//     bytes, then stall before the end, cannot take it all.
//
// A body that has arrived whole keeps its room in the budget until its
// request ends (it is resent on a retry) but no longer counts against its
// client: its request is then bounded by admission and the backends.

// budget is the room for request bodies the router holds at once
// (limits.max_buffered_bytes), shared by every exchange.
type budget struct {
	used  atomic.Int64
	limit int64
}

// take reserves n bytes, or reports false if they would exceed the limit.
func (b *budget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n bytes taken.
func (b *budget) give(n int64) {
	if n != 0 {
		b.used.Add(-n)
	}
}

// shares are the bytes each client's arriving bodies hold in the budget
// (limits.max_buffered_bytes_per_client). A client's entry lives while it
// has a body arriving, so the table is bounded by the connections.
type shares struct {
	limit int64
	mu    sync.Mutex
	held  map[string]int64
}

// take reserves n bytes for client, or reports false if they would exceed
// its share.
func (s *shares) take(client string, n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client]+n > s.limit {
		return false
	}
	if s.held == nil {
		s.held = map[string]int64{}
	}
	s.held[client] += n
	return true
}

// give returns n bytes taken by client.
func (s *shares) give(client string, n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client] -= n; s.held[client] <= 0 {
		delete(s.held, client)
	}
}

// bodyClient names the client whose share a request's body counts
// against: its API key when keys are configured and it holds a valid one
// (an invalid one would let a client pick fresh names at will), else its
// IPv4 address or IPv6 /64.
func (s *Server) bodyClient(r *http.Request) string {
	if k := s.creds.Load().keys; k != nil && k.valid(r) {
		tok, _ := openai.ClientKey(r.Header)
		d := sha256.Sum256([]byte(tok))
		return "key " + string(d[:])
	}
	return "addr " + clientOf(r.RemoteAddr).String()
}

// arrival is the room one body takes while it arrives: bytes held in the
// budget by the exchange (ex.held, given back when it settles) and, of
// them, in its client's share (given back when the body has arrived).
type arrival struct {
	ex     *exchange
	r      *http.Request
	client string
	shared int64
}

// hold takes n more bytes for the body, or answers why it cannot: 503
// when the router's budget is full, 429 when the client's share is.
func (a *arrival) hold(w http.ResponseWriter, n int64) *openai.Error {
	s := a.ex.s
	if !s.bodies.take(n) {
		return s.busy(w)
	}
	if !s.shares.take(a.client, n) {
		s.bodies.give(n)
		return s.shareFull(w, a.r)
	}
	a.shared += n
	a.ex.held += n
	return nil
}

// done ends the body's arrival: its bytes no longer count against its
// client.
func (a *arrival) done() { a.ex.s.shares.give(a.client, a.shared) }

// firstBodyBuffer is the most room a body takes before its first bytes
// arrive; it grows fourfold as they do, up to the declared length.
const firstBodyBuffer = 16 << 10

// bufferSteps is the size of a body's buffer after each step: of a
// declared length n, ceil(n / 4^k) for k down to 0, from the first at most
// firstBodyBuffer (so that the last is n and the buffers discarded on the
// way add up to less than n/3: growing twofold would cost up to n more
// allocated bytes a request, fourfold costs n/3 and lets a client hold at
// most four times what it sent); of an unknown length, firstBodyBuffer
// doubled up to limit+1 (one read past the limit, to see it).
type bufferSteps struct {
	n, limit int64
	shift    uint
}

func newBufferSteps(declared, limit int64) *bufferSteps {
	b := &bufferSteps{n: declared, limit: limit}
	for declared > firstBodyBuffer && b.first() > firstBodyBuffer {
		b.shift += 2
	}
	return b
}

// first is the first buffer's size.
func (b *bufferSteps) first() int64 {
	if b.n < 0 {
		return firstBodyBuffer
	}
	return max((b.n+(1<<b.shift)-1)>>b.shift, 1)
}

// next is the size of the buffer after one of size cur is full.
func (b *bufferSteps) next(cur int64) int64 {
	if b.n < 0 {
		return min(2*cur, b.limit+1)
	}
	b.shift -= min(b.shift, 2)
	return b.first()
}

// readBody reads the whole body, bounded by limits.max_body_bytes (a
// declared length over it gets 413 unread), taking room in the budget of
// buffered bodies and in its client's share as the bytes arrive: the
// buffer grows fourfold (bufferSteps), so the room held is at most four
// times what arrived (plus the first buffer), and never more than the
// declared length. The room in the budget is given back when the exchange settles.
func (ex *exchange) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *openai.Error) {
	s := ex.s
	limit := int64(s.cfg.Limits.MaxBodyBytes)
	if r.ContentLength > limit {
		// Closing the connection spares net/http's attempt to read
		// what is left of the body before it sends the answer.
		w.Header().Set("Connection", "close")
		return nil, tooLarge(limit)
	}
	a := &arrival{ex: ex, r: r, client: s.bodyClient(r)}
	defer a.done()
	steps := newBufferSteps(r.ContentLength, limit)
	first := steps.first()
	if e := a.hold(w, first); e != nil {
		return nil, e
	}
	buf := make([]byte, 0, first)
	body := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(buf) == cap(buf) && int64(len(buf)) == r.ContentLength {
			// All announced bytes are in: the server ends the body
			// there, so look for its end without growing the buffer.
			// (An error other than the end is sticky: the read below
			// meets it again.)
			var probe [1]byte
			n, err := body.Read(probe[:])
			if n == 0 && err == io.EOF {
				return buf, nil
			}
			if n > 0 {
				return nil, openai.BadRequest("body_read_error", "the request body is longer than its Content-Length")
			}
		}
		if len(buf) == cap(buf) {
			grow := steps.next(int64(cap(buf))) - int64(cap(buf))
			if grow <= 0 {
				grow = 512
			}
			if e := a.hold(w, grow); e != nil {
				return nil, e
			}
			// Not slices.Grow, whose append of a fresh slice allocates
			// the growth twice under the race detector.
			nb := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(nb, buf)
			buf = nb
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, tooLarge(limit)
			}
			if errors.Is(err, errBodyTimeout) {
				return nil, s.bodyTimeout(w, r, err)
			}
			return nil, openai.BadRequest("body_read_error", "could not read the request body: "+err.Error())
		}
	}
}

func tooLarge(limit int64) *openai.Error {
	return &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest, Code: "request_too_large",
		Message: "request body is larger than the router's limit of " + strconv.FormatInt(limit, 10) + " bytes"}
}

// busy is the answer to a body that the budget cannot hold: the router's
// memory for bodies is full of other requests' (503, not 429: it is no
// fault of this client). The unread body is not drained.
func (s *Server) busy(w http.ResponseWriter) *openai.Error {
	w.Header().Set("Connection", "close")
	s.metrics.bodyBudgetRejects.Inc()
	return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "server_busy",
		Message: fmt.Sprintf("the router holds as many request bodies as limits.max_buffered_bytes (%d bytes) allows; retry shortly", s.bodies.limit), RetryAfter: 1}
}

// shareFull is the answer to a body over its client's share: this client
// already has as many bytes of bodies on their way as
// limits.max_buffered_bytes_per_client allows (429: finish those first).
// The unread body is not drained.
func (s *Server) shareFull(w http.ResponseWriter, r *http.Request) *openai.Error {
	w.Header().Set("Connection", "close")
	s.limits.hit(limitClientShare, r.RemoteAddr)
	return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: "too_many_pending_bodies",
		Message: fmt.Sprintf("this client's request bodies still arriving hold as much as limits.max_buffered_bytes_per_client (%d bytes) allows; finish sending them first", s.shares.limit), RetryAfter: 1}
}
