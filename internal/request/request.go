// Package request turns the body of an OpenAI-compatible request into the
// routing view: the model, the prompt text as the engine will see it, the
// session key, the token estimate and the output budget. The body is parsed
// once, here; the original bytes are forwarded untouched by the proxy.
//
// The rendering of chat messages into prompt text is the single definition
// of "what the engine sees" in kvroute: the router's prefix index and the
// emulated engine both use Render, so that the router's picture of a
// backend's cache and the engine's cache agree.
//
// This package does no I/O and knows nothing of backends or policies.
package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/openai"
)

// Kind is the endpoint a request was sent to.
type Kind uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat Kind = iota
	// Completion is POST /v1/completions.
	Completion
)

func (k Kind) String() string {
	if k == Chat {
		return "chat"
	}
	return "completion"
}

// Path is the URL path of the endpoint of kind k.
func (k Kind) Path() string {
	if k == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// BytesPerToken is the router's estimate of prompt bytes per token, about
// right for English text with BPE tokenizers, and exact for the emulated
// engine's tokenizer.
const BytesPerToken = 4

// View is the routing view of one request. It is immutable once parsed,
// except SessionKey, which the HTTP layer may set from a header before routing.
type View struct {
	Kind  Kind
	Model string
	// Prompt is the rendered prompt text (see Render).
	Prompt string
	// FirstUser is the text of the first user message (chat only); KubeAI's
	// prefix hash keys on it.
	FirstUser string
	// SessionKey identifies a conversation; empty when the client sent none.
	SessionKey string
	// PromptTokens estimates the prompt length in tokens.
	PromptTokens int
	// MaxTokens is the output budget (max_completion_tokens, else
	// max_tokens); 0 when the client set none.
	MaxTokens int
	// MinTokens and IgnoreEOS are vLLM's sampling extensions; the emulated
	// engine honours them.
	MinTokens int
	IgnoreEOS bool
	Stream    bool
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
}

// Options configure Parse.
type Options struct {
	// SessionField names a top-level body field (e.g. "user") whose string
	// value is the session key when no header gave one. Empty disables it.
	SessionField string
	// MaxMessages bounds the number of chat messages; 0 means
	// MaxMessages, the package default.
	MaxMessages int
}

// Limits that keep a hostile body from costing more than its size.
const (
	MaxMessages = 100000
)

type chatBody struct {
	Model               string         `json:"model"`
	Messages            []message      `json:"messages"`
	Tools               []rawValue     `json:"tools"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	MinTokens           *int           `json:"min_tokens"`
	IgnoreEOS           bool           `json:"ignore_eos"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
}

type completionBody struct {
	Model         string         `json:"model"`
	Prompt        rawValue       `json:"prompt"`
	MaxTokens     *int           `json:"max_tokens"`
	MinTokens     *int           `json:"min_tokens"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Message is one chat message as Render consumes it.
type message struct {
	Role      string   `json:"role"`
	Content   rawValue `json:"content"`
	Name      string   `json:"name"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// rawValue is a JSON value of the body left undecoded, like
// json.RawMessage, but aliasing the body instead of copying it: message
// contents and prompts make up nearly all of a body, and copying them out
// only to decode them again (validating them a second time) cost as much as
// the rest of Parse.
type rawValue []byte

// UnmarshalJSON keeps data, a slice of the body that json.Unmarshal has
// already validated as one JSON value. Keeping it without a copy is safe
// because it aliases the body given to Parse, which outlives the decode, and
// Parse copies whatever the view keeps before it returns. It never fails, so
// that a content of the wrong type is still reported by writeContent with the
// message's index.
func (r *rawValue) UnmarshalJSON(data []byte) error {
	*r = data
	return nil
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Parse parses body, sent to the endpoint of kind k, into a View. Errors are
// client errors (400) in the OpenAI shape.
func Parse(k Kind, body []byte, opt Options) (*View, *openai.Error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, openai.BadRequest("invalid_json", "request body must be a JSON object")
	}
	v := &View{Kind: k}
	var maxTok, minTok *int
	switch k {
	case Chat:
		var b chatBody
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, jsonError(err)
		}
		if len(b.Messages) == 0 {
			return nil, openai.BadRequest("missing_messages", "'messages' must be a non-empty array")
		}
		limit := MaxMessages
		if opt.MaxMessages > 0 {
			limit = opt.MaxMessages
		}
		if len(b.Messages) > limit {
			return nil, openai.BadRequest("too_many_messages", fmt.Sprintf("'messages' has %d entries, more than the limit of %d", len(b.Messages), limit))
		}
		prompt, first, err := renderChat(b.Messages, b.Tools, len(body))
		if err != nil {
			return nil, err
		}
		v.Model, v.Prompt, v.FirstUser = b.Model, prompt, first
		v.IgnoreEOS, v.Stream = b.IgnoreEOS, b.Stream
		v.IncludeUsage = b.StreamOptions != nil && b.StreamOptions.IncludeUsage
		maxTok, minTok = b.MaxTokens, b.MinTokens
		if b.MaxCompletionTokens != nil {
			maxTok = b.MaxCompletionTokens
		}
		v.PromptTokens = EstimateTokens(v.Prompt)
	case Completion:
		var b completionBody
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, jsonError(err)
		}
		prompt, ntok, err := renderPrompt(b.Prompt)
		if err != nil {
			return nil, err
		}
		v.Model, v.Prompt = b.Model, prompt
		v.IgnoreEOS, v.Stream = b.IgnoreEOS, b.Stream
		v.IncludeUsage = b.StreamOptions != nil && b.StreamOptions.IncludeUsage
		maxTok, minTok = b.MaxTokens, b.MinTokens
		v.PromptTokens = ntok
		if ntok < 0 {
			v.PromptTokens = EstimateTokens(v.Prompt)
		}
	default:
		return nil, openai.BadRequest("invalid_endpoint", "unknown endpoint")
	}
	if maxTok != nil {
		if *maxTok < 0 {
			return nil, openai.BadRequest("invalid_max_tokens", "'max_tokens' must be at least 0")
		}
		v.MaxTokens = *maxTok
	}
	if minTok != nil {
		if *minTok < 0 {
			return nil, openai.BadRequest("invalid_min_tokens", "'min_tokens' must be at least 0")
		}
		v.MinTokens = *minTok
	}
	if opt.SessionField != "" {
		v.SessionKey = sessionField(body, opt.SessionField)
	}
	return v, nil
}

