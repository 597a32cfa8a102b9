package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The wire form, after vLLM's vllm/distributed/kv_events.py (msgspec
// structs with omit_defaults and tag=True, the tag field being "type") and
// SGLang's python/sglang/srt/disaggregation/kv_events.py, which keeps the
// older all-positional form:
//
//	batch            [ts, events, data_parallel_rank]   (rank omitted when None)
//	                 or {"ts", "events", "data_parallel_rank"}
//	current event    {"type": "BlockStored", "block_hashes", "parent_block_hash",
//	                  "token_ids", "block_size", "lora_id", "medium", "lora_name",
//	                  "extra_keys"?, ...}
//	                 {"type": "BlockRemoved", "block_hashes", "medium", ...}
//	                 {"type": "AllBlocksCleared"}
//	legacy event     ["BlockStored", block_hashes, parent_block_hash, token_ids,
//	                  block_size, lora_id, medium, lora_name, extra_keys, ...]
//	                 ["BlockRemoved", block_hashes, medium, ...]
//	                 ["AllBlocksCleared"]
//
// The legacy form is vLLM's up to 0.23 (array_like events) and SGLang's
// (which stops BlockStored after lora_id and BlockRemoved after
// block_hashes); the current form is vLLM's since its events became maps
// (its wire-contract test: the batch stays positional, each event a map
// whose required fields are always present, possibly nil, and whose
// optional ones are omitted when unset). A block hash is an int (int64 or
// uint64 on the wire, vLLM's ExternalBlockHash) or bytes (vLLM's sha256
// hash modes), which Decode folds to a uint64 with xxhash.

// Encoding is the shape Encode gives events.
type Encoding uint8

const (
	// Current encodes each event as a map with a "type" key.
	Current Encoding = iota
	// Legacy encodes each event as a positional array, tag first.
	Legacy
)

func (e Encoding) String() string {
	if e == Legacy {
		return "legacy"
	}
	return "current"
}

// ParseEncoding reads "current" or "legacy".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "current":
		return Current, nil
	case "legacy":
		return Legacy, nil
	}
	return 0, fmt.Errorf("kvevents: unknown encoding %q (want current or legacy)", s)
}

// Field names and tags on the wire.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// Decode parses one message payload. It accepts both event shapes (also
// mixed in one batch), a positional or map-shaped batch, block hashes as
// ints or bytes, and ignores what it does not know: unknown map keys,
// extra trailing elements, events of another type. Anything else that is
// not the protocol is an error; Decode never panics, and what it allocates
// is bounded by a small multiple of len(payload) (a declared length longer
// than the bytes left is an error before anything is allocated for it).
//
// The returned batch shares nothing with payload, so the caller may reuse
// payload; events' BlockHashes and TokenIDs are views of one slice each per
// batch, capped so that appending to one never overwrites another.
func Decode(payload []byte) (Batch, error) {
	d := decoders.Get().(*decoder)
	defer d.release()
	d.reset(payload)
	b, err := d.batch()
	if err == nil && d.r.Len() > 0 {
		err = fmt.Errorf("%d bytes after the batch", d.r.Len())
	}
	if err != nil {
		return Batch{}, fmt.Errorf("kvevents: decode: %w", err)
	}
	return b, nil
}

var decoders = sync.Pool{New: func() any {
	d := &decoder{}
	d.d = msgpack.NewDecoder(&d.r)
	return d
}}

// decoder is one Decode's state, pooled. Hashes, token ids and raw extra
// keys of every event are appended to one arena each, then copied out once
// per batch.
type decoder struct {
	buf    []byte
	r      bytes.Reader // the msgpack decoder reads it directly (it is an io.ByteScanner), so r's position is the decoder's
	d      *msgpack.Decoder
	hashes []uint64
	tokens []uint32
	extra  []byte
	spans  []spans
}

// spans locates one event's slices in the arenas; extra keys are spans of
// d.extra, one per block, -1 start for nil.
type spans struct {
	h0, h1, t0, t1 int
	x              []span
	hasExtra       bool
}

type span struct{ lo, hi int }

