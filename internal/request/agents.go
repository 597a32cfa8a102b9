package request

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/openai"
)

// This file reads the agents' APIs into the same view as a chat request:
// the engine turns both into chat messages and renders them with the chat
// template, so the prompt is chatView's rendering of the messages the
// engine makes of the body.
//
// Responses (POST /v1/responses, as vLLM's serving_responses reads it):
// the instructions become a system message, first; a string input one user
// message; input items become messages in order: a message item its role
// and content (input_text, output_text and text parts give their text,
// others a placeholder), a function_call item an assistant message with
// that one tool call, a function_call_output item a tool message with the
// output; reasoning items render nothing (the chat template drops
// reasoning). With previous_response_id the engine puts the stored
// conversation (its input and output) after the instructions: the router
// cannot see it, and View.HistoryAt says where it goes.
//
// Messages (POST /v1/messages, as vLLM's Anthropic serving converts it):
// the system prompt (a string, or text blocks concatenated) becomes a
// system message, first; each message's text blocks its content, image
// blocks a placeholder (<|image_url|>), tool_use blocks its tool calls
// (name and the input as compact JSON); a user message's tool_result
// blocks become tool messages before it, an assistant's a text part
// "Tool result: ...". Empty text blocks are dropped, as vLLM drops them.

// agent is the decoder's state for the Responses and Messages fields.
type agent struct {
	// lead is the system message made of the instructions or the system
	// prompt: segs[lo:hi].
	lead struct {
		lo, hi int32
		set    bool
	}
	inputSet         bool
	prevID, cacheKey span
	conv             span
	store, storeSet  bool
	background       bool
	badItem          int // 1 + the index of an input item of an unknown type
	badItemType      string
	badMessage       string
	blocks           []ablock
	// countOnly is Options.CountOnly.
	countOnly bool
}

// ablock is one content block of a Messages message, read before the
// message's role is known.
type ablock struct {
	typ        uint8
	text, name span
	args       span
	res        content
}

const (
	blockSkip uint8 = iota
	blockText
	blockImage
	blockToolUse
	blockToolResult
)

// stringContent reads the string at the position as a content of its
// own.
func (d *decoder) stringContent() (content, bool) {
	d.group = d.segs.n
	c := content{lo: int32(d.segs.n)}
	s, ok := d.str()
	d.emit(s)
	c.hi = int32(d.segs.n)
	return c, ok
}

// lit returns a span of the arena holding t.
func (d *decoder) lit(t string) span {
	d.room()
	a := len(d.arena)
	d.arena = append(d.arena, t...)
	return span{^int32(a), int32(len(t))}
}

// instructions reads the Responses instructions: a string or null.
func (d *decoder) instructions() bool {
	var s span
	null := d.peek() == 'n'
	if !d.optStr(&s, "instructions") {
		return false
	}
	d.lead.set = !null && s.n > 0 // vLLM skips empty instructions
	d.group = d.segs.n
	d.lead.lo = int32(d.segs.n)
	d.emit(s)
	d.lead.hi = int32(d.segs.n)
	return true
}

// systemValue reads the Messages system prompt: a string, an array of
// text blocks (their texts concatenated), or null.
func (d *decoder) systemValue() bool {
	d.lead.set = false
	switch d.peek() {
	case 'n':
		return d.literal()
	case '"':
		c, ok := d.stringContent()
		d.lead.lo, d.lead.hi, d.lead.set = c.lo, c.hi, c.hi > c.lo
		return ok
	case '[':
	default:
		return d.wrongType("system", "string or array")
	}
	d.group = d.segs.n
	lo := int32(d.segs.n)
	ok := d.textBlocks("system")
	d.lead.lo, d.lead.hi = lo, int32(d.segs.n)
	d.lead.set = d.lead.hi > lo
	return ok
}

// conversationValue reads the Responses conversation: its id, as a string
// or an object {"id": ...}.
func (d *decoder) conversationValue() bool {
	d.conv = span{}
	switch d.peek() {
	case '"', 'n':
		return d.optStr(&d.conv, "conversation")
	}
	return d.object("conversation", []string{"id"}, func(f int) bool {
		if f == 0 {
			return d.optStr(&d.conv, "conversation.id")
		}
		return d.skip()
	})
}

// pushMessage appends m if within the limit of messages (past it, only
// the count goes on: the view is an error).
func (d *decoder) pushMessage(m message) {
	if d.nmsg < d.lim.messages {
		d.msgs.push(m)
	}
	d.nmsg++
}

