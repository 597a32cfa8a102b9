package epp

import (
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// headerValue is a header's value: raw_value when the data plane sent it
// (Envoy does), else value (a minimal data plane's).
func headerValue(h *corev3.HeaderValue) string {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return h.GetValue()
}

// header is a header to set, its key lowercase and its value raw, as
// Envoy takes them.
func header(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

// subsetOf is the subset hint in a request's metadata context: its
// endpoints, and whether a hint was given (an empty list is one: nothing is
// eligible). A value that is not a list of strings hints nothing usable.
func subsetOf(md *corev3.Metadata) ([]string, bool) {
	ns := md.GetFilterMetadata()[MetadataSubset]
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil, false
	}
	var out []string
	for _, e := range v.GetListValue().GetValues() {
		if s := e.GetStringValue(); s != "" {
			out = append(out, s)
		}
	}
	return out, true
}

// servedOf is the endpoint that served, from a response's metadata
// context; "" when the data plane did not say.
func servedOf(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[MetadataLB].GetFields()[KeyServed].GetStringValue()
}

// decisionMetadata is the decision in the response's dynamic metadata:
// envoy.lb's x-gateway-destination-endpoint, the header's value.
func decisionMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

// immediateResponse answers with e in OpenAI's error shape, its status,
// content type and Retry-After.
func immediateResponse(e *openai.Error) *extprocv3.ProcessingResponse {
	w := &bufferedWriter{h: http.Header{}}
	e.Write(w)
	var set []*corev3.HeaderValueOption
	for _, k := range []string{"content-type", "retry-after"} {
		if v := w.h.Get(k); v != "" {
			set = append(set, header(k, v))
		}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    w.body.Bytes(),
			Details: e.Code,
		}}}
}

// bufferedWriter keeps what an error writes (openai.Error.Write), for an
// immediate response.
type bufferedWriter struct {
	h    http.Header
	body bytes.Buffer
}

func (w *bufferedWriter) Header() http.Header         { return w.h }
func (w *bufferedWriter) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *bufferedWriter) WriteHeader(int)             {}

// tooLarge answers a body over limits.max_body_bytes, as the HTTP front
// does.
func tooLarge(limit int64) *openai.Error {
	return &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest, Code: "request_too_large",
		Message: "the request body is over limits.max_body_bytes (" + strconv.FormatInt(limit, 10) + " bytes)"}
}

// kinds are the completions' paths.
var kinds = map[string]request.Kind{
	"/v1/chat/completions": request.Chat,
	"/v1/completions":      request.Completion,
	"/v1/responses":        request.Responses,
	"/v1/messages":         request.Messages,
}

// passthrough reports whether path (the data plane's :path, without its
// query) is another endpoint than the completions: "" and "/" (a data
// plane that sent no :path) are read as completions.
func passthrough(path string) bool {
	_, completion := kinds[path]
	return !completion && path != "" && path != "/"
}

// kindOf is the kind of completion a request is: its path's, else (a data
// plane that sends no :path) its body's: a chat completion has messages,
// a Responses request input, anything else is read as a completion.
func kindOf(path string, body []byte) request.Kind {
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		path = path[:i]
	}
	if k, ok := kinds[path]; ok {
		return k
	}
	kind := request.Completion
	_ = request.Members(body, func(key []byte, _, _, _ int) {
		switch string(key) {
		case "messages":
			kind = request.Chat
		case "input":
			if kind != request.Chat {
				kind = request.Responses
			}
		}
	})
	return kind
}

// backendAt is the backend at addr (ip:port, as its URL's host), nil for
// none.
func backendAt(set *members.Set, addr string) *fleet.Backend {
	for _, m := range set.All() {
		if m.B.URL.Host == addr {
			return m.B
		}
	}
	return nil
}

// fallbacks are at most n endpoints to try after pick, for a data plane
// that retries down the list: the healthy backends that serve v's model
// and take whole requests or decode legs (not a prefill engine), within
// the subset hint, least loaded first (pending prefill, then in flight),
// without the pick. They are the data plane's to try; the request's load
// moves to the one that serves (lifecycle.Plane.Served).
func fallbacks(set *members.Set, v *request.View, pick *fleet.Backend, subset []string, hinted bool, n int) []*fleet.Backend {
	var out []*fleet.Backend
	for _, m := range set.All() {
		b := m.B
		if b == pick || !b.Healthy() || b.Draining() || !b.Serves(v.Model) || set.RoleOf(b) == config.RolePrefill {
			continue
		}
		if hinted && !slices.Contains(subset, b.URL.Host) {
			continue
		}
		out = append(out, b)
	}
	slices.SortStableFunc(out, func(a, b *fleet.Backend) int {
		la, lb := a.Load(), b.Load()
		if la.PendingPrefill != lb.PendingPrefill {
			return cmpInt(la.PendingPrefill, lb.PendingPrefill)
		}
		return cmpInt(la.InFlight, lb.InFlight)
	})
	return out[:min(n, len(out))]
}

func cmpInt[T int | int64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// nilURL is the URL of a request whose path the picker does not use.
func nilURL() *url.URL { return &url.URL{Path: "/"} }

// noTrace traces nothing: the picker with tracing off.
type noTrace struct{}

func (noTrace) RouteStart()                                               {}
func (noTrace) RouteEnd(*scheduler.Assignment, error)                     {}
func (noTrace) Attempt(*lifecycle.Request, *lifecycle.Leg, *http.Request) {}
func (noTrace) AttemptFailed(error)                                       {}
func (noTrace) FirstByte()                                                {}
func (noTrace) LegStart(*lifecycle.Leg)                                   {}
func (noTrace) LegEnd(*lifecycle.Leg)                                     {}
