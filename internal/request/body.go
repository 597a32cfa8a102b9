package request

import "strconv"

// This file walks a chat or completion body with the scanner, keeping the
// fields of the routing view and passing over (but validating) the rest.
//
// It reads the body as the engine will: as the dict that Python's
// json.loads makes of it, which vLLM's and SGLang's pydantic models are
// then validated from. So a member key names the field whose name it
// equals byte for byte once unescaped ("str\u0065am" is stream; "STREAM"
// and "ſtream" are unknown fields, passed over as the engine ignores
// them); when a key repeats in an object, its last value replaces the
// earlier ones whole, as a dict's assignment does; and null is None, the
// field unset (false, empty, no budget). A value of a type the engine's
// model would have to coerce ("true" for a bool, 1.0 for an integer) or
// refuse fails like a syntax error. Content and prompts are checked
// afterwards: their faults are the view's own errors, not invalid_json.

// decoder is the state of one Parse.
type decoder struct {
	scanner
	kind Kind
	lim  limits
	// gave is set when the arena holds text a view kept (see keep).
	gave        bool
	sessionName string

	model                         span
	cacheSalt                     span
	maxTokens, maxCompTok, minTok optInt
	ignoreEOS, stream             bool
	streamOptions, includeUsage   bool
	// The chat template's switches (vLLM's and SGLang's extensions):
	// add_generation_prompt (true unless false was sent; addGenSent when
	// true was) and continue_final_message.
	noGenPrompt, addGenSent, continueFinal bool
	session                                span
	hasSession                             bool

	// msgs are the messages decoded since "messages" was last null or
	// empty, as many as the longest array since; the last array had nmsg.
	msgs  blocks[message]
	nmsg  int
	calls blocks[toolCall]
	// ncalls counts the tool call elements read, of every array.
	ncalls int
	// segs is the decoded text of contents and of the tools, in groups:
	// a group is a run of segs; group is the first of the one being read.
	segs  blocks[span]
	group int
	tools textGroup

	prompt prompt

	// The Responses and Messages APIs' own fields (agents.go).
	agent
}

type limits struct{ messages, parts, items, calls, tools int }

// optInt is a *int field: set is false while it is nil.
type optInt struct {
	set bool
	v   int
}

// blocks is a list of n values kept in blocks of a fixed size, so that
// growing it copies nothing and allocates at most a block more than it
// holds (a slice grown by append allocates five times its final size in
// all, as it grows by a quarter at a time).
type blocks[T any] struct {
	b []*[blockLen]T
	n int
}

const blockLen = 64

func (l *blocks[T]) at(i int) *T { return &l.b[i/blockLen][i%blockLen] }

func (l *blocks[T]) push(v T) {
	if l.n == len(l.b)*blockLen {
		l.b = append(l.b, new([blockLen]T))
	}
	*l.at(l.n) = v
	l.n++
}

// reuse empties l, keeping its blocks.
func (l *blocks[T]) reuse() blocks[T] { return blocks[T]{b: l.b} }

// size is the bytes l's blocks take, at size bytes a value.
func (l *blocks[T]) size(size int) int { return len(l.b) * blockLen * size }

type message struct {
	role    span
	content content
	calls   callRange
}

// content is a message's content: segs[lo:hi], and how it is wrong.
type content struct {
	lo, hi int32
	parts  int32 // the number of parts of an array content
	fault  uint8
}

const (
	contentOK uint8 = iota
	contentType
	contentParts
)

// callRange is a message's tool calls: calls[lo:lo+n].
type callRange struct{ lo, n int32 }

type toolCall struct{ name, args span }

type textGroup struct{ lo, hi, n int32 }

// prompt is a completion's prompt.
type prompt struct {
	kind  uint8
	bad   bool
	text  span
	ntok  int // exact count for token ids, else -1
	items int // strings and token ids in the array and its arrays
}

const (
	promptNone uint8 = iota
	promptText
	promptStrings
	promptTokens
	promptBatches
)

// marks are lengths to roll the decoder back to when a decoded value is
// past a limit: it is checked, not kept.
// The last seg is kept too: emit may have extended it.
type marks struct {
	arena, segs, calls int
	last               span
}

func (d *decoder) mark() marks {
	m := marks{arena: len(d.arena), segs: d.segs.n, calls: d.calls.n}
	if m.segs > 0 {
		m.last = *d.segs.at(m.segs - 1)
	}
	return m
}

