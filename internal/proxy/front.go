package proxy

import (
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// What another front of the lifecycle (the Envoy external processor,
// package epp) shares with the HTTP front, so that a request is read,
// admitted and split by the same rules whatever carries it. in is the
// request as its transport carried it, without its body: its headers, the
// address it came from, its context.

// Plane is what every request's lifecycle shares.
func (s *Server) Plane() *lifecycle.Plane { return s.plane }

// ReadFor reads a completion's body for r as the HTTP front reads it
// (read): the transport's session header and its tenant's prefix salt,
// the split protocols' members stripped, the model's metric label.
func (s *Server) ReadFor(in *http.Request, r *lifecycle.Request, kind request.Kind, body []byte) *openai.Error {
	return s.read(in, s.tenantOf(in), r, kind, body)
}

// read parses body into r's view (lifecycle.Plane.Read) with the hints of
// in and t, and its objectives from in's headers (objectiveOf); a client's
// split protocol members never reach an engine, split or whole
// (disagg.Strip). The error, if any, is the answer.
func (s *Server) read(in *http.Request, t tenant, r *lifecycle.Request, kind request.Kind, body []byte) *openai.Error {
	hints := lifecycle.Hints{Session: s.sessionHeader(in), Salt: t.prefixSalt}
	e := s.plane.Read(r, kind, body, hints)
	if r.View != nil {
		r.Body, r.Model = disagg.Strip(body), s.set.ModelLabel(r.View.Model)
	}
	if e == nil && r.View != nil {
		// The request's latency objectives (objectives.go).
		r.View.Objective, e = s.objectiveOf(in, r.View.Model)
	}
	return e
}

// ReadPassFor reads a request to another endpoint than the completions
// for r as the HTTP front reads it (passthrough): its path and method
// checked against passthrough.allow, its model read, a view without a
// prompt, never retried unless idempotent.
func (s *Server) ReadPassFor(in *http.Request, r *lifecycle.Request, body []byte) *openai.Error {
	r.Passthrough = true
	if e := s.passAllowed(discardWriter{}, in); e != nil {
		return e
	}
	return s.passView(in, r, body)
}

// discardWriter takes the headers an answer would carry and drops them.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) WriteHeader(int)             {}

// AdmitFor waits for r's admission as the HTTP front's exchange does
// (admit): the priority its trusted front or API key gives, the peers'
// catch-up, the queue.
func (s *Server) AdmitFor(in *http.Request, r *lifecycle.Request) (func(), *openai.Error) {
	return s.admit(in, r.View.Model, s.costOf(r.View, r.Hashes), r.View.Objective.TTFT)
}

// SplitFor gives r its legs when the split decision splits it (split).
func (s *Server) SplitFor(r *lifecycle.Request) {
	s.applyPlan(r, s.splitter.Split(r.View, r.Hashes, time.Now()))
}

// TokenizeFor returns the precise index's keys of r's prompt as the HTTP
// front's exchange gets them (tokenKeys), nil to route approximately, and
// remember, which the front calls with the request's status once it
// settled: it caches the token ids when the engine accepted the request
// (rememberTokens). remember is nil when there is nothing to cache.
func (s *Server) TokenizeFor(in *http.Request, r *lifecycle.Request) (keys []uint64, remember func(status int)) {
	keys, t := s.tokenKeys(in.Context(), r.View, r.Body)
	if t.tokens == nil {
		return keys, nil
	}
	return keys, func(status int) { s.rememberTokens(t, status) }
}

// BeginAccess begins the access log line of the request in carries
// (front names its front) as the HTTP front's access log does: its
// request id, the client's X-Request-Id when valid, else a new one, set
// on in's headers (made reports so: the engine is to get it); the client's
// trace id. EndAccess writes it once the request settled, as the HTTP
// front's (settleAccess, writeAccess): r's outcome, and its tokens from
// tally, nil for an answer not counted.
func (s *Server) BeginAccess(in *http.Request, front string) (id string, made bool) {
	had := in.Header.Get(headerRequestID)
	e := newAccess(in, front)
	return e.id, e.id != had
}

// EndAccess writes the access log line of r, which in carried (its
// request id in r.ID, from BeginAccess).
func (s *Server) EndAccess(in *http.Request, r *lifecycle.Request, front string, tally *lifecycle.Tally) {
	if !s.cfg.Log.Access {
		return
	}
	e := newAccess(in, front)
	if r.ID != "" {
		e.id = r.ID
	}
	e.settle(r)
	e.tokensIn, e.tokensOut = tokensOf(r.View, tally)
	s.writeAccess(in, e, 0, r.Start, s.cfg.Log.Access)
}

// HoldBody takes room for n bytes of a body in the budget of buffered
// bodies (limits.max_buffered_bytes); false when there is none. GiveBody
// gives it back.
func (s *Server) HoldBody(n int64) bool { return s.bodies.take(n) }

// GiveBody gives back room HoldBody took.
func (s *Server) GiveBody(n int64) { s.bodies.give(n) }
