package migrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"sync"

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
	// mu guards body between Swap and a Close from another goroutine
	// (a timer's).
	mu   sync.Mutex
	body io.ReadCloser
	head []byte
	// headErr ends the current body after head, without reading it.
	headErr error
	held    []byte // read, not yet a whole event
	out     []byte // whole events, rewritten, ready to be read
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
	// finished is set by a chunk with a finish reason but the last token
	// chunk, last (whose finish Finished reads); done by [DONE]; refused
	// when the answer holds more than text. key is the chunks' text key,
	// nil until one was seen.
	finished, done bool
	refused        error
	last           []byte
	key            []byte
}

// ErrEngineError is an engine's error event inside its stream: the
// stream is broken, as if its connection had been.
var ErrEngineError = errors.New("the engine reported an error inside its stream")

// NewStream reads the stream of body, of which head was already read
// (headErr, when not nil, ending it there).
func NewStream(head []byte, headErr error, body io.ReadCloser) *Stream {
	return &Stream{body: body, head: head, headErr: headErr}
}

// Text is the answer's text sent so far; Tokens its content chunks
// (vLLM and SGLang send a token a chunk by default).
func (s *Stream) Text() string { return string(s.text) }

// Tokens is the answer's content chunks sent so far.
func (s *Stream) Tokens() int { return s.tokens }

// Finished reports whether a chunk with a finish reason was sent: the
// answer is whole, and only [DONE] (and a usage chunk) may be missing.
func (s *Stream) Finished() bool { return s.finished || bytes.Contains(s.last, finishKey) }

// Done reports whether [DONE] was sent.
func (s *Stream) Done() bool { return s.done }

// Refused is why the answer so far cannot be continued, nil when it can.
func (s *Stream) Refused() error { return s.refused }

// Moves is how many times the stream was swapped onto another engine.
func (s *Stream) Moves() int { return s.leg }

// Swap continues the stream with the next engine's body (head, headErr
// as NewStream's), closing the broken one.
func (s *Stream) Swap(head []byte, headErr error, body io.ReadCloser) {
	s.mu.Lock()
	_ = s.body.Close()
	s.body = body
	s.mu.Unlock()
	s.head, s.headErr = head, headErr
	s.held, s.err = s.held[:0], nil
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
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body.Close()
}

// Read hands on the whole events read so far. The first engine's events
// go out as they came, read straight into p (the bytes of an event not yet
// whole are held for the next call); a later engine's are rewritten.
func (s *Stream) Read(p []byte) (int, error) {
	if len(s.out) > 0 || s.leg > 0 || s.err != nil || len(s.held) >= len(p)/2 {
		return s.readBuffered(p)
	}
	for {
		h := copy(p, s.held)
		n, err := s.source(p[h:])
		n += h
		end, perr := s.scan(p[:n], func([]byte) {})
		if perr != nil {
			// What follows an error event (its [DONE]) is dropped.
			s.held, s.err = s.held[:0], perr
			return end, nil
		}
		s.held = append(s.held[:0], p[end:n]...)
		if err != nil {
			if err == io.EOF {
				// A clean end: whatever follows the last event goes out
				// as it came.
				end = n
			}
			s.held, s.err = s.held[:0], err
			if end == 0 {
				return 0, err
			}
			return end, nil
		}
		if end > 0 {
			return end, nil
		}
		if len(s.held) >= len(p)/2 {
			return s.readBuffered(p)
		}
	}
}

// source reads the current engine's body: what was read of it before,
// then the rest.
func (s *Stream) source(p []byte) (int, error) {
	switch {
	case len(s.head) > 0:
		n := copy(p, s.head)
		s.head = s.head[n:]
		if len(s.head) == 0 && s.headErr != nil {
			return n, s.headErr
		}
		return n, nil
	case s.headErr != nil:
		return 0, s.headErr
	}
	return s.body.Read(p)
}

// readBuffered is Read through the Stream's own buffers: a later
// engine's events, rewritten, and an event too long for p.
func (s *Stream) readBuffered(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if cap(s.held)-len(s.held) < 4<<10 {
			s.held = append(make([]byte, 0, 2*cap(s.held)+16<<10), s.held...)
		}
		n, err := s.source(s.held[len(s.held):cap(s.held)])
		s.held = s.held[:len(s.held)+n]
		end, perr := s.scan(s.held, func(ev []byte) { s.out = append(s.out, ev...) })
		s.held = s.held[:copy(s.held, s.held[end:])]
		if perr != nil {
			err = perr
		}
		if err != nil {
			if err == io.EOF {
				s.out = append(s.out, s.held...)
			}
			s.held, s.err = s.held[:0], err
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = nil // a long backlog is let go
	}
	return n, nil
}

