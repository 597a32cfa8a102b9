package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Response headers the router adds; client-sent headers with this prefix
// are stripped before forwarding so that a client cannot forge them
// towards a backend.
const (
	headerPrefix  = "X-Kvroute-"
	headerBackend = "X-Kvroute-Backend"
	headerReason  = "X-Kvroute-Reason"
)

// statusClientGone labels requests whose client went away before the
// response started (nginx's convention).
const statusClientGone = 499

// flight is one client request on its way through the reverse proxy. The
// handler creates it; the retrier, the tracked body, ModifyResponse and the
// ErrorHandler find it in the request context. Only one goroutine touches
// it at a time: the handler's, then (for the body) the proxy's copy loop on
// the same goroutine.
type flight struct {
	// view is nil for requests passed through without scheduling.
	view  *request.View
	body  []byte
	start time.Time
	// a is the current attempt's assignment (completions).
	a *scheduler.Assignment
	// target is the backend of the current attempt.
	target *fleet.Backend
	// tried are the IDs of backends that failed this request.
	tried   []int
	retries int
	// ended is set once the request has been counted.
	ended bool
}

type flightKey struct{}

func flightFrom(ctx context.Context) *flight {
	fl, _ := ctx.Value(flightKey{}).(*flight)
	return fl
}

// completions serves POST /v1/chat/completions and /v1/completions.
func (s *Server) completions(kind request.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			s.reject(w, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path + "; use POST"})
			return
		}
		body, err := s.readBody(w, r)
		if err != nil {
			s.reject(w, err)
			return
		}
		v, perr := request.Parse(kind, body, s.parse)
		if perr != nil {
			s.reject(w, perr)
			return
		}
		if h := s.cfg.Session.Header; h != "" {
			if k := r.Header.Get(h); k != "" {
				v.SessionKey = k
			}
		}
		if e := s.checkContext(v); e != nil {
			s.reject(w, e)
			return
		}
		release, ok := s.admit(w, r, v.Model)
		if !ok {
			return
		}
		a, rerr := s.sched.Route(v, nil, start)
		release() // the request's load is accounted (or it failed to route)
		if rerr != nil {
			e := routeError(rerr, v.Model)
			s.recordRejected(v, start, e)
			s.reject(w, e)
			return
		}
		s.metrics.routed(v, a)
		fl := &flight{view: v, body: body, start: start, a: a, target: a.Backend}
		s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), flightKey{}, fl)))
	}
}

// readBody reads the whole body, bounded by limits.max_body_bytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *openai.Error) {
	limit := int64(s.cfg.Limits.MaxBodyBytes)
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(min(r.ContentLength, limit), 512)))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, tooLarge(limit)
		}
		if errors.Is(err, errBodyTimeout) {
			return nil, s.bodyTimeout(w)
		}
		return nil, openai.BadRequest("body_read_error", "could not read the request body: "+err.Error())
	}
	return buf.Bytes(), nil
}

func tooLarge(limit int64) *openai.Error {
	return &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest, Code: "request_too_large",
		Message: "request body is larger than the router's limit of " + strconv.FormatInt(limit, 10) + " bytes"}
}

// routeError maps the scheduler's errors to client errors.
func routeError(err error, model string) *openai.Error {
	switch {
	case errors.Is(err, scheduler.ErrUnknownModel):
		return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "model_not_found",
			Message: "the model '" + model + "' does not exist on any backend"}
	case errors.Is(err, scheduler.ErrNoBackend):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend",
			Message: "no healthy backend serves the model '" + model + "'", RetryAfter: 1}
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Code: "routing_error", Message: err.Error()}
}

// reject writes a router-made error and counts it.
func (s *Server) reject(w http.ResponseWriter, e *openai.Error) {
	s.metrics.requests.WithLabelValues(noBackend, s.policyName(), strconv.Itoa(e.Status)).Inc()
	e.Write(w)
}