func (d *decoder) rollback(m marks) {
	d.arena, d.segs.n, d.calls.n = d.arena[:m.arena], m.segs, m.calls
	if m.segs > 0 {
		*d.segs.at(m.segs - 1) = m.last
	}
}

// Body fields, as indexes into bodyFields.
const (
	fModel = iota
	fMessages
	fTools
	fPrompt
	fMaxTokens
	fMaxCompletionTokens
	fMinTokens
	fIgnoreEOS
	fStream
	fStreamOptions
	fCacheSalt
	fInput
	fInstructions
	fPreviousResponseID
	fConversation
	fPromptCacheKey
	fStore
	fMaxOutputTokens
	fBackground
	fSystem
	fAddGenerationPrompt
	fContinueFinalMessage
)

var bodyFields = []string{"model", "messages", "tools", "prompt", "max_tokens", "max_completion_tokens", "min_tokens", "ignore_eos", "stream", "stream_options", "cache_salt",
	"input", "instructions", "previous_response_id", "conversation", "prompt_cache_key", "store", "max_output_tokens", "background", "system",
	"add_generation_prompt", "continue_final_message"}

// kindFields are the fields each kind reads; it passes over the others as
// unknown, as the engine's model for the endpoint ignores them.
var kindFields = [...]uint32{
	Chat: 1<<fModel | 1<<fMessages | 1<<fTools | 1<<fMaxTokens | 1<<fMaxCompletionTokens | 1<<fMinTokens |
		1<<fIgnoreEOS | 1<<fStream | 1<<fStreamOptions | 1<<fCacheSalt | 1<<fAddGenerationPrompt | 1<<fContinueFinalMessage,
	Completion: 1<<fModel | 1<<fPrompt | 1<<fMaxTokens | 1<<fMinTokens | 1<<fIgnoreEOS | 1<<fStream |
		1<<fStreamOptions | 1<<fCacheSalt,
	Responses: 1<<fModel | 1<<fInput | 1<<fInstructions | 1<<fTools | 1<<fPreviousResponseID | 1<<fConversation |
		1<<fPromptCacheKey | 1<<fStore | 1<<fStream | 1<<fMaxOutputTokens | 1<<fBackground | 1<<fCacheSalt,
	Messages: 1<<fModel | 1<<fSystem | 1<<fMessages | 1<<fTools | 1<<fMaxTokens | 1<<fStream,
}

var (
	messageFields  = []string{"role", "content", "name", "tool_calls"}
	partFields     = []string{"type", "text"}
	callFields     = []string{"function"}
	functionFields = []string{"name", "arguments"}
	optionFields   = []string{"include_usage"}
)

// field returns the index of the field of names that the member key,
// decoded, equals byte for byte, else -1: a Python dict's lookup, which
// neither folds case nor normalises Unicode.
func field(key []byte, names []string) int {
	for i, n := range names {
		if string(key) == n {
			return i
		}
	}
	return -1
}

// body reads the top-level object at the position.
func (d *decoder) body() bool {
	return d.members(func(key []byte) bool {
		start := d.pos
		session := d.sessionName != "" && string(key) == d.sessionName
		f := field(key, bodyFields)
		if f >= 0 && kindFields[d.kind]&(1<<f) == 0 {
			f = -1
		}
		if !d.member(f) {
			return false
		}
		if session {
			d.session, d.hasSession = span{int32(start), int32(d.pos - start)}, true
		}
		return true
	})
}