// scan reads the whole events at the start of b, handing what the client
// gets of each to emit (a first engine's events are b's own bytes, which
// go out as they are), and returns where the last one ends; for an
// engine's error event, ErrEngineError and where that event starts. An
// event ends at an empty line.
func (s *Stream) scan(b []byte, emit func([]byte)) (int, error) {
	start, line := 0, 0
	for {
		i := bytes.IndexByte(b[line:], '\n')
		if i < 0 {
			return start, nil
		}
		l := b[line : line+i]
		line += i + 1
		if len(l) > 1 || len(l) == 1 && l[0] != '\r' {
			continue
		}
		out, err := s.event(b[start:line])
		if err != nil {
			return start, err
		}
		if out != nil {
			emit(out)
		}
		start = line
	}
}

// event reads one whole event and returns what goes to the client of it.
func (s *Stream) event(ev []byte) ([]byte, error) {
	data, ok := payload(ev)
	if !ok {
		return ev, nil // a comment, or an event of another shape: as it came
	}
	if s.leg == 0 && s.token(data) {
		return ev, nil // the bulk of a stream
	}
	if string(data) == "[DONE]" {
		if s.done {
			return nil, nil
		}
		s.done = true
		return ev, nil
	}
	if isError(data) {
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
	line := ev
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || bytes.IndexByte(data, '\n') >= 0 {
		return nil, false
	}
	return bytes.TrimSpace(data), true
}

// isError reports whether a chunk is an error object (a top-level
// "error" member, or vLLM's older "object":"error") rather than a
// completion chunk, which has "choices".
func isError(data []byte) bool {
	return !bytes.Contains(data, []byte(`"choices"`)) && bytes.Contains(data, []byte(`"error"`))
}

// Keys read from the chunks without decoding them.
var (
	contentKey   = []byte(`"content":"`)
	textKey      = []byte(`"text":"`)
	finishKey    = []byte(`"finish_reason":"`)
	toolCallsKey = []byte(`"tool_calls":[{`)
	reasonKeys   = [][]byte{[]byte(`"reasoning_content":"`), []byte(`"reasoning":"`)}
)

// token reads a token chunk, the bulk of a stream, with as few passes
// over it as it takes to find its text: it reports false for any other
// event, which note reads in full. Its finish, if any, is read from the
// last one when it matters (Finished).
func (s *Stream) token(data []byte) bool {
	if !s.seen {
		return false
	}
	key := s.key
	if key == nil {
		key = contentKey
	}
	t, ok := s.appendString(data, key)
	if !ok && s.key == nil {
		key = textKey
		t, ok = s.appendString(data, key)
	}
	if !ok || !t {
		return false
	}
	s.key = key
	s.tokens++
	s.last = append(s.last[:0], data...)
	return true
}

// note reads a first engine's chunk other than a token's: its id and
// creation once, its text, its finish, whether it holds more than text.
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
	t, ok := s.appendString(data, contentKey)
	if !ok {
		t, ok = s.appendString(data, textKey)
	}
	if ok && t {
		s.tokens++
	}
	if bytes.Contains(data, finishKey) {
		s.finished = true
	}
	if bytes.Contains(data, toolCallsKey) {
		s.refused = RefuseNotContent
	}
	for _, k := range reasonKeys {
		if i := bytes.Index(data, k); i >= 0 && i+len(k) < len(data) && data[i+len(k)] != '"' {
			s.refused = RefuseNotContent
		}
	}
}

// appendString appends to the answer's text the JSON string that follows
// key (`"name":"`) in data, decoded; found is false when data has none,
// text whether it was not empty. A chunk's free text is in strings, whose
// quotes are escaped, so key matches a member's name only.
func (s *Stream) appendString(data, key []byte) (text, found bool) {
	i := bytes.Index(data, key)
	if i < 0 {
		return false, false
	}
	start := i + len(key) - 1 // the opening quote
	rest := data[start+1:]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return false, false
	}
	if bytes.IndexByte(rest[:j], '\\') < 0 {
		s.text = append(s.text, rest[:j]...)
		return j > 0, true
	}
	// An escape: the string ends at the first quote not escaped.
	for j = 0; j < len(rest); j++ {
		switch rest[j] {
		case '\\':
			j++
		case '"':
			var v string
			if json.Unmarshal(data[start:start+j+2], &v) != nil {
				return false, false
			}
			s.text = append(s.text, v...)
			return v != "", true
		}
	}
	return false, false
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
