package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// The wire format of a Batch. It is binary because most of a message is
// block hashes, 8 random bytes each that no text encoding shortens (JSON
// would spend about 20 characters on one and a parse on each), and because
// a replica decodes its every peer's every event: at the rate a fleet
// routes, decoding must cost little. Integers are varints (zigzag for
// signed ones), hashes fixed 8 bytes little-endian. Backend names are
// written once per batch in a table that events index.
//
//	"KR" version(1) kind
//	replica(str) incarnation(uv) seq(uv) sent_at(v) block_chars(uv)
//	names: n(uv) str...
//	events: n(uv), each: kind(1) name_index(uv) then
//	  Routed:  request(uv) load(5 v) claim hashes
//	  Changed: request(uv) load(5 v)
//	  Report:  load(5 v)
//	  Learned: claim hashes
//	str = len(uv) bytes; hashes = n(uv) n*8 bytes
//	claim = session(8), and unless it is 0: epoch(uv) at(v) by(8)
//
// Version 2 added the claim's epoch, time and replica (version 1 carried
// the session hash alone): replicas of the two versions refuse each
// other's messages (counted malformed) and route on their own state.
//
// Decode never trusts a length it has not checked against the bytes left.
const (
	wireVersion = 2
	// MaxNameLen bounds a backend name or replica ID on the wire.
	MaxNameLen = 1024
	// maxNames bounds a batch's name table.
	maxNames = 1 << 16
)

// Append encodes b onto dst.
func Append(dst []byte, b *Batch) []byte {
	dst = append(dst, 'K', 'R', wireVersion, byte(b.Kind))
	dst = appendString(dst, b.Replica)
	dst = binary.AppendUvarint(dst, b.Incarnation)
	dst = binary.AppendUvarint(dst, b.Seq)
	dst = binary.AppendVarint(dst, b.SentAt)
	dst = binary.AppendUvarint(dst, uint64(b.BlockChars))
	// The name table: events of one batch mostly name few backends.
	var names []string
	index := func(name string) int {
		for i, n := range names {
			if n == name {
				return i
			}
		}
		names = append(names, name)
		return len(names) - 1
	}
	idx := make([]int, len(b.Events))
	for i := range b.Events {
		idx[i] = index(b.Events[i].Backend)
	}
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, n := range names {
		dst = appendString(dst, n)
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Events)))
	for i := range b.Events {
		e := &b.Events[i]
		dst = append(dst, byte(e.Kind))
		dst = binary.AppendUvarint(dst, uint64(idx[i]))
		if e.Kind == Routed || e.Kind == Changed {
			dst = binary.AppendUvarint(dst, e.Request)
		}
		if e.Kind != Learned && e.Kind != Stored {
			dst = appendLoad(dst, e.Load)
		}
		if e.Kind == Routed || e.Kind == Learned || e.Kind == Stored {
			dst = appendClaim(dst, e.Claim)
			dst = binary.AppendUvarint(dst, uint64(len(e.Hashes)))
			for _, h := range e.Hashes {
				dst = binary.LittleEndian.AppendUint64(dst, h)
			}
		}
	}
	return dst
}

// Size is an upper bound of the bytes Append adds for e beyond the batch
// header, for cutting batches under a message size limit.
func Size(e *Event) int {
	return 1 + 10 + 5*10 + 8 + 10 + 10 + 8 + 10 + 8*len(e.Hashes) + len(e.Backend) + 10
}

func appendClaim(dst []byte, c policy.Claim) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, c.Session)
	if c.Session == 0 {
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(c.Epoch))
	dst = binary.AppendVarint(dst, c.At)
	return binary.LittleEndian.AppendUint64(dst, c.By)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendLoad(dst []byte, l fleet.Load) []byte {
	dst = binary.AppendVarint(dst, l.InFlight)
	dst = binary.AppendVarint(dst, l.PendingPrefill)
	dst = binary.AppendVarint(dst, l.Decoding)
	dst = binary.AppendVarint(dst, l.DecodeBudget)
	return binary.AppendVarint(dst, l.DecodeTokens)
}

// ErrMalformed is wrapped by every Decode error.
var ErrMalformed = errors.New("malformed sync message")