func (d *decoder) member(f int) bool {
	switch f {
	case fModel:
		return d.optStr(&d.model, "model")
	case fMessages:
		if d.kind == Messages {
			return d.anthropicMessages()
		}
		return d.messages()
	case fTools:
		return d.toolList()
	case fPrompt:
		return d.promptValue()
	case fMaxTokens:
		return d.optInt(&d.maxTokens, "max_tokens")
	case fMaxCompletionTokens:
		return d.optInt(&d.maxCompTok, "max_completion_tokens")
	case fMinTokens:
		return d.optInt(&d.minTok, "min_tokens")
	case fIgnoreEOS:
		return d.optBool(&d.ignoreEOS, "ignore_eos")
	case fStream:
		return d.optBool(&d.stream, "stream")
	case fStreamOptions:
		return d.streamOpts()
	case fCacheSalt:
		return d.optStr(&d.cacheSalt, "cache_salt")
	case fInput:
		return d.inputValue()
	case fInstructions:
		return d.instructions()
	case fPreviousResponseID:
		return d.optStr(&d.prevID, "previous_response_id")
	case fConversation:
		return d.conversationValue()
	case fPromptCacheKey:
		return d.optStr(&d.cacheKey, "prompt_cache_key")
	case fStore:
		d.storeSet = d.peek() != 'n'
		return d.optBool(&d.store, "store")
	case fMaxOutputTokens:
		return d.optInt(&d.maxTokens, "max_output_tokens")
	case fBackground:
		return d.optBool(&d.background, "background")
	case fSystem:
		return d.systemValue()
	case fAddGenerationPrompt:
		// null reads as unset, the default (true): only false turns
		// the generation prompt off.
		isNull := d.peek() == 'n'
		var on bool
		ok := d.optBool(&on, "add_generation_prompt")
		d.noGenPrompt, d.addGenSent = !on && !isNull, on
		return ok
	case fContinueFinalMessage:
		return d.optBool(&d.continueFinal, "continue_final_message")
	}
	return d.skip()
}

// optStr reads a string field; null empties it.
func (d *decoder) optStr(dst *span, name string) bool {
	switch d.peek() {
	case '"':
		s, ok := d.str()
		*dst = s
		return ok
	case 'n':
		*dst = span{}
		return d.literal()
	}
	return d.wrongType(name, "string")
}

// optBool reads a bool field; null is false.
func (d *decoder) optBool(dst *bool, name string) bool {
	switch d.peek() {
	case 't', 'f', 'n':
		*dst = d.peek() == 't'
		return d.literal()
	}
	return d.wrongType(name, "bool")
}

// optInt reads a *int field: null clears it; a number must be an integer
// that fits an int.
func (d *decoder) optInt(dst *optInt, name string) bool {
	switch c := d.peek(); {
	case c == 'n':
		dst.set = false
		return d.literal()
	case c == '-' || '0' <= c && c <= '9':
		start := d.pos
		n, fits, ok := d.int()
		if ok && (!fits || int64(int(n)) != n) {
			num := string(d.buf[start:d.pos])
			d.pos = start
			return d.fail("field " + strconv.Quote(name) + " has the wrong type: " + num + " is not an integer")
		}
		*dst = optInt{true, int(n)}
		return ok
	}
	return d.wrongType(name, "integer")
}

// open checks that the value at the position opens with c (an array or
// an object) or is null, which it reads; any other value is of the wrong
// type for field. The caller reads the value unless null or !ok.
func (d *decoder) open(c byte, field string) (null, ok bool) {
	switch d.peek() {
	case c:
		return false, true
	case 'n':
		return true, d.literal()
	}
	if c == '[' {
		return false, d.wrongType(field, "array")
	}
	return false, d.wrongType(field, "object")
}

func (d *decoder) streamOpts() bool {
	d.streamOptions, d.includeUsage = false, false
	if null, ok := d.open('{', "stream_options"); null || !ok {
		return ok
	}
	d.streamOptions = true
	return d.members(func(key []byte) bool {
		if field(key, optionFields) == 0 {
			return d.optBool(&d.includeUsage, "stream_options.include_usage")
		}
		return d.skip()
	})
}

// messages reads the messages array, which replaces any read before.
// Elements past the limit are checked and dropped; the view is an error
// then anyway.
func (d *decoder) messages() bool {
	d.msgs.n, d.nmsg = 0, 0
	if null, ok := d.open('[', "messages"); null || !ok {
		return ok
	}
	n, ok := d.elements(func(i int) bool {
		if i >= d.lim.messages {
			var m message
			k := d.mark()
			ok := d.message(&m)
			d.rollback(k)
			return ok
		}
		d.msgs.push(message{})
		return d.message(d.msgs.at(i))
	})
	d.nmsg = n
	return ok
}

// object reads an object field (null is an empty one), calling member
// with the index in names of each member's field, -1 if none.
func (d *decoder) object(name string, names []string, member func(f int) bool) bool {
	if null, ok := d.open('{', name); null || !ok {
		return ok
	}
	return d.members(func(key []byte) bool { return member(field(key, names)) })
}

