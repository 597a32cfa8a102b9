// Package request turns the body of an OpenAI-compatible request into the
// routing view: the model, the prompt text as the engine will see it, the
// session key, the token estimate and the output budget. The body is parsed
// once, here, in a single pass that validates all of it and decodes only
// what the view needs (scan.go, body.go); the original bytes are forwarded
// untouched by the proxy. It reads the body as the engine will, as the
// dict Python's json.loads makes of it: keys matched byte for byte, the
// last of a repeated key winning, null an unset field; a body that
// json.loads would refuse or read otherwise is refused. Every other
// reading of a client's body in kvroute (tokenize.RequestOf, the emulated
// engine) keeps to the same rules.
//
// The rendering of chat messages into prompt text is the single definition
// of "what the engine sees" in kvroute: the router's prefix index and the
// emulated engine both take the prompt from Parse, so that the router's
// picture of a backend's cache and the engine's cache agree.
//
// This package does no I/O and knows nothing of backends or policies.
package request

import (
	"fmt"
	"github.com/kvroute/kvroute/internal/slo"
	"math"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvroute/kvroute/internal/openai"
)

// Kind is the endpoint a request was sent to.
type Kind uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat Kind = iota
	// Completion is POST /v1/completions.
	Completion
	// Responses is POST /v1/responses, OpenAI's Responses API.
	Responses
	// Messages is POST /v1/messages, Anthropic's Messages API.
	Messages
)

func (k Kind) String() string {
	switch k {
	case Chat:
		return "chat"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	}
	return "completion"
}

// Path is the URL path of the endpoint of kind k.
func (k Kind) Path() string {
	switch k {
	case Chat:
		return "/v1/chat/completions"
	case Responses:
		return "/v1/responses"
	case Messages:
		return "/v1/messages"
	}
	return "/v1/completions"
}

// BytesPerToken is the router's estimate of prompt bytes per token, about
// right for English text with BPE tokenizers, and exact for the emulated
// engine's tokenizer.
const BytesPerToken = 4

// DefaultOutputBudget is the output length, in tokens, assumed of a
// request that set no max_tokens: about one chat answer. The router uses
// it only to weigh decode load (the scheduler's accounting, the kvroute
// policy's slot wait); it never limits the response.
const DefaultOutputBudget = 256

// MaxBytesPerToken bounds the UTF-8 bytes of text one token of a real
// vocabulary stands for, so that len(text)/MaxBytesPerToken is a lower
// bound of the token count whatever the tokenizer (see MinPromptTokens).
// Averages are far below it (about 4 for English, 1.5 to 3 for CJK text,
// about 1 for random bytes, which fall back to byte tokens); what bounds
// it is the longest token: SentencePiece caps a piece at 16 characters
// (64 bytes) by default, and the longest tokens of byte-level BPE
// vocabularies are runs of spaces, dashes or '=' well within 128 bytes.
const MaxBytesPerToken = 128