// rewrite prepares the outbound request. The target URL is set per attempt
// by the retrier, since a retry goes elsewhere.
func rewrite(pr *httputil.ProxyRequest) {
	for k := range pr.Out.Header {
		if strings.HasPrefix(k, headerPrefix) {
			delete(pr.Out.Header, k)
		}
	}
	prior := pr.In.Header.Values("X-Forwarded-For")
	pr.SetXForwarded()
	if len(prior) > 0 {
		pr.Out.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+pr.Out.Header.Get("X-Forwarded-For"))
	}
}

// modifyResponse adds the router's headers naming the backend that answered.
func (s *Server) modifyResponse(resp *http.Response) error {
	fl := flightFrom(resp.Request.Context())
	if fl == nil || fl.target == nil {
		return nil
	}
	resp.Header.Set(headerBackend, fl.target.Name)
	s.record(fl, resp.StatusCode)
	if fl.a != nil && fl.a.Reason != "" {
		resp.Header.Set(headerReason, fl.a.Reason)
	}
	return nil
}

// proxyError answers when no backend produced a response.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	fl := flightFrom(r.Context())
	name := noBackend
	if fl != nil && fl.target != nil {
		name = fl.target.Name
	}
	if r.Context().Err() != nil {
		// The client is gone: nobody to answer. The attempt was already
		// released by the retrier.
		if fl != nil && fl.view == nil {
			s.metrics.requests.WithLabelValues(name, s.policyName(), strconv.Itoa(statusClientGone)).Inc()
		}
		s.record(fl, statusClientGone)
		return
	}
	status, code := http.StatusBadGateway, "backend_error"
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		status, code = http.StatusGatewayTimeout, "backend_timeout"
	}
	if fl == nil || fl.view == nil {
		s.metrics.requests.WithLabelValues(name, s.policyName(), strconv.Itoa(status)).Inc()
	}
	s.record(fl, status)
	msg := "backend " + name + " failed: " + err.Error()
	if fl != nil && fl.retries > 0 {
		msg += " (after " + strconv.Itoa(fl.retries) + " retries)"
	}
	s.log.Warn("proxy error", "backend", name, "status", status, "err", err)
	openai.WriteError(w, status, openai.TypeServer, code, msg, 0)
}

// retrier is the reverse proxy's transport: it sends each attempt to the
// flight's current backend and, when that backend fails before the first
// response byte (connection error, 5xx, or a body that breaks before its
// first byte), re-routes the request to another one, at most
// retry.attempts times. It waits for the first body byte before handing
// the response to the proxy, so that nothing has reached the client while
// a retry is still possible.
type retrier struct{ s *Server }

