package workload

import (
	"encoding/json"
	"strconv"
)

// seg is a piece of message text: a literal (plain text with nothing to
// escape in JSON), or n bytes of generated text for key.
type seg struct {
	lit string
	key uint64
	n   int
}

func (s seg) len() int {
	if s.lit != "" {
		return len(s.lit)
	}
	return s.n
}

func (s seg) appendTo(dst []byte) []byte {
	if s.lit != "" {
		return append(dst, s.lit...)
	}
	return appendText(dst, s.key, s.n)
}

func lit(s string) seg                { return seg{lit: s} }
func gen(key uint64, n int) seg       { return seg{key: key, n: n} }
func text(key uint64, tokens int) seg { return gen(key, tokens*4) }

// msg is one chat message.
type msg struct {
	role string
	segs []seg
}

func (m msg) contentLen() int {
	n := 0
	for _, s := range m.segs {
		n += s.len()
	}
	return n
}

// chatSpec describes a chat request; the body is rendered from it on demand.
type chatSpec struct {
	// tools are compact JSON objects.
	tools []string
	msgs  []msg
	out   int
}

// promptBytes is the length of the prompt request.Render makes of the spec:
// "<|tools|>\n" + tool + "\n" ..., then "<|role|>\n" + content + "\n" per
// message, then the generation prompt "<|assistant|>\n".
func (c *chatSpec) promptBytes() int {
	n := 0
	if len(c.tools) > 0 {
		n += len("<|tools|>\n")
		for _, t := range c.tools {
			n += len(t) + 1
		}
	}
	for _, m := range c.msgs {
		n += len("<|") + len(m.role) + len("|>\n") + m.contentLen() + 1
	}
	return n + len("<|assistant|>\n")
}

func (c *chatSpec) body(model string) []byte {
	size := 256
	for _, t := range c.tools {
		size += len(t) + 1
	}
	for _, m := range c.msgs {
		size += m.contentLen() + 32
	}
	b := make([]byte, 0, size+len(model))
	b = append(b, `{"model":`...)
	b = appendJSONString(b, model)
	if len(c.tools) > 0 {
		b = append(b, `,"tools":[`...)
		for i, t := range c.tools {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, t...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"messages":[`...)
	for i, m := range c.msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":"`...)
		b = append(b, m.role...)
		b = append(b, `","content":"`...)
		for _, s := range m.segs {
			b = s.appendTo(b)
		}
		b = append(b, `"}`...)
	}
	b = append(b, ']')
	return appendTail(b, c.out)
}

// appendTail closes a body with the exact-output-length and streaming options.
func appendTail(b []byte, out int) []byte {
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(out), 10)
	b = append(b, `,"min_tokens":`...)
	b = strconv.AppendInt(b, int64(out), 10)
	return append(b, `,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`...)
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}