// EstimateTokens estimates the token count of text.
func EstimateTokens(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

func jsonError(err error) *openai.Error {
	msg := err.Error()
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		msg = fmt.Sprintf("field %q has the wrong type: got JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	return openai.BadRequest("invalid_json", "malformed request body: "+msg)
}

func sessionField(body []byte, field string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	raw, ok := m[field]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	// A number or other scalar still identifies a session.
	return string(bytes.TrimSpace(raw))
}

// Render renders chat messages (and tool definitions, as raw JSON objects)
// into the prompt text the engine sees, in the style of a chat template:
//
//	<|tools|>\n{tool json}\n...<|system|>\ntext\n<|user|>\ntext\n<|assistant|>\n
//
// Text content parts are concatenated; non-text parts (images, audio) render
// as a placeholder so that they still occupy a position in the prefix.
// The trailing "<|assistant|>\n" is the generation prompt.
func renderChat(msgs []message, tools []rawValue, bodyLen int) (prompt, firstUser string, e *openai.Error) {
	var sb strings.Builder
	// The prompt is about as long as the body its parts were decoded from
	// (every delimiter the template adds replaces longer JSON syntax), so
	// one allocation usually holds it.
	sb.Grow(bodyLen + len("<|assistant|>\n"))
	if len(tools) > 0 {
		sb.WriteString("<|tools|>\n")
		var buf bytes.Buffer
		for _, t := range tools {
			b := []byte(t)
			if !compact(t) {
				// Compacting a compact value would return it unchanged.
				buf.Reset()
				if err := json.Compact(&buf, t); err != nil {
					return "", "", openai.BadRequest("invalid_tools", "'tools' entries must be JSON objects")
				}
				b = buf.Bytes()
			}
			// Compact keeps invalid UTF-8 bytes that the engine's JSON
			// decoder turns into U+FFFD; render them as it sees them.
			if !utf8.Valid(b) {
				b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
			}
			sb.Write(b)
			sb.WriteByte('\n')
		}
	}
	seenUser := false
	for i, m := range msgs {
		if m.Role == "" {
			return "", "", openai.BadRequest("invalid_message", fmt.Sprintf("messages[%d] has no 'role'", i))
		}
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		start := sb.Len()
		if err := writeContent(&sb, m.Content); err != nil {
			return "", "", openai.BadRequest("invalid_message", fmt.Sprintf("messages[%d].content: %s", i, err.Error()))
		}
		if m.Role == "user" && !seenUser {
			seenUser = true
			firstUser = sb.String()[start:]
		}
		for _, tc := range m.ToolCalls {
			sb.WriteString("<|tool_call|>")
			sb.WriteString(tc.Function.Name)
			sb.WriteByte(' ')
			sb.WriteString(tc.Function.Arguments)
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), firstUser, nil
}

func writeContent(sb *strings.Builder, raw rawValue) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	switch raw[0] {
	case '"':
		if text, ok := plainString(raw); ok {
			sb.Write(text)
			return nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("invalid string")
		}
		sb.WriteString(s)
		return nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return fmt.Errorf("content parts must be objects with a 'type'")
		}
		for _, p := range parts {
			switch p.Type {
			case "text", "input_text":
				sb.WriteString(p.Text)
			default:
				sb.WriteString("<|")
				sb.WriteString(p.Type)
				sb.WriteString("|>")
			}
		}
		return nil
	}
	return fmt.Errorf("must be a string, an array of parts, or null")
}

// renderPrompt renders a completions prompt: a string, an array of strings
// (a batch, concatenated), an array of token ids, or an array of arrays of
// token ids. ntok is the exact token count for token-id prompts, else -1.
func renderPrompt(raw rawValue) (text string, ntok int, e *openai.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", 0, openai.BadRequest("missing_prompt", "'prompt' is required")
	}
	switch raw[0] {
	case '"':
		if text, ok := plainString(raw); ok {
			return string(text), -1, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", 0, openai.BadRequest("invalid_prompt", "'prompt' is not a valid string")
		}
		return s, -1, nil
	case '[':
		var strs []string
		if json.Unmarshal(raw, &strs) == nil {
			return strings.Join(strs, ""), -1, nil
		}
		var toks []int64
		if json.Unmarshal(raw, &toks) == nil {
			return tokensText(toks), len(toks), nil
		}
		var batches [][]int64
		if json.Unmarshal(raw, &batches) == nil {
			var sb strings.Builder
			n := 0
			for _, b := range batches {
				sb.WriteString(tokensText(b))
				n += len(b)
			}
			return sb.String(), n, nil
		}
	}
	return "", 0, openai.BadRequest("invalid_prompt", "'prompt' must be a string, an array of strings, or an array of token ids")
}

// tokensText renders token ids as text so that equal token prefixes give
// equal text prefixes.
func tokensText(toks []int64) string {
	b := make([]byte, 0, len(toks)*6)
	for _, t := range toks {
		b = strconv.AppendInt(b, t, 36)
		b = append(b, ' ')
	}
	return string(b)
}

// plainString returns the text of raw, a JSON string already validated by
// encoding/json, when decoding it would return its bytes between the quotes
// unchanged: no escape sequence and valid UTF-8 (encoding/json replaces
// invalid bytes with U+FFFD). A valid JSON string holds no unescaped quote
// or control character, so nothing else can change. Otherwise ok is false
// and the caller decodes it with encoding/json.
func plainString(raw []byte) (text []byte, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	text = raw[1 : len(raw)-1]
	if bytes.IndexByte(text, '\\') >= 0 || !utf8.Valid(text) {
		return nil, false
	}
	return text, true
}

// compact reports whether json.Compact would return v, a JSON value already
// validated by encoding/json, unchanged: no whitespace outside strings.
// Inside a string a backslash escapes the next byte, so an escaped quote
// does not end it.
func compact(v []byte) bool {
	in := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}
