package proxy

import (
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// The Responses API's stored responses live in the memory of the engine
// that produced them (docs/routing.md, "Stored responses"). The router
// learns where each is from what it relays (rememberResponse), and the
// scheduler routes a request naming one (previous_response_id, or the
// paths below) to that engine alone.

// rememberResponse tells the scheduler that the engine which answered a
// Responses request stored its response: the id of a whole JSON answer,
// or of a stream's response.created event, once the body was relayed
// complete (the engine stores a response when it is finished) and the
// request asked for it to be stored.
func (ex *exchange) rememberResponse() {
	rl := ex.relay
	if rl == nil || !rl.counted || !rl.complete || rl.backend == nil || ex.View == nil ||
		ex.View.Kind != request.Responses || !ex.View.Store || rl.tally.ResponseID() == "" {
		return
	}
	ex.s.sched.ResponseStored(rl.tally.ResponseID(), rl.backend, time.Now())
}

// serveStored serves the requests on a stored response: GET and DELETE
// /v1/responses/{id}, POST /v1/responses/{id}/cancel and GET
// /v1/responses/{id}/input_items, forwarded to the engine that holds the
// response as a passthrough request is (admitted, counted in its load,
// not retried). A response the router does not know of, or whose engine
// has left the fleet, is the engine's own 404.
func (s *Server) serveStored(w http.ResponseWriter, r *http.Request) {
	ex, r := s.newExchange(w, r, "", true)
	defer ex.settleDeferred()
	id, methods := storedPath(r.URL.Path)
	if r.URL.RawPath != "" {
		ex.Reject(openai.BadRequest("invalid_path", "the path "+r.URL.RawPath+" has percent-encoded characters that change its meaning once decoded"))
		return
	}
	if id == "" {
		ex.Reject(&openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "not_found", Message: "no route for " + r.Method + " " + r.URL.Path})
		return
	}
	if !strings.Contains(methods, r.Method) {
		for _, m := range strings.Fields(methods) {
			ex.w.Header().Add("Allow", m)
		}
		ex.Reject(&openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path})
		return
	}
	body, e := ex.readBody(ex.w, r)
	if e != nil {
		ex.Reject(e)
		return
	}
	if _, known := s.sched.ResponseHome(id, time.Now()); !known {
		ex.Reject(openai.ResponseNotFound(id))
		return
	}
	// No prompt, no output: the view only names the response, which
	// pins the routing to its engine.
	ex.setView(&request.View{PreviousResponseID: id, MaxTokens: 1}, disagg.Strip(body))
	if s.plane.Route(&ex.Request) {
		ex.forward()
	}
}

// storedPath reads a path under /v1/responses/: the response id and the
// methods allowed on it ("GET DELETE" for the response, "POST" for
// cancel, "GET" for input_items); "" for any other path.
func storedPath(path string) (id, methods string) {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok || rest == "" {
		return "", ""
	}
	id, sub, _ := strings.Cut(rest, "/")
	if id == "" || strings.HasPrefix(id, ".") {
		return "", ""
	}
	switch sub {
	case "":
		if strings.HasSuffix(rest, "/") {
			return "", ""
		}
		return id, "GET DELETE"
	case "cancel":
		return id, "POST"
	case "input_items":
		return id, "GET"
	}
	return "", ""
}
