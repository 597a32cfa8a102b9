package request

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is the JSON scanner under Parse: it reads a body once, from
// the first byte to the last, validating everything it passes over, and
// decodes only the strings the routing view needs. body.go walks the
// request's structure with it.
//
// It accepts only JSON that Python's json.loads (which the Python engines
// decode a body with) reads the same way: RFC 8259 syntax, no control
// characters in strings, only the standard escapes, and besides
//   - valid UTF-8 only, everywhere in the body: json.loads fails on the
//     bytes of a body that is not (encoding/json would replace each bad
//     byte with U+FFFD and go on);
//   - no \u escape of a lone surrogate: json.loads keeps it as a lone
//     surrogate, which no UTF-8 text can hold;
//   - no integer literal of more than 4,300 digits, which json.loads
//     refuses (Python's int conversion limit);
//   - no nesting deeper than 512, safely under what json.loads can
//     recurse into below an engine's HTTP stack (about 1,000 frames).
// NaN and Infinity, which json.loads accepts, are not JSON and are refused.
//
// Decoded text lives either in the body itself (a string with no escape and
// valid UTF-8 decodes to its own bytes) or in the decoder's arena; a span
// names either.

// maxDepth bounds the arrays and objects open at once. Python's json.loads
// recurses once a level, so an engine refuses a body nested about 1,000
// deep less its own stack (RecursionError); 512 is under that in every
// Python, and far above what a request needs (a tool's JSON schema nests
// a few dozen levels at most).
const maxDepth = 512

// maxIntDigits is the most digits of an integer literal that Python
// converts (sys.get_int_max_str_digits(), 4300 since Python 3.11 and the
// 3.7 to 3.10 security releases): json.loads refuses a body with a longer
// one.
const maxIntDigits = 4300

// maxBody bounds the body so that offsets fit in a span, with room for the
// arena's growth (a placeholder of an empty content part is longer than its
// JSON). The proxy's own limit is far smaller.
const maxBody = 1 << 29

// span is decoded text: buf[off:off+n] when off >= 0, else
// arena[^off:^off+n]. The zero span is the empty text.
type span struct{ off, n int32 }

// syntaxError is a malformed body, or a value of a type the routing view
// cannot hold; both are answered with invalid_json.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at byte offset %d", e.msg, e.off) }

// scanner holds the position in the body and the decoded text.
type scanner struct {
	buf   []byte
	pos   int
	depth int
	arena []byte
	err   *syntaxError
	// spaced is set whenever whitespace is skipped: it tells whether a
	// value is compact.
	spaced bool
	// object is a bit per open container of skip: set for an object.
	object [maxDepth/64 + 1]uint64
	// keyAt is the offset of the opening quote of the key members read
	// last.
	keyAt int
}

// room makes the arena ready for text: the first time, it allocates it
// large enough for all the body's decoded text, which is no longer than
// the body but for placeholders of empty parts (4 bytes for a 3-byte {},),
// so that it seldom grows; a body that decodes no string that needs it
// allocates none.
func (d *scanner) room() {
	if n := len(d.buf) + len(d.buf)/3; cap(d.arena) < n {
		d.arena = append(make([]byte, 0, n), d.arena...)
	}
}

// bytes returns the text of s.
func (d *scanner) bytes(s span) []byte {
	if s.off >= 0 {
		return d.buf[s.off : s.off+s.n]
	}
	o := ^s.off
	return d.arena[o : o+s.n]
}

// peek returns the byte at the position, or 0 at the end.
func (d *scanner) peek() byte {
	if d.pos < len(d.buf) {
		return d.buf[d.pos]
	}
	return 0
}

// fail records the first error and returns false, so that every reader
// can end with "return d.fail(...)".
func (d *scanner) fail(msg string) bool {
	if d.err == nil {
		if d.pos >= len(d.buf) {
			msg = "unexpected end of body"
		}
		d.err = &syntaxError{off: d.pos, msg: msg}
	}
	return false
}

// unexpected fails on the byte at the position, saying what was wanted.
func (d *scanner) unexpected(want string) bool {
	return d.fail(fmt.Sprintf("invalid character %q, want %s", d.peek(), want))
}

// wrongType fails because the value at the position is not of the type the
// view holds for field.
func (d *scanner) wrongType(field, want string) bool {
	got := "number"
	switch d.peek() {
	case '"':
		got = "string"
	case '{':
		got = "object"
	case '[':
		got = "array"
	case 't', 'f':
		got = "bool"
	case 'n':
		got = "null"
	}
	return d.fail(fmt.Sprintf("field %q has the wrong type: got JSON %s, want %s", field, got, want))
}

