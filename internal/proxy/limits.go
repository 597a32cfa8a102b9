package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// checkContext rejects a request whose estimated prompt tokens exceed the
// largest context among the backends that serve its model, with vLLM's
// wording, so that it never occupies a backend only to be refused there.
// A candidate of unknown context lifts the limit: the router does not
// guess.
func (s *Server) checkContext(v *request.View) *openai.Error {
	if !s.cfg.Limits.RejectOverContext {
		return nil
	}
	largest, known := s.set.MaxContext(v.Model)
	if !known || v.PromptTokens <= largest {
		return nil
	}
	what := "messages"
	if v.Kind == request.Completion {
		what = "prompt"
	}
	return &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest, Code: "context_length_exceeded",
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has about %d input tokens (the router's estimate). Please reduce the length of the input %s.", largest, v.PromptTokens, what)}
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
