package disagg

import "bytes"

// An engine's answer can carry its own kv_transfer_params: vLLM's
// completion and chat responses have the member at the top level
// (ChatCompletionResponse, CompletionResponse: the engine id, its side
// channel's host and port, the blocks it holds for a decode engine), and
// an engine or a fork may put it in its stream's chunks too. They are the
// router's business (Transfer reads a prefill leg's), never the client's:
// Answer blanks them from every body relayed to a client.
//
// The body is rewritten as it streams, in place, keeping its length: the
// value of a member named kv_transfer_params becomes null followed by
// spaces to the value's length (a value under 4 bytes, which names no
// host or block list, becomes its type's empty value, {} [] "" or 0, so
// padded). The client has the response's headers before its body, a
// Content-Length among them, so a body that shrank would break its
// framing; spaces between tokens are JSON's whitespace, and every other
// byte stays the engine's. null is what vLLM itself writes there when
// it has no parameters to report.
//
// Cost: a body without the key is searched once (bytes.Index) and
// passed on untouched. Only a member name is matched: in JSON a quote
// inside a string is escaped, so `"kv_transfer_params"` followed by a
// colon is a member name wherever it appears (an escaped quote before it
// is a longer name's end, skipped). The name as engines write it is
// matched (Python's json and pydantic never escape a letter); any depth
// is blanked, vLLM's being the top level.

// answerKey is the member name blanked. Its tail after keyHead is what
// is searched for: an underscore is rarer in a completion's bytes than a
// quote or a k, which makes the search some ten times faster
// (BenchmarkAnswer).
var answerKey = []byte(`"kv_transfer_params"`)

const keyHead = `"kv`

// MaxHeld is the most bytes Answer.Strip holds back from one call to the
// next: a member name cut by the end of the bytes, or a value's first
// bytes, whose length decides what replaces them.
const MaxHeld = len(`"kv_transfer_params"`)

// answerState is where Strip is in the body.
type answerState uint8

const (
	seek   answerState = iota // looking for the member name
	name                      // after the name: a colon makes it a member
	colon                     // after the colon: the value starts next
	inside                    // inside the value
)

// Answer blanks the kv_transfer_params of one response body (see above).
// Its zero value is ready; use one per body.
type Answer struct {
	state answerState
	// prev is the byte before the next call's first: an escaped quote
	// does not start a member name.
	prev byte
	// The value's first byte, how many of its bytes were seen, and where
	// its scan is: depth of brackets, inside a string, after a backslash.
	first  byte
	n      int
	depth  int
	str    bool
	escape bool
}

// Strip rewrites p, the body's next bytes, in place and returns how many
// of its leading bytes may go to the client now. The rest, at most
// MaxHeld bytes, must be given again at the start of the next call. With
// final (the body ends after p) it returns len(p).
func (a *Answer) Strip(p []byte, final bool) int {
	i := 0
	for i < len(p) {
		switch a.state {
		case seek:
			j := bytes.Index(p[i:], answerKey[len(keyHead):])
			if j < 0 {
				if final {
					return a.out(p, len(p))
				}
				return a.out(p, i+cutName(p[i:]))
			}
			j += i - len(keyHead) // where the name would start
			if j < i || string(p[j:j+len(keyHead)]) != keyHead {
				// Not the name: its quote would be a byte already read
				// (the closing quote of a name or value just scanned),
				// or before p (one cut by the previous call's end was
				// held back and starts this p).
				i = j + len(keyHead) + 1
				continue
			}
			before := a.prev
			if j > 0 {
				before = p[j-1]
			}
			if before == '\\' {
				i = j + len(answerKey)
				continue
			}
			i, a.state = j+len(answerKey), name
		case name:
			switch c := p[i]; {
			case space(c):
				i++
			case c == ':':
				i, a.state = i+1, colon
			default:
				a.state = seek // a string value, not a name
			}
		case colon:
			if space(p[i]) {
				i++
				continue
			}
			a.state, a.first, a.n, a.depth, a.str, a.escape = inside, p[i], 0, 0, false, false
		case inside:
			i = a.value(p, i)
		}
	}
	if a.state == inside && a.n < 4 {
		start := len(p) - a.n // the value's first bytes are all in p
		if !final {
			a.state = colon // read again from the value's start
			return a.out(p, start)
		}
		blank(p[start:]) // a body cut inside a short value
	}
	return a.out(p, len(p))
}

// value scans p from i inside a value and returns where the scan stopped:
// len(p), or the byte after the value.
func (a *Answer) value(p []byte, i int) int {
	for ; i < len(p); i++ {
		c := p[i]
		end := false
		switch {
		case a.n == 0:
			switch {
			case c == '{' || c == '[':
				a.depth = 1
			case c == '"':
				a.str = true
			case !scalar(c): // no value: not JSON, left as it is
				a.state = seek
				return i
			}
		case a.first != '{' && a.first != '[' && a.first != '"':
			if !scalar(c) { // the byte after a number or literal
				a.finish(p, i)
				return i
			}
		case a.str:
			switch {
			case a.escape:
				a.escape = false
			case c == '\\':
				a.escape = true
			case c == '"':
				a.str = false
				end = a.depth == 0
			}
		default:
			switch c {
			case '"':
				a.str = true
			case '{', '[':
				a.depth++
			case '}', ']':
				a.depth--
				end = a.depth == 0
			}
		}
		a.n++
		switch {
		case a.n == 4:
			copy(p[i-3:], "null")
		case a.n > 4 && c != '\n' && c != '\r':
			p[i] = ' '
		}
		if end {
			a.finish(p, i+1)
			return i + 1
		}
	}
	return i
}

// finish ends the value whose last byte is p[end-1]: one under 4 bytes
// becomes its type's empty value (one of 4 bytes or more is null already).
func (a *Answer) finish(p []byte, end int) {
	a.state = seek
	if a.n >= 4 {
		return
	}
	v := p[end-a.n : end]
	blank(v)
	switch a.first {
	case '{':
		copy(v, "{}")
	case '[':
		copy(v, "[]")
	case '"':
		copy(v, `""`)
	default:
		if a.first == '-' || a.first >= '0' && a.first <= '9' {
			v[0] = '0'
		}
	}
}

// out notes p[k-1] as the byte before the next call's and returns k.
func (a *Answer) out(p []byte, k int) int {
	if k > 0 {
		a.prev = p[k-1]
	}
	return k
}

// cutName returns where p ends with the start of a member name (a proper
// prefix of answerKey, which has no quote but its first), len(p) if it
// does not.
func cutName(p []byte) int {
	from := max(0, len(p)-(len(answerKey)-1))
	q := bytes.LastIndexByte(p[from:], '"')
	if q < 0 {
		return len(p)
	}
	q += from
	if bytes.HasPrefix(answerKey, p[q:]) {
		return q
	}
	return len(p)
}

// space reports JSON's whitespace.
func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// scalar reports a byte that can continue a number or a literal.
func scalar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '-' || c == '+'
}

// blank turns v into spaces, keeping its line breaks.
func blank(v []byte) {
	for i, c := range v {
		if c != '\n' && c != '\r' {
			v[i] = ' '
		}
	}
}
