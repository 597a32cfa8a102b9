package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// A stream whose backend breaks after its first byte cannot be retried:
// the client already holds part of it. The router then ends it as vLLM
// ends a stream its engine failed, in a way a client can detect whatever
// its SSE library:
//
//  1. it appends one SSE event in the OpenAI error shape,
//
//     data: {"error":{"message":"the backend broke the stream; the response is incomplete","type":"server_error","param":null,"code":"backend_stream_broken"}}
//
//     (code stream_idle_timeout for a backend silent for
//     upstream.stream_idle_timeout), preceded by a blank line when the
//     backend stopped inside an event, so that the error event parses on
//     its own (the OpenAI SDKs raise an APIError on an event with an
//     "error" key). The message names neither the backend nor its
//     address; the router's log has both, and the cause;
//  2. it never sends data: [DONE] (vLLM does after its error event; a
//     client that ignores error events can still tell the stream is
//     incomplete), and then ends the response cleanly: the chunked body
//     gets its terminating zero-length chunk, so that an HTTP client
//     reads the error event rather than failing on a truncated body (the
//     OpenAI SDKs raise an APIError with the event's message, not a
//     connection error), and the connection stays usable.
//
// The bytes the backend sent before the break reach the client unchanged.
// A backend that breaks its connection after its stream's data: [DONE]
// has not broken the stream: it ends as a complete one, with no event.
// Non-SSE bodies (a JSON completion) get no event, which would corrupt
// them: they are aborted instead, so that the HTTP framing itself is
// truncated (an unterminated chunked body, or fewer bytes than the
// Content-Length, seen by HTTP clients as an unexpected EOF).

// The error codes of the event: a stream its backend broke, and one its
// backend left silent.
const (
	streamBrokenCode = "backend_stream_broken"
	streamIdleCode   = "stream_idle_timeout"
)

// isSSE reports whether a response with this Content-Type is an event
// stream.
func isSSE(contentType string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream")
}

// sseTail remembers the last bytes relayed, to tell whether the stream
// stopped between events, and whether its last event was data: [DONE].
type sseTail struct {
	b [tailBytes]byte
	n int
}

// tailBytes holds the longest ending looked for: "data: [DONE]\r\n\r\n".
const tailBytes = 16

func (t *sseTail) note(p []byte) {
	p = p[max(0, len(p)-tailBytes):]
	keep := min(t.n, tailBytes-len(p))
	copy(t.b[tailBytes-len(p)-keep:], t.b[tailBytes-keep:])
	copy(t.b[tailBytes-len(p):], p)
	t.n = keep + len(p)
}

func (t *sseTail) bytes() []byte { return t.b[tailBytes-t.n:] }

// atBoundary reports whether nothing, or a whole number of events, was
// relayed.
func (t *sseTail) atBoundary() bool {
	s := t.bytes()
	return t.n == 0 || bytes.HasSuffix(s, []byte("\n\n")) || bytes.HasSuffix(s, []byte("\r\n\r\n")) || bytes.HasSuffix(s, []byte("\r\r"))
}

// done reports whether the last event relayed was the stream's end,
// data: [DONE] (with or without the space, with any of SSE's line ends):
// a backend that breaks its connection after it has not broken the
// stream, which the client holds whole.
func (t *sseTail) done() bool {
	s := t.bytes()
	for _, end := range []string{"\n\n", "\r\n\r\n", "\r\r"} {
		if ev, ok := bytes.CutSuffix(s, []byte(end)); ok {
			return bytes.HasSuffix(ev, []byte("data: [DONE]")) || bytes.HasSuffix(ev, []byte("data:[DONE]"))
		}
	}
	return false
}

// streamErrorEvent is the event that ends a broken stream (see above). A
// Responses or Messages stream (agent) gets a named error event in its
// API's shape: event: error, data {"type":"error", ...}.
func streamErrorEvent(cause error, atBoundary, agent bool) []byte {
	d := openai.ErrorDetail{Message: "the backend broke the stream; the response is incomplete", Type: openai.TypeServer, Code: streamBrokenCode}
	if errors.Is(cause, errStreamIdle) {
		d.Message, d.Code = "the backend sent nothing within the router's stream idle timeout; the response is incomplete", streamIdleCode
	}
	body, _ := json.Marshal(openai.ErrorBody{Error: d})
	if agent {
		// Both APIs' clients read the event's "type"; OpenAI's its
		// code and message, Anthropic's its error object.
		body, _ = json.Marshal(map[string]any{"type": "error", "code": d.Code, "message": d.Message, "param": nil,
			"error": openai.AnthropicErrorDetail{Type: "api_error", Message: d.Message}})
	}
	var b []byte
	if !atBoundary {
		b = append(b, "\n\n"...)
	}
	if agent {
		b = append(b, "event: error\n"...)
	}
	b = append(b, "data: "...)
	b = append(b, body...)
	return append(b, "\n\n"...)
}
