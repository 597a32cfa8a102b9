package lifecycle

import (
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// Reading is how a plane reads a completion's body (Plane.Read): the
// parser's options and the context check's settings (limits.*).
type Reading struct {
	Options request.Options
	// RejectOverContext is limits.reject_over_context; MaxBytesPerToken
	// limits.max_bytes_per_token, the bound the check counts a prompt's
	// tokens by.
	RejectOverContext bool
	MaxBytesPerToken  int
}

// Hints are what a front's transport says of a request beside its body.
type Hints struct {
	// Session is the session key the transport carries (session.header);
	// it wins over the body's session field. Empty: none.
	Session string
	// Salt returns the prefix salt the request's tenant puts on the
	// body's own (cache_salt); nil leaves it as the body says.
	Salt func(body string) string
}

// Read parses body, a completion of kind, into r's routing view with the
// front's hints, checks it against the largest context its model is
// served with, and hashes its prompt once. Every front reads a body
// through it, so that what the router refuses and how it sees a prompt
// are one rule. The error, if any, is the answer; r.View is set whenever
// the body parsed (a refusal of its context still names its model).
func (p *Plane) Read(r *Request, kind request.Kind, body []byte, h Hints) *openai.Error {
	v, e := request.Parse(kind, body, p.Reading.Options)
	if e == nil && v.Model == "" {
		e = ErrMissingModel()
	}
	if e != nil {
		return e
	}
	if h.Session != "" {
		v.SessionKey = h.Session
	}
	if h.Salt != nil {
		v.PrefixSalt = h.Salt(v.PrefixSalt)
	}
	r.View, r.Body = v, body
	if e := p.checkContext(v); e != nil {
		return e
	}
	r.Hashes = p.Sched.Hashes(v)
	return nil
}

// ErrMissingModel answers a body that names no model: it would match
// every backend, whatever pool serves what.
func ErrMissingModel() *openai.Error {
	return openai.BadRequest("missing_model", "you must provide a model parameter")
}

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
func (p *Plane) checkContext(v *request.View) *openai.Error {
	if !p.Reading.RejectOverContext {
		return nil
	}
	largest, known := p.Set.MaxContext(v.Model)
	if !known {
		return nil
	}
	prompt := v.MinPromptTokens(p.Reading.MaxBytesPerToken)
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