// inputValue reads the Responses input, which replaces any read before: a
// string (one user message) or an array of items.
func (d *decoder) inputValue() bool {
	d.msgs.n, d.nmsg, d.badItem = 0, 0, 0
	d.inputSet = d.peek() != 'n'
	switch d.peek() {
	case 'n':
		return d.literal()
	case '"':
		c, ok := d.stringContent()
		d.pushMessage(message{role: d.lit("user"), content: c})
		return ok
	case '[':
	default:
		return d.wrongType("input", "string or array")
	}
	_, ok := d.elements(func(i int) bool {
		k := d.mark()
		m, keep, ok := d.inputItem(i)
		switch {
		case keep && d.nmsg >= d.lim.messages:
			// Past the limit: checked, not kept (the view is an error).
			d.nmsg++
			d.rollback(k)
		case keep:
			d.pushMessage(m)
		}
		return ok
	})
	return ok
}

var itemFields = []string{"type", "role", "content", "name", "arguments", "output"}

// inputItem reads one Responses input item into the message the engine
// makes of it; keep is false for an item that makes none.
func (d *decoder) inputItem(i int) (m message, keep, ok bool) {
	var typ, role, name, args span
	var c, out content
	outSet := false
	ok = d.object("input", itemFields, func(f int) bool {
		switch f {
		case 0:
			return d.optStr(&typ, "input.type")
		case 1:
			return d.optStr(&role, "input.role")
		case 2:
			return d.content(&c)
		case 3:
			return d.optStr(&name, "input.name")
		case 4:
			return d.optStr(&args, "input.arguments")
		case 5:
			outSet = true
			return d.content(&out)
		}
		return d.skip()
	})
	if !ok {
		return m, false, false
	}
	switch t := string(d.bytes(typ)); t {
	case "", "message":
		return message{role: role, content: c}, true, true
	case "function_call":
		d.ncalls++
		m = message{role: d.lit("assistant"), content: content{lo: int32(d.segs.n), hi: int32(d.segs.n)}}
		if d.ncalls <= d.lim.calls {
			m.calls = callRange{lo: int32(d.calls.n), n: 1}
			d.calls.push(toolCall{name: name, args: args})
		}
		return m, true, true
	case "function_call_output":
		if !outSet {
			out = content{lo: int32(d.segs.n), hi: int32(d.segs.n)}
		}
		return message{role: d.lit("tool"), content: out}, true, true
	case "reasoning":
		return m, false, true
	default:
		if d.badItem == 0 {
			d.badItem, d.badItemType = i+1, t
		}
		return m, false, true
	}
}

var (
	anthropicMessageFields = []string{"role", "content"}
	blockFields            = []string{"type", "text", "name", "input", "content"}
)

// anthropicMessages reads the Messages messages, which replace any read
// before.
func (d *decoder) anthropicMessages() bool {
	d.msgs.n, d.nmsg, d.badMessage = 0, 0, ""
	if null, ok := d.open('[', "messages"); null || !ok {
		return ok
	}
	_, ok := d.elements(func(i int) bool {
		k := d.mark()
		ok := d.anthropicMessage(i)
		if d.nmsg > d.lim.messages {
			d.rollback(k)
		}
		return ok
	})
	return ok
}

// anthropicMessage reads one Messages message and pushes the messages the
// engine makes of it: its user tool results' tool messages, then itself.
func (d *decoder) anthropicMessage(i int) bool {
	var role span
	var str span
	isStr, isList := false, false
	nblocks := 0
	d.blocks = d.blocks[:0]
	ok := d.object("messages", anthropicMessageFields, func(f int) bool {
		switch f {
		case 0:
			return d.optStr(&role, "messages.role")
		case 1:
			d.blocks = d.blocks[:0]
			isStr, isList = false, false
			switch d.peek() {
			case '"':
				isStr = true
				var ok bool
				str, ok = d.str()
				return ok
			case '[':
				isList = true
				n, ok := d.elements(func(int) bool { return d.block() })
				nblocks = n
				return ok
			}
			return d.wrongType("messages.content", "string or array")
		}
		return d.skip()
	})
	if !ok {
		return false
	}
	r := string(d.bytes(role))
	switch {
	case d.badMessage != "":
	case r != "user" && r != "assistant":
		d.badMessage = fmt.Sprintf("messages[%d].role must be 'user' or 'assistant'", i)
	case !isStr && !isList:
		d.badMessage = fmt.Sprintf("messages[%d].content: Field required", i)
	case isList && nblocks == 0:
		d.badMessage = "message content must not be empty"
	}
	if isStr {
		d.group = d.segs.n
		lo := int32(d.segs.n)
		d.emit(str)
		d.pushMessage(message{role: role, content: content{lo: lo, hi: int32(d.segs.n)}})
		return true
	}
	// Tool results of a user message first, as messages of their own.
	for _, b := range d.blocks {
		if b.typ == blockToolResult && r == "user" {
			d.pushMessage(message{role: d.lit("tool"), content: b.res})
		}
	}
	d.group = d.segs.n
	m := message{role: role, content: content{lo: int32(d.segs.n)}, calls: callRange{lo: int32(d.calls.n)}}
	for _, b := range d.blocks {
		switch b.typ {
		case blockText:
			d.emit(b.text)
		case blockImage:
			d.emitPlaceholder([]byte("image_url"))
		case blockToolResult:
			if r != "user" {
				d.emitText("Tool result: ")
				for j := b.res.lo; j < b.res.hi; j++ {
					d.emit(*d.segs.at(int(j)))
				}
			}
		case blockToolUse:
			if d.ncalls++; d.ncalls <= d.lim.calls {
				d.calls.push(toolCall{name: b.name, args: b.args})
				m.calls.n++
			}
		}
	}
	m.content.hi = int32(d.segs.n)
	d.pushMessage(m)
	return true
}