// space skips JSON whitespace.
func (d *scanner) space() {
	i := d.pos
	for i < len(d.buf) && (d.buf[i] == ' ' || d.buf[i] == '\n' || d.buf[i] == '\r' || d.buf[i] == '\t') {
		i++
	}
	if i != d.pos {
		d.spaced = true
		d.pos = i
	}
}

// enter opens an array or object at the position.
func (d *scanner) enter() bool {
	if d.depth == maxDepth {
		return d.fail(fmt.Sprintf("nesting deeper than %d", maxDepth))
	}
	d.depth++
	d.pos++
	d.space()
	return true
}

// members reads the object at the position, calling member for each member
// with its decoded key and the position at its value; member must read the
// value. The key may lie in the arena, so member must be done with it
// before it decodes anything.
func (d *scanner) members(member func(key []byte) bool) bool {
	if !d.enter() {
		return false
	}
	if d.peek() == '}' {
		d.pos++
		d.depth--
		return true
	}
	for {
		if d.peek() != '"' {
			return d.unexpected("a string key")
		}
		d.keyAt = d.pos
		k, ok := d.str()
		if !ok || !d.colon() || !member(d.bytes(k)) {
			return false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.pos++
			d.space()
		case '}':
			d.pos++
			d.depth--
			return true
		default:
			return d.unexpected("',' or '}' after an object member")
		}
	}
}

// elements reads the array at the position, calling elem for each element
// with its index and the position at it; elem must read the element. It
// returns the number of elements.
func (d *scanner) elements(elem func(i int) bool) (int, bool) {
	if !d.enter() {
		return 0, false
	}
	if d.peek() == ']' {
		d.pos++
		d.depth--
		return 0, true
	}
	for i := 0; ; i++ {
		if !elem(i) {
			return 0, false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.pos++
			d.space()
		case ']':
			d.pos++
			d.depth--
			return i + 1, true
		default:
			return 0, d.unexpected("',' or ']' after an array element")
		}
	}
}

// literal reads true, false or null.
func (d *scanner) literal() bool {
	var want string
	switch d.peek() {
	case 't':
		want = "true"
	case 'f':
		want = "false"
	default:
		want = "null"
	}
	if len(d.buf)-d.pos < len(want) || string(d.buf[d.pos:d.pos+len(want)]) != want {
		for i := 0; i < len(want) && d.pos < len(d.buf) && d.buf[d.pos] == want[i]; i++ {
			d.pos++
		}
		return d.unexpected("a literal " + want)
	}
	d.pos += len(want)
	return true
}

// number reads a JSON number, returning whether it is an integer: no
// fraction and no exponent.
func (d *scanner) number() (integer, ok bool) {
	b := d.buf
	i := d.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i++; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		}
	default:
		d.pos = i
		return false, d.unexpected("a digit")
	}
	integer = true
	if i < len(b) && b[i] == '.' {
		integer = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.pos = i
			return false, d.unexpected("a digit after the decimal point")
		}
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integer = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.pos = i
			return false, d.unexpected("a digit in the exponent")
		}
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		}
	}
	if digits := i - d.pos; integer && digits > maxIntDigits {
		if b[d.pos] == '-' {
			digits--
		}
		if digits > maxIntDigits {
			return false, d.fail(fmt.Sprintf("an integer of more than %d digits", maxIntDigits))
		}
	}
	d.pos = i
	return integer, true
}

