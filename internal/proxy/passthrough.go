package proxy

import (
	"net/http"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tracer"
)

// passthrough forwards a request to another /v1/ endpoint (embeddings,
// rerank, audio...) listed in passthrough.allow. It goes the way of a
// completion but for the parse: the path is checked, the body read whole
// within the same limits (413 or 503 before a byte is sent), its model
// read (request.ModelOf), admitted, and routed by the scheduler among the
// healthy backends that serve the model, which opens its load ticket. Its
// lifecycle is a completion's (the breaker's Allow and judgement
// included), but it has no tokens, and it is retried only on the idempotent
// endpoints (idempotent).
func (s *Server) passthrough(w http.ResponseWriter, r *http.Request) {
	ex, r := s.newExchange(w, r, tracer.PassOperation(r.URL.Path), true)
	defer ex.settleDeferred()
	if e := s.passAllowed(ex.w, r); e != nil {
		ex.Reject(e)
		return
	}
	body, e := ex.readBody(ex.w, r)
	if e != nil {
		ex.Reject(e)
		return
	}
	if e := s.passView(r, &ex.Request, body); e != nil {
		ex.Reject(e)
		return
	}
	ex.viewSpan()
	if s.plane.Route(&ex.Request) {
		ex.forward()
	}
}

// passView reads a passthrough request's model from its body into r's
// routing view, one without a prompt: no prefix to match, one token of
// output. With it the request's decision is logged and its backend's
// success settled as for a completion. The error, if any, is the answer.
func (s *Server) passView(in *http.Request, r *lifecycle.Request, body []byte) *openai.Error {
	model, e := request.ModelOf(in.Header.Get("Content-Type"), body)
	if e == nil && model == "" && !bodiless(in, body) {
		e = lifecycle.ErrMissingModel()
	}
	if e != nil {
		return e
	}
	r.View, r.Body, r.Model = &request.View{Model: model, MaxTokens: 1}, disagg.Strip(body), s.set.ModelLabel(model)
	r.Idempotent = idempotent[in.URL.Path]
	return nil
}

// idempotent are the passthrough endpoints whose requests are retried on
// another engine before their first byte, as completions are: they read
// and change nothing of an engine's state.
var idempotent = map[string]bool{
	"/v1/embeddings": true, "/v1/rerank": true, "/v2/rerank": true, "/rerank": true, "/v1/score": true, "/score": true,
	"/v1/classify": true, "/classify": true, "/pooling": true, "/v1/tokenize": true, "/v1/detokenize": true,
	"/tokenize": true, "/detokenize": true, "/v1/messages/count_tokens": true,
}

// passAllowed checks a passthrough request's path and method against
// passthrough.allow. A path whose raw form is not the plain encoding of
// its decoded form (%2F, %2e, an escaped letter) is refused outright:
// uvicorn-based engines decode it, so /v1/chat%2Fcompletions would reach
// their chat endpoint around every check the router makes of completions.
func (s *Server) passAllowed(w http.ResponseWriter, r *http.Request) *openai.Error {
	if r.URL.RawPath != "" {
		return openai.BadRequest("invalid_path", "the path "+r.URL.RawPath+" has percent-encoded characters that change its meaning once decoded")
	}
	pathKnown := false
	for _, e := range s.passAllow {
		if e.Path == r.URL.Path {
			if e.Method == r.Method {
				return nil
			}
			pathKnown = true
		}
	}
	if pathKnown {
		for _, e := range s.passAllow {
			if e.Path == r.URL.Path {
				w.Header().Add("Allow", e.Method)
			}
		}
		return &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path}
	}
	return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "not_found", Message: "no route for " + r.Method + " " + r.URL.Path}
}

// bodiless reports whether r is a request that carries nothing to route
// by (a GET, HEAD or DELETE without a body), which any backend may serve.
func bodiless(r *http.Request, body []byte) bool {
	return len(body) == 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodDelete)
}
