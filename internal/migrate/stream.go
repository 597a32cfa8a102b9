package migrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/kvroute/kvroute/internal/openai"
)

// Stream is the client's event stream of a chat completion or completion
// that may be continued on another engine: it reads the current engine's
// stream, hands on whole events only (an event its engine broke in the
// middle is never sent, so that the continuation's events follow a clean
// boundary), and remembers what the answer so far is (Text, Tokens).
//
// The first engine's events go out unchanged. After Swap, the next
// engine's are rewritten into the client's stream: each chunk gets the
// first one's "id" and "created"; the role of a chat's first chunk, which
// the client had already, is taken out (a chunk left with nothing is
// dropped); the usage chunk says what the client would have seen of one
// engine: the original prompt (the continuation's prompt less the text it
// carries) and every token sent, the cached-token detail left out (it was
// the second engine's, of another prompt); and one [DONE] ends it.
//
// An engine that reports an error inside its stream (vLLM's error event
// when its engine dies) has broken it: the event is dropped and Read
// returns ErrEngineError, which the caller continues like any broken
// stream.
//
// Read returns the error of the engine's body once every whole event
// before it was read; the caller then Swaps in the next engine's body, or
// gives up. A Stream is used by one goroutine.
type Stream struct {
	body io.ReadCloser
	head []byte
	// headErr ends the current body after head, without reading it.
	headErr error
	buf     []byte // read, not yet a whole event
	out     []byte // whole events, ready to be read
	rd      []byte
	err     error
	// leg is 0 for the first engine's stream, then one more a Swap.
	leg int
	// id and created are the first engine's chunks'; seen once read.
	id      string
	created int64
	seen    bool
	// text is the answer's text sent so far, tokens its content chunks;
	// base is tokens when the current leg began (what its usage adds to).
	text   []byte
	tokens int
	base   int
	// finished is set by a chunk with a finish reason; done by [DONE];
	// refused when the answer holds more than text.
	finished, done bool
	refused        error
}

// ErrEngineError is an engine's error event inside its stream: the
// stream is broken, as if its connection had been.
var ErrEngineError = errors.New("the engine reported an error inside its stream")

// NewStream reads the stream of body, of which head was already read
// (headErr, when not nil, ending it there).
func NewStream(head []byte, headErr error, body io.ReadCloser) *Stream {
	return &Stream{body: body, head: head, headErr: headErr, rd: make([]byte, 16<<10)}
}

// Text is the answer's text sent so far; Tokens its content chunks
// (vLLM and SGLang send a token a chunk by default).
func (s *Stream) Text() string { return string(s.text) }

// Tokens is the answer's content chunks sent so far.
func (s *Stream) Tokens() int { return s.tokens }

// Finished reports whether a chunk with a finish reason was sent: the
// answer is whole, and only [DONE] (and a usage chunk) may be missing.
func (s *Stream) Finished() bool { return s.finished }

// Done reports whether [DONE] was sent.
func (s *Stream) Done() bool { return s.done }

// Refused is why the answer so far cannot be continued, nil when it can.
func (s *Stream) Refused() error { return s.refused }

// Moves is how many times the stream was swapped onto another engine.
func (s *Stream) Moves() int { return s.leg }

// Swap continues the stream with the next engine's body (head, headErr
// as NewStream's), closing the broken one.
func (s *Stream) Swap(head []byte, headErr error, body io.ReadCloser) {
	_ = s.body.Close()
	s.body, s.head, s.headErr = body, head, headErr
	s.buf, s.err = s.buf[:0], nil
	s.leg++
	s.base = s.tokens
}

// End hands on [DONE] to end the stream of a finished answer whose engine
// broke it before its own [DONE].
func (s *Stream) End() {
	if !s.done {
		s.out = append(s.out, "data: [DONE]\n\n"...)
		s.done = true
	}
	s.err = io.EOF
}

// Close closes the current engine's body; a Read under way returns its
// error. A Swap may follow.
func (s *Stream) Close() error { return s.body.Close() }

func (s *Stream) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		var n int
		var err error
		switch {
		case len(s.head) > 0:
			n = copy(s.rd, s.head)
			s.head = s.head[n:]
			if len(s.head) == 0 && s.headErr != nil {
				err = s.headErr
			}
		case s.headErr != nil:
			err = s.headErr
		default:
			n, err = s.body.Read(s.rd)
		}
		s.buf = append(s.buf, s.rd[:n]...)
		if perr := s.split(); perr != nil {
			err = perr
		}
		if err != nil {
			if err == io.EOF {
				// A clean end: whatever follows the last event goes out
				// as it came.
				s.out = append(s.out, s.buf...)
			}
			s.buf = s.buf[:0]
			s.err = err
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = s.out[:0:0] // let a long backlog go
	}
	return n, nil
}

// split moves the whole events of buf to out, as they go to the client;
// ErrEngineError for an engine's error event.
func (s *Stream) split() error {
	for {
		i, sep := eventEnd(s.buf)
		if i < 0 {
			return nil
		}
		ev := s.buf[:i+sep]
		emit, err := s.event(ev)
		if err != nil {
			return err
		}
		s.out = append(s.out, emit...)
		s.buf = s.buf[i+sep:]
	}
}

// eventEnd is where buf's first event ends (the index of its blank line)
// and the separator's length, -1 when no event is whole.
func eventEnd(buf []byte) (int, int) {
	i := bytes.Index(buf, []byte("\n\n"))
	j := bytes.Index(buf, []byte("\r\n\r\n"))
	switch {
	case j >= 0 && (i < 0 || j < i):
		return j, 4
	case i >= 0:
		return i, 2
	}
	return -1, 0
}