// int reads a number as encoding/json stores it in an int64:
// strconv.ParseInt's rules, so no fraction, no exponent, no overflow.
// fits is false for any other number.
func (d *scanner) int() (n int64, fits, ok bool) {
	start := d.pos
	integer, ok := d.number()
	if !ok || !integer {
		return 0, false, ok
	}
	b := d.buf[start:d.pos]
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	var u uint64
	for _, c := range b {
		if u > (1<<63)/10 {
			return 0, false, true
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case neg && u <= 1<<63:
		return int64(-u), true, true
	case !neg && u < 1<<63:
		return int64(u), true, true
	}
	return 0, false, true
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// specials sets the high bit of the lowest byte of w that ends a run of
// plain string bytes: a quote, a backslash or a control character (and
// maybe of higher bytes). Bytes >= 0x80 are not flagged by it.
func specials(w uint64) uint64 {
	q := w ^ (ones * '"')
	s := w ^ (ones * '\\')
	return (((q - ones) &^ q) | ((s - ones) &^ s) | ((w - ones*0x20) &^ w)) & highs
}

// specialsOrHigh is specials with bytes >= 0x80 flagged too, which
// makes the tests for the others simpler: x-c has its high bit set for a
// byte below c, and a byte above 0x80 is flagged anyway.
func specialsOrHigh(x uint64) uint64 {
	return ((x - ones*0x20) | (x ^ (ones * '"') - ones) | (x ^ (ones * '\\') - ones) | x) & highs
}

// plain returns the index of the first byte from i on that is not plain
// ASCII string text (see specials, and bytes >= 0x80), or the index of the
// last 8 bytes to look at one by one: it goes 8 bytes at a time.
func plain(b []byte, i int) int {
	for i+8 <= len(b) {
		w := binary.LittleEndian.Uint64(b[i:])
		if m := specialsOrHigh(w); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	return i
}

// str reads the JSON string at the position and returns its text decoded
// as json.loads decodes it: escapes resolved, a surrogate pair of escapes
// as one character. Invalid UTF-8 and an escaped lone surrogate fail (see
// the file comment). A string without escapes is its own bytes in the
// body; any other is decoded into the arena.
func (d *scanner) str() (span, bool) {
	b := d.buf
	start := d.pos + 1
	i := start
	for {
		i = plain(b, i)
		if i >= len(b) {
			d.pos = i
			return span{}, d.fail("")
		}
		switch c := b[i]; {
		case c == '"':
			d.pos = i + 1
			return span{int32(start), int32(i - start)}, true
		case c == '\\':
			return d.decode(start, i)
		case c < 0x20:
			d.pos = i
			return span{}, d.fail("control character in a string")
		case c >= utf8.RuneSelf:
			size := runeLen(b, i)
			if size == 0 {
				d.pos = i
				return span{}, d.fail(errUTF8)
			}
			i += size
		default:
			i++
		}
	}
}

// The messages of the faults of strings that encoding/json would have let
// through.
const (
	errUTF8      = "invalid UTF-8 in a string"
	errSurrogate = "an escaped lone surrogate in a string"
)

// runeLen returns the length of the valid UTF-8 sequence at b[i], a byte
// >= 0x80, or 0 where utf8.DecodeRune would return RuneError for one byte.
// Two- and three-byte sequences, most of non-ASCII text, are checked here.
func runeLen(b []byte, i int) int {
	c := b[i]
	switch {
	case 0xC2 <= c && c < 0xE0:
		if i+1 < len(b) && b[i+1]&0xC0 == 0x80 {
			return 2
		}
		return 0
	case 0xE0 <= c && c < 0xF0 && i+2 < len(b):
		b1 := b[i+1]
		lo, hi := byte(0x80), byte(0xBF)
		if c == 0xE0 {
			lo = 0xA0
		} else if c == 0xED {
			hi = 0x9F // surrogates are invalid
		}
		if lo <= b1 && b1 <= hi && b[i+2]&0xC0 == 0x80 {
			return 3
		}
		return 0
	}
	if r, size := utf8.DecodeRune(b[i:]); r != utf8.RuneError || size != 1 {
		return size
	}
	return 0
}

// decode goes on with the string that began at start, whose bytes up to i
// are plain, copying it into the arena while it resolves escapes. Decoded
// text is never longer than its JSON, so with room for the rest of the
// body it writes without checks, 8 bytes at a time: a word that holds the
// end of a run of plain bytes is stored whole, and what follows the run is
// overwritten next.
func (d *scanner) decode(start, i int) (span, bool) {
	b := d.buf
	d.room()
	if need := len(b) - start + 8; cap(d.arena)-len(d.arena) < need {
		d.arena = append(make([]byte, 0, 2*cap(d.arena)+need), d.arena...)
	}
	a := len(d.arena)
	out := d.arena[:cap(d.arena)]
	w := a + copy(out[a:], b[start:i])
	for {
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(out[w:], x)
			if m := specialsOrHigh(x); m != 0 {
				n := bits.TrailingZeros64(m) >> 3
				i, w = i+n, w+n
				break
			}
			i, w = i+8, w+8
		}
		if i >= len(b) {
			d.arena, d.pos = out[:w], i
			return span{}, d.fail("")
		}
		switch c := b[i]; {
		case c == '"':
			d.arena, d.pos = out[:w], i+1
			return span{^int32(a), int32(w - a)}, true
		case c == '\\':
			if i+1 < len(b) && simpleEscape[b[i+1]] != 0 {
				// Escapes come in runs (\n\t\t): take them in a tight loop.
				out[w] = simpleEscape[b[i+1]]
				i, w = i+2, w+1
				for i+1 < len(b) && b[i] == '\\' && simpleEscape[b[i+1]] != 0 {
					out[w] = simpleEscape[b[i+1]]
					i, w = i+2, w+1
				}
				continue
			}
			r, n := escape(b[i:])
			if n <= 0 {
				d.arena, d.pos = out[:w], i
				return span{}, d.failEscape(n)
			}
			w += utf8.EncodeRune(out[w:], r)
			i += n
		case c < 0x20:
			d.arena, d.pos = out[:w], i
			return span{}, d.fail("control character in a string")
		case c >= utf8.RuneSelf:
			size := runeLen(b, i)
			if size == 0 {
				d.arena, d.pos = out[:w], i
				return span{}, d.fail(errUTF8)
			}
			i, w = i+size, w+copy(out[w:], b[i:i+size])
		default:
			out[w] = c
			i, w = i+1, w+1
		}
	}
}

// simpleEscape maps the byte after a backslash to the byte it stands for,
// 0 for u and the invalid ones.
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escape decodes the escape sequence at the start of b (b[0] is '\\') as
// json.loads does, returning the rune and the bytes it took: 0 if it is
// invalid, -1 if it is a lone surrogate (see str). A high surrogate
// followed by an escaped low one is one rune and takes 12 bytes.
func escape(b []byte) (rune, int) {
	if len(b) < 2 {
		return 0, 0
	}
	switch b[1] {
	case '"', '\\', '/':
		return rune(b[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r := hex4(b[2:])
		if r < 0 {
			return 0, 0
		}
		if !utf16.IsSurrogate(r) {
			return r, 6
		}
		if len(b) >= 12 && b[6] == '\\' && b[7] == 'u' {
			if r2 := hex4(b[8:]); r2 >= 0 {
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					return dec, 12
				}
			}
		}
		return 0, -1
	}
	return 0, 0
}

// failEscape fails on the escape at the position, which escape found
// invalid (n == 0) or a lone surrogate (n < 0).
func (d *scanner) failEscape(n int) bool {
	if n < 0 {
		return d.fail(errSurrogate)
	}
	return d.fail("invalid escape in a string")
}

// hex4 returns the value of the four hex digits that begin b, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// skipStr passes over the JSON string at the position, validating it
// without decoding it; the UTF-8 of a string with bytes >= 0x80 is checked
// once its end is found.
func (d *scanner) skipStr() bool {
	b := d.buf
	i := d.pos + 1
	var high uint64
	for {
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			if m := specials(w); m != 0 {
				n := bits.TrailingZeros64(m) >> 3
				high |= w & (1<<(8*n) - 1)
				i += n
				break
			}
			high |= w
			i += 8
		}
		if i >= len(b) {
			d.pos = i
			return d.fail("")
		}
		switch c := b[i]; {
		case c == '"':
			if high&highs != 0 && !utf8.Valid(b[d.pos+1:i]) {
				return d.fail(errUTF8)
			}
			d.pos = i + 1
			return true
		case c == '\\':
			_, n := escape(b[i:])
			if n <= 0 {
				d.pos = i
				return d.failEscape(n)
			}
			i += n
		case c < 0x20:
			d.pos = i
			return d.fail("control character in a string")
		default:
			high |= uint64(c)
			i++
		}
	}
}

// skip passes over the JSON value at the position, validating it.
// It loops rather than recursing, so that a deeply nested value costs no
// stack; d.object remembers which open containers are objects.
func (d *scanner) skip() bool {
	base := d.depth
	for {
		// A value.
		switch c := d.peek(); {
		case c == '"':
			if !d.skipStr() {
				return false
			}
		case c == '{' || c == '[':
			if !d.enter() {
				return false
			}
			bit := uint64(1) << (d.depth % 64)
			if c == '{' {
				d.object[d.depth/64] |= bit
				if d.peek() == '"' {
					if !d.key() {
						return false
					}
					continue
				}
				if d.peek() != '}' {
					return d.unexpected("a string key")
				}
			} else {
				d.object[d.depth/64] &^= bit
				if d.peek() != ']' {
					continue
				}
			}
			d.pos++
			d.depth--
		case c == 't' || c == 'f' || c == 'n':
			if !d.literal() {
				return false
			}
		case c == '-' || '0' <= c && c <= '9':
			if _, ok := d.number(); !ok {
				return false
			}
		default:
			return d.unexpected("a value")
		}
		// After a value: close containers until one has more to come.
		for {
			if d.depth == base {
				return true
			}
			d.space()
			inObject := d.object[d.depth/64]&(1<<(d.depth%64)) != 0
			c := d.peek()
			if c == ',' {
				d.pos++
				d.space()
				if inObject && !d.key() {
					return false
				}
				break
			}
			if inObject && c != '}' || !inObject && c != ']' {
				return d.unexpected("',' or the end of the container")
			}
			d.pos++
			d.depth--
		}
	}
}

// key passes over an object key and its colon inside skip, leaving the
// position at the member's value.
func (d *scanner) key() bool {
	if d.peek() != '"' {
		return d.unexpected("a string key")
	}
	return d.skipStr() && d.colon()
}

// colon reads the colon after an object key, and the space around it.
func (d *scanner) colon() bool {
	d.space()
	if d.peek() != ':' {
		return d.unexpected("':' after an object key")
	}
	d.pos++
	d.space()
	return true
}