// AddTokens adds two token counts, saturating at math.MaxInt rather than
// wrapping: counts from clients (max_tokens near 2^63) are added only
// through it. Negative counts are taken as 0.
func AddTokens(a, b int) int {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// View is the routing view of one request. It is immutable once parsed,
// except SessionKey, which the HTTP layer may set from a header before routing.
type View struct {
	Kind Kind
	// Role is the part of a split request the view routes ("prefill",
	// "decode"), "" for a whole request (package disagg).
	Role  string
	Model string
	// Prompt is the rendered prompt text (see chatView and
	// completionView for the template).
	Prompt string
	// FirstUser is the text of the first user message (chat only); KubeAI's
	// prefix hash keys on it.
	FirstUser string
	// SessionKey identifies a conversation; empty when the client sent none.
	SessionKey string
	// PromptTokens estimates the prompt length in tokens.
	PromptTokens int
	// PromptExact is set when PromptTokens is exact: a completion prompt
	// of token ids.
	PromptExact bool
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
	// PrefixSalt salts the prompt's prefix chain (prefix.HashSalted,
	// prefix.HashTokens): prompts under different salts never share a
	// block, as in vLLM, which mixes a request's cache_salt into its first
	// block's hash so that tenants cannot probe each other's cache. Parse
	// sets it to the body's cache_salt; the router may add the API key's
	// id to it (auth.isolate_prefix). "" for none.
	PrefixSalt string

	// The Responses API's state (Kind Responses): the stored response the
	// request continues ("" for none), the conversation it belongs to,
	// whether its answer is to be stored (the API's default: true) and
	// run in the background.
	PreviousResponseID string
	Conversation       string
	Store, Background  bool
	// HistoryAt is where, in Prompt, the engine puts the conversation
	// of the previous response (a Responses request): after the tool
	// definitions and the instructions, before the input. MessagesAt is
	// where the messages start, after the tool definitions: what the
	// engine stores of the request (its messages, the instructions'
	// among them) is Prompt[MessagesAt:].
	HistoryAt, MessagesAt int
	// Continues is the length of the text at the end of Prompt that
	// is a final assistant message the engine continues (a chat with
	// continue_final_message): the answer so far, which the engine's
	// output extends. 0 for none.
	Continues int

	// Objective is the request's latency objectives and criticality, set
	// by the front from its headers and the configured defaults (package
	// slo), or by the simulator from the workload; the zero value for
	// none. Parse leaves it zero.
	Objective slo.Objective
}

// Options configure Parse.
type Options struct {
	// SessionField names a top-level body field (e.g. "user") whose string
	// value is the session key when no header gave one; a number or other
	// value gives its JSON text. Empty disables it.
	SessionField string
	// MaxMessages bounds the number of chat messages; 0 means
	// MaxMessages, the package default.
	MaxMessages int
	// MaxContentParts bounds the parts of one message's content array; 0
	// means MaxContentParts.
	MaxContentParts int
	// MaxPromptItems bounds a completion prompt array: its strings, token
	// ids and nulls, those of nested token arrays included; 0 means
	// MaxPromptItems.
	MaxPromptItems int
	// MaxToolCalls bounds the tool calls of all messages together; 0
	// means MaxToolCalls.
	MaxToolCalls int
	// MaxTools bounds the tool definitions; 0 means MaxTools.
	MaxTools int
	// CountOnly reads a Messages body sent to count its tokens
	// (/v1/messages/count_tokens), which needs no max_tokens.
	CountOnly bool
}

// Limits that keep a hostile body from costing more than its size. Parse's
// memory is a small multiple of the body whatever its shape (see
// TestParseMemory); these bound the counts of things a real client sends.
const (
	MaxMessages = 100000
	// MaxContentParts is far above what an API accepts in one message
	// (OpenAI's limit is 500 images a request), so only a body that is
	// not a real conversation meets it.
	MaxContentParts = 10000
	// MaxPromptItems is a million tokens: the longest context windows of
	// current models.
	MaxPromptItems = 1000000
	// MaxToolCalls is one a message at the limit of messages: each costs
	// 16 bytes of state and renders to about 14, so that many calls of a
	// few bytes ({}) would cost ten times their body without it.
	MaxToolCalls = MaxMessages
	// MaxTools is far above what an API accepts (OpenAI's limit is 128).
	MaxTools = 10000
)

func (o Options) limits() limits {
	l := limits{MaxMessages, MaxContentParts, MaxPromptItems, MaxToolCalls, MaxTools}
	if o.MaxMessages > 0 {
		l.messages = o.MaxMessages
	}
	if o.MaxContentParts > 0 {
		l.parts = o.MaxContentParts
	}
	if o.MaxPromptItems > 0 {
		l.items = o.MaxPromptItems
	}
	if o.MaxToolCalls > 0 {
		l.calls = o.MaxToolCalls
	}
	if o.MaxTools > 0 {
		l.tools = o.MaxTools
	}
	return l
}

// decoders keeps decoders between requests, so that a Parse allocates
// little more than the view and its prompt.
var decoders = sync.Pool{New: func() any { return new(decoder) }}

// maxPooled bounds the scratch memory a pooled decoder keeps.
const maxPooled = 1 << 20

// Parse parses body, sent to the endpoint of kind k, into a View. Errors are
// client errors (400) in the OpenAI shape.
func Parse(k Kind, body []byte, opt Options) (*View, *openai.Error) {
	body = trimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, openai.BadRequest("invalid_json", "request body must be a JSON object")
	}
	if k > Messages {
		return nil, openai.BadRequest("invalid_endpoint", "unknown endpoint")
	}
	if len(body) > maxBody {
		return nil, openai.BadRequest("invalid_json", fmt.Sprintf("request body is larger than %d bytes", maxBody))
	}
	d := decoders.Get().(*decoder)
	defer d.release()
	d.reset(k, body, opt)
	ok := d.body()
	if ok {
		if d.space(); d.pos < len(body) {
			ok = d.unexpected("the end of the body after the object")
		}
	}
	if !ok {
		return nil, openai.BadRequest("invalid_json", "malformed request body: "+d.err.Error())
	}
	v := &View{Kind: k, IgnoreEOS: d.ignoreEOS, Stream: d.stream, IncludeUsage: d.streamOptions && d.includeUsage}
	v.Model = string(d.bytes(d.model))
	if d.cacheSalt != (span{}) { // a string was sent
		// vLLM refuses an empty cache_salt (and null is none).
		if d.cacheSalt.n == 0 {
			return nil, openai.BadRequest("invalid_cache_salt", "'cache_salt' must be a non-empty string if provided")
		}
		v.PrefixSalt = string(d.bytes(d.cacheSalt))
	}
	var e *openai.Error
	switch k {
	case Chat:
		if d.continueFinal && d.addGenSent {
			// vLLM's validator, in its words.
			return nil, openai.BadRequest("invalid_generation_prompt", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		e = d.chatView(v)
	case Completion:
		e = d.completionView(v)
	default:
		e = d.agentView(v)
	}
	if e != nil {
		return nil, e
	}
	maxTok := d.maxTokens
	if d.maxCompTok.set {
		maxTok = d.maxCompTok
	}
	if maxTok.set {
		if maxTok.v < 0 {
			return nil, errMaxTokens()
		}
		v.MaxTokens = maxTok.v
	}
	if d.minTok.set {
		if d.minTok.v < 0 {
			return nil, errMinTokens()
		}
		v.MinTokens = d.minTok.v
	}
	if d.hasSession {
		v.SessionKey = d.sessionKey()
	}
	return v, nil
}

func (d *decoder) reset(k Kind, body []byte, opt Options) {
	*d = decoder{
		scanner:     scanner{buf: body, arena: d.arena[:0]},
		kind:        k,
		lim:         opt.limits(),
		sessionName: opt.SessionField,
		agent:       agent{countOnly: opt.CountOnly},
		msgs:        d.msgs.reuse(),
		calls:       d.calls.reuse(),
		segs:        d.segs.reuse(),
	}

}

// keep returns the text of s as a string that outlives the decoder. Text
// in an arena too large to pool (a long prompt of token ids) is not
// copied: the string is the arena's bytes, which release then lets go of
// rather than reuse, and which nothing writes to again (the arena only
// grows past the text it holds). Anything else is copied.
func (d *decoder) keep(s span) string {
	if s.off >= 0 || cap(d.arena) <= maxPooled || s.n == 0 {
		return string(d.bytes(s))
	}
	d.gave = true
	b := d.bytes(s)
	return unsafe.String(&b[0], len(b))
}

func (d *decoder) release() {
	d.buf = nil
	if d.gave {
		d.arena, d.gave = nil, false
	}
	if cap(d.arena)+d.segs.size(8)+d.msgs.size(32)+d.calls.size(16) <= maxPooled {
		decoders.Put(d)
	}
}

// trimSpace trims JSON's whitespace (space, tab, newline, carriage return)
// from both ends of body: no other, as json.loads refuses a body with any
// other around its value (bytes.TrimSpace would trim Unicode spaces too).
func trimSpace(body []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(body) > 0 && isSpace(body[0]) {
		body = body[1:]
	}
	for len(body) > 0 && isSpace(body[len(body)-1]) {
		body = body[:len(body)-1]
	}
	return body
}

// sessionKey is the session field's string, or the JSON text of another
// value (null gives "").
func (d *decoder) sessionKey() string {
	raw := d.bytes(d.session)
	switch raw[0] {
	case '"':
		d.pos = int(d.session.off)
		s, _ := d.str()
		return string(d.bytes(s))
	case 'n':
		return ""
	}
	return string(raw)
}

// MinPromptTokens is a lower bound of the prompt's tokens under any
// tokenizer whose tokens are at most maxBytesPerToken bytes of text (0
// means MaxBytesPerToken): the exact count for token ids, else the
// rendered prompt's bytes over that bound. The rendered template's
// markup (a few bytes a message) stands in for the engine's own, which
// is at least a token a message, so it never raises the bound above the
// truth. A router may refuse a request on this bound, never on the
// estimate.
func (v *View) MinPromptTokens(maxBytesPerToken int) int {
	if v.PromptExact {
		return v.PromptTokens
	}
	if maxBytesPerToken <= 0 {
		maxBytesPerToken = MaxBytesPerToken
	}
	return (len(v.Prompt) + maxBytesPerToken - 1) / maxBytesPerToken
}

// EstimateTokens estimates the token count of text.
func EstimateTokens(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

// The view's errors beyond malformed JSON, one function each so that every
// path that finds one words it the same.

func errMissingMessages() *openai.Error {
	return openai.BadRequest("missing_messages", "'messages' must be a non-empty array")
}

func errTooManyMessages(n, limit int) *openai.Error {
	return openai.BadRequest("too_many_messages", fmt.Sprintf("'messages' has %d entries, more than the limit of %d", n, limit))
}

func errNoRole(i int) *openai.Error {
	return openai.BadRequest("invalid_message", fmt.Sprintf("messages[%d] has no 'role'", i))
}

func errContent(i int, fault uint8) *openai.Error {
	msg := "must be a string, an array of parts, or null"
	if fault == contentParts {
		msg = "content parts must be objects with a 'type'"
	}
	return openai.BadRequest("invalid_message", fmt.Sprintf("messages[%d].content: %s", i, msg))
}

func errTooManyParts(i, n, limit int) *openai.Error {
	return openai.BadRequest("too_many_content_parts", fmt.Sprintf("messages[%d].content has %d parts, more than the limit of %d", i, n, limit))
}

func errTooManyToolCalls(n, limit int) *openai.Error {
	return openai.BadRequest("too_many_tool_calls", fmt.Sprintf("the messages have %d tool calls, more than the limit of %d", n, limit))
}

func errTooManyTools(n, limit int) *openai.Error {
	return openai.BadRequest("too_many_tools", fmt.Sprintf("'tools' has %d entries, more than the limit of %d", n, limit))
}

func errMissingPrompt() *openai.Error {
	return openai.BadRequest("missing_prompt", "'prompt' is required")
}

func errInvalidPrompt() *openai.Error {
	return openai.BadRequest("invalid_prompt", "'prompt' must be a string, an array of strings, or an array of token ids")
}

func errTooManyItems(n, limit int) *openai.Error {
	return openai.BadRequest("too_many_prompt_items", fmt.Sprintf("'prompt' has %d items, more than the limit of %d", n, limit))
}

func errMaxTokens() *openai.Error {
	return openai.BadRequest("invalid_max_tokens", "'max_tokens' must be at least 0")
}

func errMinTokens() *openai.Error {
	return openai.BadRequest("invalid_min_tokens", "'min_tokens' must be at least 0")
}

// Template text of Render (see chatView).
const (
	toolsHeader     = "<|tools|>\n"
	toolCallTag     = "<|tool_call|>"
	generationStart = "<|assistant|>\n"
)

// chatView renders the messages (and tool definitions, as compact JSON)
// into the prompt text the engine sees, in the style of a chat template:
//
//	<|tools|>\n{tool json}\n...<|system|>\ntext\n<|user|>\ntext\n<|assistant|>\n
//
// Text content parts are concatenated; non-text parts (images, audio) render
// as a placeholder so that they still occupy a position in the prefix.
// A tool call renders as <|tool_call|>name arguments after the content.
// The trailing "<|assistant|>\n" is the generation prompt, left out with
// add_generation_prompt false; with continue_final_message a final
// assistant message is left open (no "\n" after its text) and no
// generation prompt follows, so that the prompt of a request continuing
// an answer is the original prompt followed by the answer's text.
func (d *decoder) chatView(v *View) *openai.Error {
	if d.nmsg == 0 {
		return errMissingMessages()
	}
	return d.renderChat(v)
}

// renderChat renders the messages read (none is allowed: a Responses
// request's empty input) as chatView documents.
func (d *decoder) renderChat(v *View) *openai.Error {
	if d.nmsg > d.lim.messages {
		return errTooManyMessages(d.nmsg, d.lim.messages)
	}
	if d.ncalls > d.lim.calls {
		return errTooManyToolCalls(d.ncalls, d.lim.calls)
	}
	if int(d.tools.n) > d.lim.tools {
		return errTooManyTools(int(d.tools.n), d.lim.tools)
	}
	size := len(generationStart)
	if d.tools.n > 0 {
		size += len(toolsHeader) + d.segsLen(d.tools.lo, d.tools.hi)
	}
	if d.lead.set {
		size += len("<|system|>\n\n") + d.segsLen(d.lead.lo, d.lead.hi)
	}
	for i := range d.nmsg {
		m := d.msgs.at(i)
		switch c := &m.content; {
		case m.role.n == 0:
			return errNoRole(i)
		case c.fault != contentOK:
			return errContent(i, c.fault)
		case int(c.parts) > d.lim.parts:
			return errTooManyParts(i, int(c.parts), d.lim.parts)
		}
		size += len("<||>\n\n") + int(m.role.n) + d.segsLen(m.content.lo, m.content.hi)
		for j := m.calls.lo; j < m.calls.lo+m.calls.n; j++ {
			tc := d.calls.at(int(j))
			size += len(toolCallTag) + int(tc.name.n) + 1 + int(tc.args.n)
		}
	}
	var sb strings.Builder
	sb.Grow(size)
	if d.tools.n > 0 {
		sb.WriteString(toolsHeader)
		d.writeSegs(&sb, d.tools.lo, d.tools.hi)
	}
	if d.kind == Responses {
		v.MessagesAt = sb.Len()
	}
	if d.lead.set {
		// The instructions (Responses) or the system prompt (Messages),
		// which the engine makes the first message.
		sb.WriteString("<|system|>\n")
		d.writeSegs(&sb, d.lead.lo, d.lead.hi)
		sb.WriteByte('\n')
	}
	if d.kind == Responses {
		v.HistoryAt = sb.Len()
	}
	firstUser := -1
	continues := false
	for i := range d.nmsg {
		m := d.msgs.at(i)
		role := d.bytes(m.role)
		sb.WriteString("<|")
		sb.Write(role)
		sb.WriteString("|>\n")
		start := sb.Len()
		d.writeSegs(&sb, m.content.lo, m.content.hi)
		if i == d.nmsg-1 && d.continueFinal && string(role) == "assistant" && m.calls.n == 0 {
			// continue_final_message: the final assistant message is
			// left open, its text the start of the answer, and no
			// generation prompt follows (vLLM's template call; SGLang
			// appends the message's text to the rendered prompt).
			v.Continues = sb.Len() - start
			continues = true
			break
		}
		if firstUser < 0 && string(role) == "user" {
			firstUser = i
			v.FirstUser = sb.String()[start:]
		}
		for j := m.calls.lo; j < m.calls.lo+m.calls.n; j++ {
			tc := d.calls.at(int(j))
			sb.WriteString(toolCallTag)
			sb.Write(d.bytes(tc.name))
			sb.WriteByte(' ')
			sb.Write(d.bytes(tc.args))
		}
		sb.WriteByte('\n')
	}
	if !continues && !d.noGenPrompt {
		sb.WriteString(generationStart)
	}
	v.Prompt = sb.String()
	v.PromptTokens = EstimateTokens(v.Prompt)
	return nil
}

func (d *decoder) segsLen(lo, hi int32) int {
	n := 0
	for i := lo; i < hi; i++ {
		n += int(d.segs.at(int(i)).n)
	}
	return n
}

func (d *decoder) writeSegs(sb *strings.Builder, lo, hi int32) {
	for i := lo; i < hi; i++ {
		sb.Write(d.bytes(*d.segs.at(int(i))))
	}
}

// completionView renders a completions prompt: a string, an array of
// strings (a batch, concatenated), an array of token ids, or an array of
// arrays of token ids. Token ids render in base 36, each followed by a
// space, so that equal token prefixes give equal text prefixes, and count
// exactly; text is estimated.
func (d *decoder) completionView(v *View) *openai.Error {
	p := &d.prompt
	switch {
	case p.kind == promptNone:
		return errMissingPrompt()
	case p.bad:
		return errInvalidPrompt()
	case p.items > d.lim.items:
		return errTooManyItems(p.items, d.lim.items)
	}
	v.Prompt = d.keep(p.text)
	v.PromptTokens, v.PromptExact = p.ntok, true
	if p.kind == promptText || p.kind == promptStrings {
		v.PromptTokens, v.PromptExact = EstimateTokens(v.Prompt), false
	}
	return nil
}