// block reads one content block of a Messages message into d.blocks.
func (d *decoder) block() bool {
	var typ, text, name, args span
	var res content
	ok := d.object("messages.content", blockFields, func(f int) bool {
		switch f {
		case 0:
			return d.optStr(&typ, "messages.content.type")
		case 1:
			return d.optStr(&text, "messages.content.text")
		case 2:
			return d.optStr(&name, "messages.content.name")
		case 3:
			var ok bool
			args, ok = d.compactValue()
			return ok
		case 4:
			return d.toolResultContent(&res)
		}
		return d.skip()
	})
	if !ok {
		return false
	}
	b := ablock{text: text, name: name, args: args, res: res}
	switch string(d.bytes(typ)) {
	case "text":
		if text.n == 0 {
			return true
		}
		b.typ = blockText
	case "image":
		b.typ = blockImage
	case "tool_use":
		b.typ = blockToolUse
		if args.n == 0 {
			b.args = d.lit("{}")
		}
	case "tool_result":
		b.typ = blockToolResult
	default:
		b.typ = blockSkip
	}
	d.blocks = append(d.blocks, b)
	return true
}

// toolResultContent reads a tool_result's content: a string, or blocks
// whose texts are concatenated.
func (d *decoder) toolResultContent(c *content) bool {
	*c = content{lo: int32(d.segs.n), hi: int32(d.segs.n)}
	switch d.peek() {
	case 'n':
		return d.literal()
	case '"':
		var ok bool
		*c, ok = d.stringContent()
		return ok
	case '[':
	default:
		return d.wrongType("messages.content.content", "string or array")
	}
	d.group = d.segs.n
	ok := d.textBlocks("messages.content.content")
	c.hi = int32(d.segs.n)
	return ok
}

// textBlocks reads an array of blocks of the field name, emitting the
// text of its text blocks.
func (d *decoder) textBlocks(name string) bool {
	_, ok := d.elements(func(int) bool {
		var typ, text span
		ok := d.object(name, partFields, func(f int) bool {
			switch f {
			case 0:
				return d.optStr(&typ, name+".type")
			case 1:
				return d.optStr(&text, name+".text")
			}
			return d.skip()
		})
		if ok && string(d.bytes(typ)) == "text" {
			d.emit(text)
		}
		return ok
	})
	return ok
}

// compactValue reads any JSON value and returns its text compact (as
// json.Compact gives it), as tool definitions and tool inputs render.
func (d *decoder) compactValue() (span, bool) {
	start := d.pos
	d.spaced = false
	if !d.skip() {
		return span{}, false
	}
	v := d.buf[start:d.pos]
	if !d.spaced {
		return span{int32(start), int32(len(v))}, true
	}
	d.room()
	a := len(d.arena)
	d.arena = appendCompact(d.arena, v)
	return span{^int32(a), int32(len(d.arena) - a)}, true
}

// agentView checks a Responses or Messages body and renders its prompt
// (chatView), with the state the routing needs.
func (d *decoder) agentView(v *View) *openai.Error {
	if d.kind == Responses {
		if !d.inputSet {
			return openai.BadRequest("missing_input", "'input' is required")
		}
		if d.badItem > 0 {
			return openai.BadRequest("invalid_input", fmt.Sprintf("input[%d] has the unsupported type %q", d.badItem-1, d.badItemType))
		}
		v.PreviousResponseID = string(d.bytes(d.prevID))
		v.Conversation = string(d.bytes(d.conv))
		v.Store = d.store || !d.storeSet
		v.Background = d.background
		if !d.hasSession && d.cacheKey.n > 0 {
			v.SessionKey = string(d.bytes(d.cacheKey))
		}
	} else {
		if d.badMessage != "" {
			return openai.BadRequest("invalid_message", d.badMessage)
		}
		if d.nmsg == 0 {
			return openai.BadRequest("missing_messages", "messages must contain at least one item")
		}
		if !d.maxTokens.set && !d.countOnly {
			return openai.BadRequest("missing_max_tokens", "max_tokens: Field required")
		}
	}
	// An empty Responses input renders no message: only the instructions
	// and the generation prompt (a stored conversation goes in between).
	return d.renderChat(v)
}
