package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// guard holds what the router checks before it routes anything: the API
// keys, and each backend's context length per model. It is built in New
// and read-only afterwards.
type guard struct {
	auth *apiKeys // nil: no API key check
	// discovered[i] maps backend i's models to the max_model_len its
	// /v1/models reported; written once per backend during discovery.
	discovered []map[string]int
	// ctx maps a backend name to its context length per model ("" for the
	// configured backends[].max_model_len, which covers all its models).
	ctx map[string]map[string]int
}

// noteModelLens records the max_model_len of the models in a backend's
// /v1/models answer (vLLM and SGLang report it; others leave it out).
func (s *Server) noteModelLens(i int, ids []string, raw []json.RawMessage) {
	if i >= len(s.guard.discovered) {
		return
	}
	lens := map[string]int{}
	for j, m := range raw {
		var e struct {
			MaxModelLen int `json:"max_model_len"`
		}
		if json.Unmarshal(m, &e) == nil && e.MaxModelLen > 0 && j < len(ids) {
			lens[ids[j]] = e.MaxModelLen
		}
	}
	s.guard.discovered[i] = lens
}

// buildContexts fills the context table from the configuration and
// discovery, by backend name (the fleet may gain backends later; those
// count as of unknown context).
func (s *Server) buildContexts() {
	s.guard.ctx = map[string]map[string]int{}
	for i, b := range s.fleet.Snapshot().All {
		if i >= len(s.cfg.Backends) {
			break
		}
		m := map[string]int{}
		if i < len(s.guard.discovered) {
			for k, v := range s.guard.discovered[i] {
				m[k] = v
			}
		}
		if n := s.cfg.Backends[i].MaxModelLen; n > 0 {
			m[""] = n
		}
		s.guard.ctx[b.Name] = m
	}
}

// contextOf returns b's context length for model, 0 when unknown. The
// configured backends[].max_model_len wins over what /v1/models says.
func (s *Server) contextOf(b *fleet.Backend, model string) int {
	m := s.guard.ctx[b.Name]
	if n := m[""]; n > 0 {
		return n
	}
	return m[model]
}

// checkContext rejects a request whose estimated prompt tokens exceed the
// largest context among the backends that serve its model, with vLLM's
// wording, so that it never occupies a backend only to be refused there.
// A candidate of unknown context lifts the limit: the router does not
// guess.
func (s *Server) checkContext(v *request.View) *openai.Error {
	if !s.cfg.Limits.RejectOverContext {
		return nil
	}
	largest := 0
	for _, b := range s.fleet.Snapshot().All {
		if len(b.Models) > 0 && !slices.Contains(b.Models, v.Model) {
			continue
		}
		n := s.contextOf(b, v.Model)
		if n == 0 {
			return nil
		}
		largest = max(largest, n)
	}
	if largest == 0 || v.PromptTokens <= largest {
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