// Decode parses one message into b, reusing b's slices. The events' hashes
// share one new backing array (they outlive b's reuse only if the caller
// keeps them). A malformed message is an error wrapping ErrMalformed, never
// a panic, whatever the bytes.
func Decode(p []byte, b *Batch) error {
	d := decoder{p: p}
	if len(p) < 4 || p[0] != 'K' || p[1] != 'R' {
		return fmt.Errorf("%w: no header", ErrMalformed)
	}
	if p[2] != wireVersion {
		return fmt.Errorf("%w: version %d (want %d)", ErrMalformed, p[2], wireVersion)
	}
	b.Kind = BatchKind(p[3])
	if b.Kind == 0 || b.Kind > maxBatchKind {
		return fmt.Errorf("%w: batch kind %d", ErrMalformed, p[3])
	}
	d.pos = 4
	b.Replica = d.str()
	b.Incarnation = d.uvarint()
	b.Seq = d.uvarint()
	b.SentAt = d.varint()
	bc := d.uvarint()
	if bc > 1<<20 {
		d.fail("block_chars")
	}
	b.BlockChars = int(bc)
	nn := d.count(1, maxNames)
	names := make([]string, 0, nn)
	for range nn {
		names = append(names, d.str())
	}
	// Each event takes at least 2 bytes.
	ne := d.count(2, len(p))
	b.Events = b.Events[:0]
	var hashes []uint64
	for range ne {
		if d.err != nil {
			break
		}
		var e Event
		e.Kind = Kind(d.byte())
		if e.Kind == 0 || e.Kind > maxKind {
			d.fail("event kind")
			break
		}
		i := d.uvarint()
		if i >= uint64(len(names)) {
			d.fail("backend index")
			break
		}
		e.Backend = names[i]
		if e.Kind == Routed || e.Kind == Changed {
			e.Request = d.uvarint()
		}
		if e.Kind != Learned && e.Kind != Stored {
			e.Load = fleet.Load{InFlight: d.varint(), PendingPrefill: d.varint(), Decoding: d.varint(), DecodeBudget: d.varint(), DecodeTokens: d.varint()}
		}
		if e.Kind == Routed || e.Kind == Learned || e.Kind == Stored {
			e.Claim = d.claim()
			n := d.count(8, len(p))
			if hashes == nil && n > 0 {
				// One backing array for the whole batch: at most what the
				// bytes left can hold.
				hashes = make([]uint64, 0, (len(p)-d.pos)/8)
			}
			start := len(hashes)
			for range n {
				hashes = append(hashes, d.fixed64())
			}
			e.Hashes = hashes[start:len(hashes):len(hashes)]
		}
		b.Events = append(b.Events, e)
	}
	if d.err == nil && d.pos != len(p) {
		d.fail("trailing bytes")
	}
	return d.err
}

// claim reads a claim (see Append).
func (d *decoder) claim() policy.Claim {
	c := policy.Claim{Session: d.fixed64()}
	if c.Session == 0 {
		return c
	}
	epoch := d.uvarint()
	if epoch > math.MaxUint32 {
		d.fail("claim epoch")
	}
	c.Epoch, c.At, c.By = uint32(epoch), d.varint(), d.fixed64()
	return c
}

// decoder reads p from pos; the first failure sticks and every later read
// returns zero.
type decoder struct {
	p   []byte
	pos int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s at byte %d", ErrMalformed, what, d.pos)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || d.pos >= len(d.p) {
		d.fail("byte")
		return 0
	}
	d.pos++
	return d.p[d.pos-1]
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p[d.pos:])
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.pos += n
	return v
}

// varint reads a zigzag varint, as binary.AppendVarint writes it.
func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) fixed64() uint64 {
	if d.err != nil || len(d.p)-d.pos < 8 {
		d.fail("fixed64")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.p[d.pos:])
	d.pos += 8
	return v
}

// count reads a length of items of at least each bytes, no more than
// limit, and checks that the bytes left can hold them.
func (d *decoder) count(each, limit int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(limit) || n*uint64(each) > uint64(len(d.p)-d.pos) {
		d.fail("length")
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.count(1, MaxNameLen)
	if d.err != nil {
		return ""
	}
	s := string(d.p[d.pos : d.pos+n])
	d.pos += n
	return s
}
