package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/lifecycle"
)

// The access log is one line per request, whatever its outcome (Envoy's
// and HAProxy's access logs, in the router's own slog format): the
// request id, the client, method and path, the status, and for a request
// that reached the exchange its model, backend, attempts, TTFT, tokens,
// the routing reason or the router's error code, and its trace id.
// Durations are in milliseconds. The probes and /metrics are logged at
// debug, so that a scraper does not fill the log.
//
// Every request carries an X-Request-Id: the client's when it sends a
// valid one (requestIDOK), else one the router makes (a UUID, as Envoy's).
// The engine receives it (vLLM takes it as its request id), and the client
// gets it back on the response.

// headerRequestID is the request id's header, client, router and engine
// alike.
const headerRequestID = "X-Request-Id"

// maxRequestID bounds a client's request id.
const maxRequestID = 128

// accessEntry is one request's access log line beyond what the HTTP layer
// sees. accessLog puts it in the request's context; the exchange fills it
// in its settle (settleAccess), before the line is written.
type accessEntry struct {
	id string
	// front is the front that carried the request: "http", or "epp"
	// (the Endpoint Picker, whose gateway forwarded it).
	front string
	// status is the outcome the exchange settled on (499: the client
	// left); 0 for a request no exchange served, whose status the
	// response writer saw.
	status                       int
	model, backend, reason, code string
	// prefill is the engine of a split request's prefill leg.
	prefill string
	// moved says where a stream whose engine failed went
	// ("a->b (broken)"), "" for one that did not move.
	moved               string
	attempts            int
	ttft                time.Duration
	tokensIn, tokensOut int
	traceID             trace.TraceID
}

type accessKey struct{}

// accessOf is the request's access log entry, nil outside accessLog.
func accessOf(ctx context.Context) *accessEntry {
	e, _ := ctx.Value(accessKey{}).(*accessEntry)
	return e
}

// requestIDOK reports whether a client's request id is kept: 1 to 128
// letters, digits and -_.:/+=@, which every log format and engine takes
// as it is.
func requestIDOK(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == ':' || c == '/' || c == '+' || c == '=' || c == '@':
		default:
			return false
		}
	}
	return true
}

// newRequestID makes a request id; a test seam.
var newRequestID = uuid.NewString

// accessLog gives every request its id and writes its access log line
// when it ends (also when the reverse proxy aborts it).
func (s *Server) accessLog(next http.Handler) http.Handler {
	enabled := s.cfg.Log.Access
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		e := newAccess(r, "http")
		w.Header().Set(headerRequestID, e.id)
		// An exchange settles its own status (499 included); the writer
		// notes that of a response the router writes outside one.
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if sw.status == 0 && e.status == 0 {
					e.status = http.StatusBadGateway
				}
				s.writeAccess(r, e, sw.status, start, enabled)
				panic(p)
			}
			s.writeAccess(r, e, sw.status, start, enabled)
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), accessKey{}, e)))
	})
}

// newAccess is the access log entry of r, carried by front: its request
// id (the client's X-Request-Id when it is valid, else a new one, set on
// r's headers for the engine) and the client's trace id, which the
// exchange's span replaces when tracing is on.
func newAccess(r *http.Request, front string) *accessEntry {
	id := r.Header.Get(headerRequestID)
	if !requestIDOK(id) {
		id = newRequestID()
		r.Header.Set(headerRequestID, id)
	}
	e := &accessEntry{id: id, front: front}
	if tp := r.Header.Get("Traceparent"); tp != "" {
		e.traceID = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
			propagation.HeaderCarrier(r.Header))).TraceID()
	}
	return e
}

// writeAccess writes the access log line of r.
func (s *Server) writeAccess(r *http.Request, e *accessEntry, written int, start time.Time, enabled bool) {
	level := slog.LevelInfo
	switch r.URL.Path {
	case "/healthz", "/readyz", "/health", "/metrics":
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !enabled || !s.log.Enabled(ctx, level) {
		return
	}
	status := e.status
	if status == 0 {
		status = written
	}
	if status == 0 {
		status = http.StatusOK // the handler wrote nothing: net/http sends 200
	}
	attrs := make([]slog.Attr, 0, 19)
	attrs = append(attrs,
		slog.String("request_id", e.id),
		slog.String("client", r.RemoteAddr),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("front", e.front),
		slog.String("model", e.model),
		slog.Int("status", status),
		slog.String("backend", e.backend),
		slog.String("prefill_backend", e.prefill),
		slog.Int("attempts", e.attempts),
		slog.Float64("ttft_ms", millis(e.ttft)),
		slog.Float64("duration_ms", millis(time.Since(start))),
		slog.Int("tokens_in", e.tokensIn),
		slog.Int("tokens_out", e.tokensOut),
		slog.String("reason", e.reason),
	)
	if e.code != "" {
		attrs = append(attrs, slog.String("error", e.code))
	}
	if e.moved != "" {
		attrs = append(attrs, slog.String("moved", e.moved))
	}
	if e.traceID.IsValid() {
		attrs = append(attrs, slog.String("trace_id", e.traceID.String()))
	}
	s.log.LogAttrs(ctx, level, "access", attrs...)
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// unwrapStatus is the server's own writer under statusWriter: the
// exchange writes to it directly, so that http.MaxBytesReader can tell
// the server to close the connection after a body too large.
func unwrapStatus(w http.ResponseWriter) http.ResponseWriter {
	if sw, ok := w.(*statusWriter); ok {
		return sw.ResponseWriter
	}
	return w
}

// settleAccess fills the exchange's access log entry.
func (ex *exchange) settleAccess() {
	e := ex.entry
	if e == nil {
		return
	}
	e.settle(&ex.Request)
	e.tokensIn, e.tokensOut = ex.tokens()
	if ex.relay != nil {
		e.moved = ex.relay.mover.trailOf()
	}
	if ex.span != nil {
		e.traceID = ex.span.SpanContext().TraceID()
	}
}

// settle fills e with what the settled request r says, whatever front
// carried it: its status and error code, TTFT, model, the backend that
// served and its attempts, the decision's reason, the prefill engine.
func (e *accessEntry) settle(r *lifecycle.Request) {
	e.status, e.code, e.ttft = r.Status, r.Code, r.TTFT
	if r.View != nil {
		e.model = r.View.Model
	}
	if l := r.Leg(); l.Target != nil {
		e.backend, e.attempts = l.Target.B.Name, r.Retries()+1
		// The request's reason names every leg and why a request that
		// could be split was served whole, as X-Kvroute-Reason does.
		e.reason = r.Reason()
	}
	e.prefill = prefillBackend(r)
}