func (d *decoder) reset(p []byte) {
	d.buf = p
	d.r.Reset(p)
	d.d.Reset(&d.r)
	d.hashes, d.tokens, d.extra, d.spans = d.hashes[:0], d.tokens[:0], d.extra[:0], d.spans[:0]
}

func (d *decoder) release() {
	d.buf = nil
	d.r.Reset(nil)
	if cap(d.hashes) > 1<<16 || cap(d.tokens) > 1<<18 || cap(d.extra) > 1<<20 || cap(d.spans) > 1<<12 {
		return // do not keep a huge batch's arenas alive in the pool
	}
	decoders.Put(d)
}

func (d *decoder) pos() int { return len(d.buf) - d.r.Len() }

var errNotNumber = errors.New("not a number")

// length checks a declared array or map length against the bytes left:
// every element takes at least one byte. n is -1 for nil.
func (d *decoder) length(n, perElem int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n > d.r.Len()/perElem {
		return 0, fmt.Errorf("declared length %d exceeds the %d bytes left", n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) arrayLen() (int, error) {
	n, err := d.d.DecodeArrayLen()
	return d.length(n, 1, err)
}

func (d *decoder) mapLen() (int, error) {
	n, err := d.d.DecodeMapLen()
	return d.length(n, 2, err)
}

func (d *decoder) peek() (byte, error) { return d.d.PeekCode() }

// bytesValue returns a str or bin value as a view of the payload, nil for
// nil.
func (d *decoder) bytesValue() ([]byte, error) {
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > d.r.Len() {
		return nil, fmt.Errorf("string of %d bytes exceeds the %d bytes left", n, d.r.Len())
	}
	p := d.pos()
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return d.buf[p : p+n : p+n], nil
}

// isBytes reports whether c starts a str or bin value.
func isBytes(c byte) bool { return msgpcode.IsString(c) || msgpcode.IsBin(c) }

// key reads a map key: a string as a view, or nil after skipping a key of
// another type (which no known field has).
func (d *decoder) key() ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if isBytes(c) {
		return d.bytesValue()
	}
	return nil, d.skip()
}

// str reads an optional string: "" for nil. The two media vLLM sends are
// constants, so that decoding them allocates nothing.
func (d *decoder) str() (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", d.d.Skip()
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("code %#x where a string belongs", c)
	}
	b, err := d.bytesValue()
	switch string(b) {
	case "GPU":
		return "GPU", err
	case "CPU":
		return "CPU", err
	}
	return string(b), err
}

// integer reads an optional int: ok false for nil.
func (d *decoder) integer() (n int64, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, d.d.Skip()
	}
	if !isInt(c) {
		return 0, false, fmt.Errorf("code %#x where an int belongs: %w", c, errNotNumber)
	}
	n, err = d.d.DecodeInt64()
	return n, err == nil, err
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

// hash reads one block hash: an int (its 64 bits as they are), bytes
// (folded with xxhash) or nil (ok false).
func (d *decoder) hash() (h uint64, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, d.d.Skip()
	case isInt(c):
		h, err = d.d.DecodeUint64()
		return h, err == nil, err
	case isBytes(c):
		b, err := d.bytesValue()
		return xxhash.Sum64(b), err == nil, err
	}
	return 0, false, fmt.Errorf("code %#x where a block hash belongs", c)
}

// hashList appends a list of block hashes to the arena; nil is empty.
func (d *decoder) hashList() (lo, hi int, err error) {
	lo = len(d.hashes)
	n, err := d.arrayLen()
	if err != nil {
		return lo, lo, fmt.Errorf("block_hashes: %w", err)
	}
	for range n {
		h, ok, err := d.hash()
		if err != nil {
			return lo, lo, fmt.Errorf("block_hashes: %w", err)
		}
		if !ok {
			return lo, lo, errors.New("block_hashes: nil hash")
		}
		d.hashes = append(d.hashes, h)
	}
	return lo, len(d.hashes), nil
}