func (t *retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	s := t.s
	fl := flightFrom(req.Context())
	if fl == nil {
		return nil, errors.New("proxy: request without a flight")
	}
	if fl.view == nil {
		setTarget(req, fl.target.URL)
		resp, err := s.upstream.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		resp.Body = s.track(resp, fl, nil, nil)
		return resp, nil
	}
	ctx := req.Context()
	out := req
	for {
		b := fl.a.Backend
		if !s.allow(b) {
			// A half-open breaker's probes are out: go elsewhere if any
			// other backend can take the request, else probe anyway.
			fl.tried = append(fl.tried, b.ID)
			if next, err := s.sched.Route(fl.view, fl.tried, time.Now()); err == nil {
				fl.a.Done(time.Now())
				s.metrics.routed(fl.view, next)
				fl.a = next
				continue
			}
		}
		fl.target = b
		if fl.retries > 0 {
			out = req.Clone(ctx)
		}
		setTarget(out, b.URL)
		out.Body = io.NopCloser(bytes.NewReader(fl.body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(fl.body)), nil }
		out.ContentLength = int64(len(fl.body))
		out.TransferEncoding = nil

		resp, err := s.upstream.RoundTrip(out)
		var head []byte
		if err == nil {
			switch {
			case resp.StatusCode >= 500:
				err = errStatus(resp.StatusCode)
			case resp.StatusCode/100 != 2:
				// The backend's own answer (a 4xx such as a too long
				// prompt): not a failure of the backend, and its timing
				// says nothing of prefill.
				s.succeeded(b, false)
				resp.Body = s.track(resp, fl, nil, nil)
				return resp, nil
			default:
				var perr error
				head, perr = s.firstByte(resp.Body)
				if len(head) > 0 || perr == io.EOF {
					now := time.Now()
					if len(head) > 0 {
						fl.a.FirstByte(now)
						s.adm.Wake() // its prefill left the backend's pending tokens
						s.metrics.ttft.WithLabelValues(b.Name).Observe(now.Sub(fl.start).Seconds())
					}
					// Success is recorded when the body ends (trackedBody):
					// a backend that starts responses and then breaks them
					// must collect consecutive failures.
					resp.Body = s.track(resp, fl, head, perr)
					return resp, nil
				}
				_ = resp.Body.Close()
				resp, err = nil, perr
			}
		}

		// The attempt failed before its first byte.
		if ctx.Err() != nil {
			if resp != nil {
				_ = resp.Body.Close()
			}
			s.end(fl, statusClientGone)
			return nil, ctx.Err()
		}
		s.failure(b, err)
		var next *scheduler.Assignment
		if fl.retries < s.cfg.Retry.Attempts {
			fl.tried = append(fl.tried, b.ID)
			next, _ = s.sched.Route(fl.view, fl.tried, time.Now())
		}
		if next == nil {
			// Out of attempts or of backends: pass a backend's 5xx through
			// as it is (it says what went wrong), else report the error.
			if resp != nil {
				resp.Body = s.track(resp, fl, nil, nil)
				return resp, nil
			}
			s.end(fl, http.StatusBadGateway)
			return nil, err
		}
		if resp != nil {
			_ = resp.Body.Close()
		}
		fl.a.Done(time.Now())
		s.log.Debug("retry", "from", b.Name, "to", next.Backend.Name, "err", err)
		s.metrics.retries.Inc()
		s.metrics.routed(fl.view, next)
		fl.a = next
		fl.retries++
	}
}

type errStatus int

func (e errStatus) Error() string { return "status " + strconv.Itoa(int(e)) }

// setTarget points out at the backend with base URL base, keeping the
// inbound path (appended to base's path) and query.
func setTarget(out *http.Request, base *url.URL) {
	u := out.URL
	u.Scheme, u.Host = base.Scheme, base.Host
	if base.Path != "" {
		if u.RawPath != "" {
			u.RawPath = base.EscapedPath() + u.RawPath
		}
		u.Path = base.Path + u.Path
	}
	out.Host = ""
}

// peek reads until the first byte of body arrives or the body ends.
func peek(body io.Reader) ([]byte, error) {
	buf := make([]byte, 4096)
	for {
		n, err := body.Read(buf)
		if n > 0 || err != nil {
			return buf[:n], err
		}
	}
}

// end releases the flight's current assignment and counts the request,
// once.
func (s *Server) end(fl *flight, status int) {
	if fl.ended {
		return
	}
	fl.ended = true
	now := time.Now()
	if fl.a != nil {
		fl.a.Done(now)
		s.adm.Wake()
	}
	name := noBackend
	if fl.target != nil {
		name = fl.target.Name
	}
	s.metrics.requests.WithLabelValues(name, s.policyName(), strconv.Itoa(status)).Inc()
	s.metrics.e2e.WithLabelValues(name).Observe(now.Sub(fl.start).Seconds())
}

// track wraps a response body so that the request is released and counted
// when the body ends (EOF, error or Close), exactly once. head holds bytes
// already read by peek, and headErr the error that came with them.
func (s *Server) track(resp *http.Response, fl *flight, head []byte, headErr error) io.ReadCloser {
	return &trackedBody{s: s, fl: fl, rc: resp.Body, head: head, headErr: headErr, status: resp.StatusCode, ctx: resp.Request.Context(),
		sse: resp.StatusCode == http.StatusOK && isSSE(resp.Header.Get("Content-Type"))}
}