// event reads one whole event and returns what goes to the client of it.
func (s *Stream) event(ev []byte) ([]byte, error) {
	data, ok := payload(ev)
	if !ok {
		return ev, nil // a comment, or an event of another shape: as it came
	}
	if string(data) == "[DONE]" {
		if s.done {
			return nil, nil
		}
		s.done = true
		return ev, nil
	}
	if bytes.HasPrefix(data, []byte(`{"error"`)) || isError(data) {
		return nil, ErrEngineError
	}
	if s.leg == 0 {
		s.note(data)
		return ev, nil
	}
	out, err := s.rewrite(data)
	if err != nil {
		// Not a chunk this package knows: as it came.
		return ev, nil
	}
	return out, nil
}

// payload is the data of an event of one data line, the router's engines'
// only shape.
func payload(ev []byte) ([]byte, bool) {
	line := bytes.TrimRight(ev, "\r\n")
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || bytes.IndexByte(data, '\n') >= 0 {
		return nil, false
	}
	return bytes.TrimSpace(data), true
}

// isError reports whether a chunk is an error object (a top-level
// "error" member) rather than a completion chunk, which has "choices".
func isError(data []byte) bool {
	return !bytes.Contains(data, []byte(`"choices"`)) && bytes.Contains(data, []byte(`"error"`))
}

// Keys read from the first engine's chunks without decoding them.
var (
	contentKey   = []byte(`"content":"`)
	textKey      = []byte(`"text":"`)
	finishKey    = []byte(`"finish_reason":"`)
	toolCallsKey = []byte(`"tool_calls":[{`)
	reasonKeys   = [][]byte{[]byte(`"reasoning_content":"`), []byte(`"reasoning":"`)}
)

// note reads a first engine's chunk: its id and creation once, its text.
func (s *Stream) note(data []byte) {
	if !s.seen {
		var h struct {
			ID      string `json:"id"`
			Created int64  `json:"created"`
		}
		if json.Unmarshal(data, &h) == nil {
			s.id, s.created, s.seen = h.ID, h.Created, true
		}
	}
	s.content(data)
}

// content notes a chunk's text, its finish, and whether it holds more
// than text.
func (s *Stream) content(data []byte) {
	t, ok := stringAt(data, contentKey)
	if !ok {
		t, ok = stringAt(data, textKey)
	}
	if ok && t != "" {
		s.text = append(s.text, t...)
		s.tokens++
	}
	if bytes.Contains(data, finishKey) {
		s.finished = true
	}
	if bytes.Contains(data, toolCallsKey) {
		s.refused = RefuseNotContent
	}
	for _, k := range reasonKeys {
		if r, ok := stringAt(data, k); ok && r != "" {
			s.refused = RefuseNotContent
		}
	}
}

// stringAt is the JSON string that follows key (`"name":"`) in data,
// decoded; ok false when there is none. A chunk's free text is in
// strings, whose quotes are escaped, so key matches a member's name only.
func stringAt(data, key []byte) (string, bool) {
	i := bytes.Index(data, key)
	if i < 0 {
		return "", false
	}
	start := i + len(key) - 1 // the opening quote
	esc := false
	for j := start + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '\\':
			esc = true
			j++
		case c == '"':
			if !esc {
				return string(data[start+1 : j]), true
			}
			var v string
			if json.Unmarshal(data[start:j+1], &v) != nil {
				return "", false
			}
			return v, true
		}
	}
	return "", false
}

// rewrite is a later engine's chunk as the client's stream carries it.
func (s *Stream) rewrite(data []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if _, ok := m["choices"]; !ok {
		return nil, errNoEvent
	}
	s.content(data)
	if s.seen {
		id, _ := json.Marshal(s.id)
		m["id"] = id
		m["created"] = json.RawMessage(appendInt(nil, s.created))
	}
	var choices []map[string]json.RawMessage
	if err := json.Unmarshal(m["choices"], &choices); err != nil {
		return nil, err
	}
	had := len(choices)
	kept := choices[:0]
	for _, c := range choices {
		if d, ok := c["delta"]; ok {
			var delta map[string]json.RawMessage
			if json.Unmarshal(d, &delta) == nil {
				delete(delta, "role")
				for k, v := range delta {
					if string(v) == "null" || k == "content" && string(v) == `""` {
						delete(delta, k)
					}
				}
				if len(delta) == 0 && isNull(c["finish_reason"]) && isNull(c["logprobs"]) {
					continue // the role chunk: the client has its role
				}
				c["delta"], _ = json.Marshal(delta)
			}
		}
		kept = append(kept, c)
	}
	u, hasUsage := m["usage"]
	hasUsage = hasUsage && !isNull(u)
	if had > 0 && len(kept) == 0 && !hasUsage {
		return nil, nil
	}
	m["choices"], _ = json.Marshal(kept)
	if hasUsage {
		var use openai.Usage
		if err := json.Unmarshal(u, &use); err != nil {
			return nil, err
		}
		m["usage"], _ = json.Marshal(s.usage(use))
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...), nil
}

// usage is what the client would have seen of one engine, from the
// current leg's: the original prompt (the continuation's prompt carries
// the base tokens sent before it) and every token sent.
func (s *Stream) usage(u openai.Usage) openai.Usage {
	prompt := max(0, u.PromptTokens-s.base)
	completion := s.base + u.CompletionTokens
	return openai.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

func appendInt(b []byte, n int64) []byte {
	out, _ := json.Marshal(n)
	return append(b, out...)
}