func (d *decoder) message(m *message) bool {
	return d.object("messages", messageFields, func(f int) bool {
		switch f {
		case 0:
			return d.optStr(&m.role, "messages.role")
		case 1:
			return d.content(&m.content)
		case 2:
			if d.peek() == '"' {
				return d.skipStr()
			}
			var s span
			return d.optStr(&s, "messages.name")
		case 3:
			return d.toolCalls(&m.calls)
		}
		return d.skip()
	})
}

// content reads a message's content: a string, an array of parts or null.
// Any other value, or a part of the wrong type, is the message's fault.
func (d *decoder) content(c *content) bool {
	lo := int32(d.segs.n)
	*c = content{lo: lo, hi: lo}
	d.group = d.segs.n
	switch d.peek() {
	case 'n':
		return d.literal()
	case '"':
		s, ok := d.str()
		d.emit(s)
		c.hi = int32(d.segs.n)
		return ok
	case '[':
	default:
		c.fault = contentType
		return d.skip()
	}
	n, ok := d.elements(func(i int) bool {
		if c.fault != contentOK {
			return d.skip()
		}
		if i >= d.lim.parts {
			k := d.mark()
			ok := d.part(c)
			d.rollback(k)
			return ok
		}
		return d.part(c)
	})
	c.hi, c.parts = int32(d.segs.n), int32(n)
	return ok
}

// part reads one content part: text and input_text parts give their text,
// any other the placeholder <|type|>.
func (d *decoder) part(c *content) bool {
	if d.peek() != '{' {
		c.fault = contentParts
		return d.skip()
	}
	var typ, text span
	ok := d.members(func(key []byte) bool {
		var dst *span
		switch field(key, partFields) {
		case 0:
			dst = &typ
		case 1:
			dst = &text
		default:
			return d.skip()
		}
		if b := d.peek(); b == '"' || b == 'n' {
			return d.optStr(dst, "type")
		}
		c.fault = contentParts
		return d.skip()
	})
	if !ok || c.fault != contentOK {
		return ok
	}
	if t := d.bytes(typ); string(t) == "text" || string(t) == "input_text" || d.kind == Responses && string(t) == "output_text" {
		d.emit(text)
	} else {
		d.emitPlaceholder(t)
	}
	return true
}

// toolCalls reads a message's tool_calls, which replace any it had. The
// limit counts every call read, replaced or not.
func (d *decoder) toolCalls(r *callRange) bool {
	*r = callRange{lo: int32(d.calls.n)}
	if null, ok := d.open('[', "messages.tool_calls"); null || !ok {
		return ok
	}
	_, ok := d.elements(func(i int) bool {
		if d.ncalls++; d.ncalls > d.lim.calls {
			// Past the limit: checked, not kept (the view is an error).
			var tc toolCall
			k := d.mark()
			ok := d.toolCall(&tc)
			d.rollback(k)
			return ok
		}
		d.calls.push(toolCall{})
		r.n++
		return d.toolCall(d.calls.at(d.calls.n - 1))
	})
	return ok
}

func (d *decoder) toolCall(tc *toolCall) bool {
	return d.object("messages.tool_calls", callFields, func(f int) bool {
		if f != 0 {
			return d.skip()
		}
		return d.object("messages.tool_calls.function", functionFields, func(f int) bool {
			switch f {
			case 0:
				return d.optStr(&tc.name, "messages.tool_calls.function.name")
			case 1:
				return d.optStr(&tc.args, "messages.tool_calls.function.arguments")
			}
			return d.skip()
		})
	})
}

// toolList reads the tools: any JSON values, each rendered compact (as
// json.Compact gives it), one a line.
func (d *decoder) toolList() bool {
	if null, ok := d.open('[', "tools"); null || !ok {
		if null {
			d.tools = textGroup{}
		}
		return ok
	}
	d.group = d.segs.n
	lo := int32(d.segs.n)
	n, ok := d.elements(func(i int) bool {
		if i >= d.lim.tools {
			return d.skip() // checked, not kept (the view is an error)
		}
		v, ok := d.compactValue()
		if ok {
			d.emit(v)
			d.emitText("\n")
		}
		return ok
	})
	d.tools = textGroup{lo, int32(d.segs.n), int32(n)}
	return ok
}

// appendCompact appends v, a valid JSON value, without the whitespace
// between its tokens.
func appendCompact(dst, v []byte) []byte {
	in := false
	start := 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			dst = append(dst, v[start:i]...)
			start = i + 1
		}
	}
	return append(dst, v[start:]...)
}