type trackedBody struct {
	s       *Server
	fl      *flight
	rc      io.ReadCloser
	head    []byte
	headErr error
	status  int
	ctx     context.Context
	done    atomic.Bool
	// sse marks an event stream, which gets an error event if its backend
	// breaks it (streamerr.go): tail tracks event boundaries, and cut
	// holds the event's unsent bytes, then cutErr is returned.
	sse    bool
	tail   sseTail
	cut    []byte
	cutErr error
}

func (t *trackedBody) Read(p []byte) (int, error) {
	if t.cutErr != nil {
		n := copy(p, t.cut)
		t.cut = t.cut[n:]
		if n == 0 {
			return 0, t.cutErr
		}
		return n, nil
	}
	n, err := t.read(p)
	if !t.sse {
		return n, err
	}
	t.tail.note(p[:n])
	if err != nil && err != io.EOF && t.ctx.Err() == nil {
		name := noBackend
		if t.fl.target != nil {
			name = t.fl.target.Name
		}
		t.cut, t.cutErr = streamErrorEvent(name, err, t.tail.atBoundary()), err
	}
	if t.cutErr != nil {
		if n == 0 {
			return t.Read(p)
		}
		return n, nil // the event follows on the next Read
	}
	return n, err
}

// read is Read for the backend's own bytes.
func (t *trackedBody) read(p []byte) (int, error) {
	if len(t.head) > 0 {
		n := copy(p, t.head)
		t.head = t.head[n:]
		if len(t.head) == 0 && t.headErr != nil {
			t.finish(t.headErr)
			return n, t.headErr
		}
		return n, nil
	}
	if t.headErr != nil {
		return 0, t.headErr
	}
	n, err := t.rc.Read(p)
	if err != nil {
		t.finish(err)
	}
	return n, err
}

func (t *trackedBody) Close() error {
	err := t.rc.Close()
	t.finish(nil)
	return err
}

// finish runs once when the body ends. err is nil for a Close (the proxy
// is done with the body, which includes the client going away), io.EOF for
// a complete body, and anything else for a body broken by the backend.
func (t *trackedBody) finish(err error) {
	if !t.done.CompareAndSwap(false, true) {
		return
	}
	fl, s := t.fl, t.s
	if err != nil && err != io.EOF && t.ctx.Err() == nil && fl.target != nil {
		// The backend broke the response after it started; the client
		// sees a truncated body. Never retried.
		s.failure(fl.target, err)
		s.log.Warn("response broken after first byte", "backend", fl.target.Name, "err", err)
	}
	if err == io.EOF && t.status/100 == 2 && fl.target != nil && fl.view != nil {
		s.succeeded(fl.target, false)
	}
	if fl.view == nil {
		s.metrics.requests.WithLabelValues(fl.target.Name, s.policyName(), strconv.Itoa(t.status)).Inc()
		return
	}
	s.end(fl, t.status)
	if s.log.Enabled(t.ctx, slog.LevelDebug) {
		s.log.Debug("request", "backend", fl.target.Name, "status", t.status, "model", fl.view.Model,
			"prompt_tokens", fl.view.PromptTokens, "reason", fl.a.Reason, "retries", fl.retries,
			"duration", time.Since(fl.start))
	}
}

// passthrough forwards other /v1/* requests to the healthy backend with the
// fewest requests in flight, without scheduling or retries.
func (s *Server) passthrough(w http.ResponseWriter, r *http.Request) {
	var best *fleet.Backend
	var bestLoad int64
	for _, b := range s.fleet.Snapshot().Healthy {
		if l := b.Load().InFlight; best == nil || l < bestLoad {
			best, bestLoad = b, l
		}
	}
	if best == nil {
		s.reject(w, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend", Message: "no healthy backend", RetryAfter: 1})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, int64(s.cfg.Limits.MaxBodyBytes))
	fl := &flight{start: time.Now(), target: best}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), flightKey{}, fl)))
}