// tokenList appends a list of token ids to the arena; nil is empty.
func (d *decoder) tokenList() (lo, hi int, err error) {
	lo = len(d.tokens)
	n, err := d.arrayLen()
	if err != nil {
		return lo, lo, fmt.Errorf("token_ids: %w", err)
	}
	for range n {
		c, err := d.peek()
		if err != nil {
			return lo, lo, fmt.Errorf("token_ids: %w", err)
		}
		if !isInt(c) {
			return lo, lo, fmt.Errorf("token_ids: code %#x where a token id belongs", c)
		}
		id, err := d.d.DecodeInt64()
		if err != nil {
			return lo, lo, fmt.Errorf("token_ids: %w", err)
		}
		if id < 0 || id > math.MaxUint32 {
			return lo, lo, fmt.Errorf("token_ids: %d out of range", id)
		}
		d.tokens = append(d.tokens, uint32(id))
	}
	return lo, len(d.tokens), nil
}

// extraKeys copies extra_keys' entries, raw, to the arena.
func (d *decoder) extraKeys(s *spans) error {
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("extra_keys: %w", err)
	}
	s.x, s.hasExtra = s.x[:0], n >= 0
	for range n {
		c, err := d.peek()
		if err != nil {
			return fmt.Errorf("extra_keys: %w", err)
		}
		if c == msgpcode.Nil {
			s.x = append(s.x, span{-1, -1})
			if err := d.d.Skip(); err != nil {
				return err
			}
			continue
		}
		p := d.pos()
		if err := d.skip(); err != nil {
			return fmt.Errorf("extra_keys: %w", err)
		}
		lo := len(d.extra)
		d.extra = append(d.extra, d.buf[p:d.pos()]...)
		s.x = append(s.x, span{lo, len(d.extra)})
	}
	return nil
}