// promptValue reads a completion's prompt: a string, or an array of
// strings (a batch, concatenated), of token ids, or of arrays of token
// ids, which its first element decides; the engine's model refuses any
// other element (null among them). Items past the limit are counted and
// checked, not rendered.
func (d *decoder) promptValue() bool {
	d.prompt = prompt{}
	p := &d.prompt
	switch d.peek() {
	case 'n':
		return d.literal()
	case '"':
		s, ok := d.str()
		p.kind, p.text = promptText, s
		return ok
	case '[':
	default:
		p.kind, p.bad = promptText, true
		return d.skip()
	}
	d.room()
	a := len(d.arena)
	kind := promptNone
	_, ok := d.elements(func(int) bool {
		if p.bad {
			return d.skip()
		}
		var k uint8
		switch c := d.peek(); {
		case c == '"':
			k = promptStrings
		case c == '-' || '0' <= c && c <= '9':
			k = promptTokens
		case c == '[':
			k = promptBatches
		}
		if kind == promptNone {
			kind = k
		}
		if k == promptNone || k != kind {
			p.bad = true
			return d.skip()
		}
		switch k {
		case promptStrings:
			p.items++
			m := len(d.arena)
			s, ok := d.str()
			switch {
			case p.items > d.lim.items:
				d.arena = d.arena[:m]
			case s.off >= 0:
				d.arena = append(d.arena, d.bytes(s)...)
			}
			return ok
		case promptTokens:
			return d.token()
		}
		_, ok := d.elements(func(int) bool {
			switch c := d.peek(); {
			case p.bad:
				return d.skip()
			case c == '-' || '0' <= c && c <= '9':
				return d.token()
			}
			p.bad = true
			return d.skip()
		})
		return ok
	})
	if kind == promptNone {
		kind = promptStrings
	}
	p.kind, p.text = kind, span{^int32(a), int32(len(d.arena) - a)}
	if kind == promptStrings {
		p.ntok = -1
	}
	return ok
}

// token reads one token id of a prompt, rendering it in base 36 (see
// tokensText).
func (d *decoder) token() bool {
	p := &d.prompt
	p.items++
	p.ntok++
	t, fits, ok := d.int()
	if !fits {
		p.bad = true
	} else if p.items <= d.lim.items {
		d.arena = appendToken(d.arena, t)
	}
	return ok
}

// appendToken appends t in base 36 and a space, as strconv.AppendInt(dst,
// t, 36) and ' ' would, several times faster: dividing by the constant 36
// compiles to a multiplication.
func appendToken(dst []byte, t int64) []byte {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var buf [15]byte // a sign, 13 digits of -2^63 and the space
	i := len(buf) - 1
	buf[i] = ' '
	u := uint64(t)
	if t < 0 {
		u = -u
	}
	for u >= 36 {
		i--
		buf[i] = digits[u%36]
		u /= 36
	}
	i--
	buf[i] = digits[u]
	if t < 0 {
		i--
		buf[i] = '-'
	}
	return append(dst, buf[i:]...)
}

// emit appends s to the current group of segs. Short text from the body
// is copied into the arena, so that runs of small parts merge into one
// seg and segs stay few against the body's size.
func (d *decoder) emit(s span) {
	if s.n == 0 {
		return
	}
	if s.off >= 0 && s.n < 64 && d.segs.n > d.group {
		d.room()
		a := len(d.arena)
		d.arena = append(d.arena, d.bytes(s)...)
		s = span{^int32(a), s.n}
	}
	if k := d.segs.n - 1; k >= d.group && s.off < 0 {
		if last := d.segs.at(k); last.off < 0 && ^last.off+last.n == ^s.off {
			last.n += s.n
			return
		}
	}
	d.segs.push(s)
}

func (d *decoder) emitText(t string) {
	d.room()
	a := len(d.arena)
	d.arena = append(d.arena, t...)
	d.emit(span{^int32(a), int32(len(t))})
}

// emitPlaceholder emits <|typ|>, the text of a non-text part.
func (d *decoder) emitPlaceholder(typ []byte) {
	d.room()
	a := len(d.arena)
	d.arena = append(d.arena, "<|"...)
	d.arena = append(d.arena, typ...)
	d.arena = append(d.arena, "|>"...)
	d.emit(span{^int32(a), int32(len(d.arena) - a)})
}
