package config

import (
	"net/http"
	"slices"
	"strings"
)

// DefaultPassthrough are the endpoints forwarded besides the two
// completions and /v1/models: the inference and tokenizer endpoints of
// vLLM and SGLang under /v1/ (vLLM: embeddings, score, rerank,
// audio/transcriptions and audio/translations; SGLang: embeddings,
// rerank, score, tokenize, detokenize), and OpenAI's audio/speech and
// classify-style endpoints. Management endpoints (vLLM's
// /v1/load_lora_adapter and /v1/unload_lora_adapter, SGLang's /v1/files
// and /v1/batches) and stateful ones (/v1/responses, whose stored
// responses live on one backend) are not in it.
var DefaultPassthrough = []string{
	"POST /v1/embeddings",
	"POST /v1/rerank",
	"POST /v1/score",
	"POST /v1/classify",
	"POST /v1/audio/transcriptions",
	"POST /v1/audio/translations",
	"POST /v1/audio/speech",
	"POST /v1/tokenize",
	"POST /v1/detokenize",
	"POST /v1/messages/count_tokens",
	"POST /rerank",
	"POST /tokenize",
	"POST /detokenize",
}

// RootEndpoints are the engines' endpoints outside /v1/ that
// passthrough.allow may list: vLLM's and SGLang's rerank, score, tokenizer
// and pooling endpoints. The router serves none of them itself.
var RootEndpoints = []string{"/rerank", "/v2/rerank", "/score", "/classify", "/pooling", "/tokenize", "/detokenize"}

// Passthrough lists the endpoints, other than the ones the router serves
// itself (the completions, /v1/responses, /v1/messages, /v1/models), that
// it forwards: under /v1/, or one of RootEndpoints. Each request
// to one is read whole (limits apply as to completions, 413 before a byte
// is sent), routed by the policy to a healthy backend that serves the
// model its body names (a body without a model is a 400; a body-less
// GET, HEAD or DELETE goes to any backend), and counted in that backend's
// load. A path whose percent-encoded form differs from its decoded form
// (/v1/chat%2Fcompletions) is a 400: an engine would decode it into
// another endpoint than the one the router checked. Any other /v1/ path
// is a 404, or a 405 when only the method differs.
type Passthrough struct {
	// Allow lists the endpoints as "METHOD /path", matched exactly (no
	// prefixes). Default DefaultPassthrough; an empty list forwards none.
	Allow []string `yaml:"allow"`
}

func defaultPassthrough() Passthrough {
	return Passthrough{Allow: append([]string(nil), DefaultPassthrough...)}
}

// Endpoint is one allowed method and path.
type Endpoint struct{ Method, Path string }

// Endpoints parses Allow; Validate has checked it.
func (p Passthrough) Endpoints() []Endpoint {
	out := make([]Endpoint, 0, len(p.Allow))
	for _, a := range p.Allow {
		if m, path, ok := strings.Cut(strings.TrimSpace(a), " "); ok {
			out = append(out, Endpoint{m, strings.TrimSpace(path)})
		}
	}
	return out
}

var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

func (p Passthrough) validate(bad func(format string, args ...any)) {
	for i, a := range p.Allow {
		m, path, ok := strings.Cut(strings.TrimSpace(a), " ")
		path = strings.TrimSpace(path)
		switch {
		case !ok:
			bad("passthrough.allow[%d]: %q must be \"METHOD /v1/path\"", i, a)
		case !slices.Contains(methods, m):
			bad("passthrough.allow[%d]: %q is not one of %s", i, m, strings.Join(methods, ", "))
		case slices.Contains(RootEndpoints, path):
		case !strings.HasPrefix(path, "/v1/") || strings.ContainsAny(path, "% ?#") || strings.Contains(path, "/.") || strings.HasSuffix(path, "/"):
			bad("passthrough.allow[%d]: %q must be a plain path under /v1/, or one of %s", i, path, strings.Join(RootEndpoints, ", "))
		case path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/models" || path == "/v1/responses" ||
			path == "/v1/messages" || strings.HasPrefix(path, "/v1/responses/"):
			bad("passthrough.allow[%d]: %s is served by the router itself", i, path)
		}
	}
}