// skip skips one value of any shape without recursion, so that deeply
// nested garbage cannot exhaust the stack.
func (d *decoder) skip() error {
	for left := 1; left > 0; left-- {
		c, err := d.peek()
		if err != nil {
			return err
		}
		switch {
		case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
			n, err := d.arrayLen()
			if err != nil {
				return err
			}
			left += max(n, 0)
		case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
			n, err := d.mapLen()
			if err != nil {
				return err
			}
			left += 2 * max(n, 0)
		case isBytes(c):
			if _, err := d.bytesValue(); err != nil {
				return err
			}
		case msgpcode.IsExt(c):
			if err := d.skipExt(c); err != nil {
				return err
			}
		default:
			if err := d.d.Skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

// skipExt skips an ext value (code, length, type, data) by moving the
// reader, after checking its length against the bytes left: the msgpack
// decoder's own Skip reads it into a buffer that it keeps and grows by up
// to a megabyte per oversized value, which a stream of garbage would grow
// without bound.
func (d *decoder) skipExt(c byte) error {
	rest := d.buf[d.pos():]
	var total int
	switch c {
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		total = 2 + 1<<(c-msgpcode.FixExt1)
	case msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
		w := 1 << (c - msgpcode.Ext8) // bytes of the length
		if len(rest) < 1+w {
			return io.ErrUnexpectedEOF
		}
		var n int
		for _, b := range rest[1 : 1+w] {
			n = n<<8 | int(b)
		}
		total = 2 + w + n
	}
	if total > len(rest) {
		return fmt.Errorf("ext of %d bytes exceeds the %d bytes left", total, len(rest))
	}
	_, err := d.r.Seek(int64(total), io.SeekCurrent)
	return err
}

// skipN skips n values.
func (d *decoder) skipN(n int) error {
	for range n {
		if err := d.skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) batch() (Batch, error) {
	b := Batch{DPRank: -1}
	c, err := d.peek()
	if err != nil {
		return b, err
	}
	var sawEvents bool
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.arrayLen()
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, fmt.Errorf("batch array of %d elements, want [ts, events, ...]", n)
		}
		if b.TS, err = d.d.DecodeFloat64(); err != nil {
			return b, fmt.Errorf("ts: %w", err)
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		sawEvents = true
		if n >= 3 {
			if b.DPRank, err = d.rank(); err != nil {
				return b, err
			}
		}
		if err := d.skipN(n - 3); err != nil {
			return b, err
		}
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.mapLen()
		if err != nil {
			return b, err
		}
		for range n {
			k, err := d.key()
			if err != nil {
				return b, err
			}
			switch string(k) {
			case "ts":
				b.TS, err = d.d.DecodeFloat64()
			case "events":
				// A repeated key replaces the list, and its spans.
				d.spans = d.spans[:0]
				b.Events, err = d.events()
				sawEvents = true
			case "data_parallel_rank":
				b.DPRank, err = d.rank()
			default:
				err = d.skip()
			}
			if err != nil {
				return b, fmt.Errorf("batch %q: %w", k, err)
			}
		}
	default:
		return b, fmt.Errorf("code %#x where a batch belongs", c)
	}
	if !sawEvents {
		return b, errors.New("batch without events")
	}
	d.fixup(b.Events)
	return b, nil
}

// rank reads data_parallel_rank: -1 for nil or a negative number.
func (d *decoder) rank() (int, error) {
	r, ok, err := d.integer()
	if err != nil {
		return -1, fmt.Errorf("data_parallel_rank: %w", err)
	}
	if !ok || r < 0 || r > math.MaxInt32 {
		return -1, nil
	}
	return int(r), nil
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	if n <= 0 {
		return nil, nil
	}
	evs := make([]Event, 0, min(n, 256))
	for i := range n {
		if len(d.spans) == cap(d.spans) {
			d.spans = append(d.spans, spans{})
		} else {
			d.spans = d.spans[:len(d.spans)+1]
		}
		s := &d.spans[len(d.spans)-1]
		x := s.x[:0]
		*s = spans{x: x}
		ev, ok, err := d.event(s)
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if !ok {
			d.spans = d.spans[:len(d.spans)-1]
			continue
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// event reads one event of either shape; ok is false for an event of a
// type this package does not know, which is skipped.
func (d *decoder) event(s *spans) (ev Event, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return ev, false, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return d.positional(s)
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return d.keyed(s)
	}
	return ev, false, fmt.Errorf("code %#x where an event belongs", c)
}

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case tagStored:
		return BlockStored
	case tagRemoved:
		return BlockRemoved
	case tagCleared:
		return AllBlocksCleared
	}
	return 0
}

// positional reads a legacy event: [tag, fields in declaration order...].
func (d *decoder) positional(s *spans) (ev Event, ok bool, err error) {
	n, err := d.arrayLen()
	if err != nil {
		return ev, false, err
	}
	if n < 1 {
		return ev, false, errors.New("empty event array")
	}
	c, err := d.peek()
	if err != nil {
		return ev, false, err
	}
	if !msgpcode.IsString(c) {
		return ev, false, fmt.Errorf("event tag of code %#x", c)
	}
	tag, err := d.bytesValue()
	if err != nil {
		return ev, false, err
	}
	ev.Kind = kindOf(tag)
	var fields []string
	switch ev.Kind {
	case BlockStored:
		fields = storedFields[:]
		if n < 5 {
			return ev, false, fmt.Errorf("BlockStored of %d elements, want at least 5", n)
		}
	case BlockRemoved:
		fields = removedFields[:]
		if n < 2 {
			return ev, false, fmt.Errorf("BlockRemoved of %d elements, want at least 2", n)
		}
	case AllBlocksCleared:
	default:
		return ev, false, d.skipN(n - 1)
	}
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(fields) {
			name = fields[i-1]
		}
		if err := d.field(&ev, s, name); err != nil {
			return ev, false, fmt.Errorf("%v %s: %w", ev.Kind, name, err)
		}
	}
	return ev, true, nil
}

// storedFields and removedFields are the legacy positional order after the
// tag (vLLM's struct field order).
var (
	storedFields  = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"}
	removedFields = [...]string{"block_hashes", "medium"}
)

// keyed reads a current event: a map with "type".
func (d *decoder) keyed(s *spans) (ev Event, ok bool, err error) {
	n, err := d.mapLen()
	if err != nil {
		return ev, false, err
	}
	var tag []byte
	for range n {
		k, err := d.key()
		if err != nil {
			return ev, false, err
		}
		if string(k) == "type" {
			c, err := d.peek()
			if err != nil {
				return ev, false, err
			}
			if !msgpcode.IsString(c) {
				return ev, false, fmt.Errorf("event type of code %#x", c)
			}
			if tag, err = d.bytesValue(); err != nil {
				return ev, false, err
			}
			continue
		}
		if err := d.field(&ev, s, string(k)); err != nil {
			return ev, false, fmt.Errorf("event %q: %w", k, err)
		}
	}
	if tag == nil {
		return ev, false, errors.New("event map without \"type\"")
	}
	ev.Kind = kindOf(tag)
	switch ev.Kind {
	case BlockStored:
	case BlockRemoved:
		ev.TokenIDs, ev.BlockSize, ev.LoraName, ev.Parent, ev.HasParent = nil, 0, "", 0, false
		s.t0, s.t1, s.hasExtra = 0, 0, false
	case AllBlocksCleared:
		ev = Event{Kind: AllBlocksCleared}
		*s = spans{x: s.x[:0]}
	default:
		return ev, false, nil
	}
	return ev, true, nil
}

// field decodes the value of the named field into ev (unknown names are
// skipped).
func (d *decoder) field(ev *Event, s *spans, name string) error {
	var err error
	switch name {
	case "block_hashes":
		s.h0, s.h1, err = d.hashList()
	case "parent_block_hash":
		ev.Parent, ev.HasParent, err = d.hash()
	case "token_ids":
		s.t0, s.t1, err = d.tokenList()
	case "block_size":
		var n int64
		if n, _, err = d.integer(); err != nil {
			return err
		}
		if n < math.MinInt32 || n > math.MaxInt32 {
			return fmt.Errorf("block size %d out of range", n)
		}
		ev.BlockSize = int(n)
	case "medium":
		ev.Medium, err = d.str()
	case "lora_name":
		ev.LoraName, err = d.str()
	case "extra_keys":
		err = d.extraKeys(s)
	default:
		err = d.skip()
	}
	return err
}

// fixup points the events' slices into one copy of each arena.
func (d *decoder) fixup(evs []Event) {
	if len(evs) == 0 {
		return
	}
	var hashes []uint64
	var tokens []uint32
	var extra []byte
	if len(d.hashes) > 0 {
		hashes = append([]uint64(nil), d.hashes...)
	}
	if len(d.tokens) > 0 {
		tokens = append([]uint32(nil), d.tokens...)
	}
	if len(d.extra) > 0 {
		extra = append([]byte(nil), d.extra...)
	}
	for i := range evs {
		s := &d.spans[i]
		ev := &evs[i]
		if s.h1 > s.h0 {
			ev.BlockHashes = hashes[s.h0:s.h1:s.h1]
		}
		if s.t1 > s.t0 {
			ev.TokenIDs = tokens[s.t0:s.t1:s.t1]
		}
		if s.hasExtra {
			ev.ExtraKeys = make([][]byte, len(s.x))
			for j, x := range s.x {
				if x.lo >= 0 {
					ev.ExtraKeys[j] = extra[x.lo:x.hi:x.hi]
				}
			}
		}
	}
}

// Encode appends b's msgpack encoding to dst and returns it: the batch as
// [ts, events, data_parallel_rank] (the rank omitted when DPRank < 0), its
// events in the given encoding, every field vLLM always sends present
// (nil when unset: lora_id is always nil, since Event does not carry it)
// and extra_keys only when ExtraKeys is not nil. Block hashes are encoded
// as unsigned ints. Events of a Kind this package does not define are left
// out.
func Encode(dst []byte, b Batch, enc Encoding) []byte {
	w := appender{b: dst}
	e := msgpack.GetEncoder()
	defer msgpack.PutEncoder(e)
	e.Reset(&w)
	// Writes to an appender never fail, so neither does the encoder.
	n := 2
	if b.DPRank >= 0 {
		n = 3
	}
	_ = e.EncodeArrayLen(n)
	_ = e.EncodeFloat64(b.TS)
	known := 0
	for i := range b.Events {
		if k := b.Events[i].Kind; k >= BlockStored && k <= AllBlocksCleared {
			known++
		}
	}
	_ = e.EncodeArrayLen(known)
	for i := range b.Events {
		if k := b.Events[i].Kind; k >= BlockStored && k <= AllBlocksCleared {
			encodeEvent(e, &b.Events[i], enc)
		}
	}
	if b.DPRank >= 0 {
		_ = e.EncodeInt(int64(b.DPRank))
	}
	return w.b
}

func encodeEvent(e *msgpack.Encoder, ev *Event, enc Encoding) {
	var tag string
	var fields []string
	switch ev.Kind {
	case BlockStored:
		tag, fields = tagStored, storedFields[:7]
		if ev.ExtraKeys != nil {
			fields = storedFields[:8]
		}
	case BlockRemoved:
		tag, fields = tagRemoved, removedFields[:]
	default:
		tag = tagCleared
	}
	if enc == Legacy {
		_ = e.EncodeArrayLen(1 + len(fields))
		_ = e.EncodeString(tag)
	} else {
		_ = e.EncodeMapLen(1 + len(fields))
		_ = e.EncodeString("type")
		_ = e.EncodeString(tag)
	}
	for _, f := range fields {
		if enc != Legacy {
			_ = e.EncodeString(f)
		}
		switch f {
		case "block_hashes":
			_ = e.EncodeArrayLen(len(ev.BlockHashes))
			for _, h := range ev.BlockHashes {
				_ = e.EncodeUint(h)
			}
		case "parent_block_hash":
			if ev.HasParent {
				_ = e.EncodeUint(ev.Parent)
			} else {
				_ = e.EncodeNil()
			}
		case "token_ids":
			_ = e.EncodeArrayLen(len(ev.TokenIDs))
			for _, t := range ev.TokenIDs {
				_ = e.EncodeUint(uint64(t))
			}
		case "block_size":
			_ = e.EncodeInt(int64(ev.BlockSize))
		case "lora_id":
			_ = e.EncodeNil()
		case "medium":
			encodeOptString(e, ev.Medium)
		case "lora_name":
			encodeOptString(e, ev.LoraName)
		case "extra_keys":
			_ = e.EncodeArrayLen(len(ev.ExtraKeys))
			for _, x := range ev.ExtraKeys {
				if x == nil {
					_ = e.EncodeNil()
				} else {
					_, _ = e.Writer().Write(x)
				}
			}
		}
	}
}

func encodeOptString(e *msgpack.Encoder, s string) {
	if s == "" {
		_ = e.EncodeNil()
		return
	}
	_ = e.EncodeString(s)
}

// appender is the encoder's writer: it appends to a byte slice.
type appender struct{ b []byte }

func (a *appender) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
}

func (a *appender) WriteByte(c byte) error {
	a.b = append(a.b, c)
	return nil
}

// CacheSaltKeys is the extra keys of a request's first block under salt
// and no LoRA adapter or multimodal input, as vLLM encodes them: the tuple
// (salt,).
func CacheSaltKeys(salt string) []byte {
	b, _ := msgpack.Marshal([]string{salt}) // a []string always encodes
	return b
}

// CacheSalt returns the cache salt among the extra keys of a request's
// first block, raw as Event.ExtraKeys holds them, or "" for none. vLLM's
// extra keys of a block are one tuple: the LoRA adapter's name (when
// there is one), the multimodal keys, the request's cache_salt (first
// block only) and digests of prompt embeddings (bytes). The salt is the
// last string at the tuple's top level other than a leading LoRA name
// equal to lora; multimodal keys are tuples in current vLLM. Malformed
// keys give "".
func CacheSalt(raw []byte, lora string) string {
	if len(raw) == 0 {
		return ""
	}
	d := decoders.Get().(*decoder)
	defer d.release()
	d.reset(raw)
	n, err := d.arrayLen()
	if err != nil {
		return ""
	}
	salt := ""
	for i := range n {
		c, err := d.peek()
		if err != nil {
			return ""
		}
		if !msgpcode.IsString(c) {
			if d.skip() != nil {
				return ""
			}
			continue
		}
		s, err := d.str()
		if err != nil {
			return ""
		}
		if i == 0 && lora != "" && s == lora {
			continue
		}
		salt = s
	}
	return salt
}
