package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// checkContext rejects a request that no backend serving its model could
// take, with vLLM's wording, so that it never occupies a backend only to be
// refused there. It refuses only on a lower bound of the prompt's tokens
// (request.View.MinPromptTokens: exact for token ids, else the prompt's
// bytes over limits.max_bytes_per_token), plus max_tokens, against the
// largest context among those backends: the router's 4-bytes-a-token
// estimate is often above the truth (code, CJK text) and must never turn
// away what the engine would serve. Anything below the bound is forwarded,
// and the engine's own tokenizer decides. A candidate of unknown context
// lifts the limit: the router does not guess.
func (s *Server) checkContext(v *request.View) *openai.Error {
	if !s.cfg.Limits.RejectOverContext {
		return nil
	}
	largest, known := s.set.MaxContext(v.Model)
	if !known {
		return nil
	}
	prompt := v.MinPromptTokens(s.cfg.Limits.MaxBytesPerToken)
	total := request.AddTokens(prompt, v.MaxTokens)
	if total <= largest {
		return nil
	}
	what, atLeast := "messages", "at least "
	if v.Kind == request.Completion {
		what = "prompt"
	}
	if v.PromptExact {
		atLeast = ""
	}
	msg := fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %s%d input tokens. Please reduce the length of the input %s.", largest, atLeast, prompt, what)
	if v.MaxTokens > 0 {
		msg = fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %s%d tokens (%s%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			largest, atLeast, total, atLeast, prompt, what, v.MaxTokens, what)
	}
	return &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Code: "context_length_exceeded", Message: msg}
}

// errMissingModel answers a body that names no model: it would match
// every backend, whatever pool serves what.
func errMissingModel() *openai.Error {
	return openai.BadRequest("missing_model", "you must provide a model parameter")
}

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

// hold takes n bytes of the body budget for the exchange.
func (ex *exchange) hold(n int64) bool {
	if !ex.s.bodies.take(n) {
		return false
	}
	ex.held += n
	return true
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

// limitBody bounds the time a client takes to send its body (slowloris on
// the body): the connection's read deadline is set when the handler starts.
// It must not outlive the body, or it would cut long responses: net/http
// clears it when the body hits EOF (before its background read of the
// connection), and deadlineBody clears it on any other end as well.
func (s *Server) limitBody(next http.Handler) http.Handler {
	timeout := s.cfg.Limits.BodyTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline when the body ends, and turns a
// deadline expiry into errBodyTimeout. After an expiry the deadline stays:
// the server would otherwise wait for the rest of the slow body before
// closing the connection.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

// errBodyTimeout is the body read error of a client that sent its body too
// slowly.
var errBodyTimeout = errors.New("the client sent its request body too slowly")

func (d *deadlineBody) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err == nil || d.done {
		return n, err
	}
	d.done = true
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return n, errBodyTimeout
	}
	_ = d.rc.SetReadDeadline(time.Time{})
	return n, err
}

// bodyTimeout is the client error of a body sent too slowly. The
// connection is closed after it, since the rest of the body may still be
// on its way.
func (s *Server) bodyTimeout(w http.ResponseWriter) *openai.Error {
	w.Header().Set("Connection", "close")
	return &openai.Error{Status: http.StatusRequestTimeout, Type: openai.TypeInvalidRequest, Code: "body_timeout",
		Message: fmt.Sprintf("the request body did not arrive within limits.body_timeout (%v)", s.cfg.Limits.BodyTimeout)}
}
