package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// The guard: every KV-event socket's connections pass through a reader
// that parses the peer's ZMTP 3 stream itself (the 64-byte greeting, then
// frames: a flags byte and a 1- or 8-byte length, command frames included)
// and hands zmq4 a unit only once it has arrived whole and within limits.
// zmq4 v0.17.0 allocates a frame's declared length before reading it (a
// declared 2^62 bytes panics in make, a few GiB are allocated at once) and
// parses a READY command's metadata with unchecked slicing (a malformed
// property panics), both in goroutines that read from the network, where a
// panic ends the process. Through the guard, zmq4 only ever sees:
//
//   - a greeting with ZMTP's signature and a major version of at least 3;
//   - frames of at most the socket's MaxMessageBytes, in messages (frames
//     chained by the MORE flag) whose frames total at most that too and
//     number at most maxFrames, each frame's bytes already received (so
//     zmq4's allocation follows what the peer sent, never what it claims);
//   - commands that are single frames with a well-formed name, and READY
//     commands whose metadata properties all lie within the command and
//     whose Socket-Type, as zmq4 reads it, is a socket type zmq4 knows
//     (it panics on any other);
//   - a handshake (greeting and READY) finished within handshakeTimeout of
//     the connection, which also bounds how long a silent peer holds
//     zmq4's accept loop (it handshakes one connection at a time).
//
// Anything else closes the connection with an error zmq4 treats as a lost
// connection, and is reported to the socket's owner (Refused). The checks
// are libzmq's ZMQ_MAXMSGSIZE, applied before zmq4 allocates; the guard
// wraps the net.Conn of a zmq4 transport registered under its own names
// (kvtcp, kvipc), so it holds whatever zmq4 does with the bytes.

// DefaultMaxMessageBytes is the default bound on one KV-event message: 16
// MiB. vLLM publishes one batch per engine step, whose events cover at
// most the step's max_num_batched_tokens (8,192 by default) in stored and
// removed blocks: 6.2 to 7.4 bytes a token with 8-byte block hashes
// (measured with Encode), about 3 more with vLLM's 32-byte ones, so some
// 80 KiB at the default and 1.3 MiB for a step of 131,072 tokens. 16 MiB
// leaves room for 1.6 million tokens a step.
const DefaultMaxMessageBytes = 16 << 20

// maxFrames bounds the frames of one message: a KV-event message has 3, a
// replay's 2 to 4, a subscription 1. Each frame costs zmq4 a slice header
// even when empty, so the count is bounded as well as the bytes.
const maxFrames = 16

// handshakeTimeout bounds a connection's ZMTP handshake (libzmq's
// ZMQ_HANDSHAKE_IVL, whose default is 30 s; loopback and LAN peers finish
// in milliseconds).
const handshakeTimeout = 10 * time.Second

// greetingLen is the length of a ZMTP 3 greeting.
const greetingLen = 64

// ZMTP frame flags.
const (
	flagMore    = 0x1
	flagLong    = 0x2
	flagCommand = 0x4
)

func init() {
	for name, network := range map[string]string{guardedTCP: "tcp", guardedIPC: "unix"} {
		if err := zmq4.RegisterTransport(name, guardedTransport{transport.New(network)}); err != nil {
			panic(err)
		}
	}
}

// The guarded transports' names: endpoint maps tcp:// and ipc:// to them.
const (
	guardedTCP = "kvtcp"
	guardedIPC = "kvipc"
)

// guard is one socket's limits and the connections it guards. The socket
// carries it in its context, which zmq4 passes to the transport.
type guard struct {
	max       int64
	handshake time.Duration // handshakeTimeout; shorter in tests
	refused   func(error)   // called for each refused connection; may be nil

	mu   sync.Mutex
	live map[*guardConn]struct{}
	lost chan struct{} // signalled when a live connection closes
}

type guardKey struct{}

// newGuard returns a guard with max bytes a message (DefaultMaxMessageBytes
// when max <= 0).
func newGuard(max int, refused func(error)) *guard {
	if max <= 0 {
		max = DefaultMaxMessageBytes
	}
	return &guard{max: int64(max), handshake: handshakeTimeout, refused: refused, live: map[*guardConn]struct{}{}, lost: make(chan struct{}, 1)}
}

// context returns ctx carrying g, for the zmq4 socket g guards.
func (g *guard) context(ctx context.Context) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

func guardOf(ctx context.Context) *guard {
	if g, ok := ctx.Value(guardKey{}).(*guard); ok {
		return g
	}
	return newGuard(0, nil)
}

// endpoint maps a tcp:// or ipc:// endpoint to the guarded transport's.
func endpoint(ep string) string {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		return guardedTCP + ep[len("tcp"):]
	case strings.HasPrefix(ep, "ipc://"):
		return guardedIPC + ep[len("ipc"):]
	}
	return ep
}

// count returns how many of g's connections are open.
func (g *guard) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.live)
}

// closeAll closes g's open connections: those zmq4 holds, and those it
// dropped without closing (a handshake that failed in Dial or accept).
func (g *guard) closeAll() {
	g.mu.Lock()
	conns := make([]*guardConn, 0, len(g.live))
	for c := range g.live {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (g *guard) wrap(c net.Conn) *guardConn {
	gc := &guardConn{Conn: c, g: g}
	_ = c.SetReadDeadline(time.Now().Add(g.handshake))
	g.mu.Lock()
	g.live[gc] = struct{}{}
	g.mu.Unlock()
	return gc
}

func (g *guard) remove(c *guardConn) {
	g.mu.Lock()
	delete(g.live, c)
	g.mu.Unlock()
	select {
	case g.lost <- struct{}{}:
	default:
	}
}

// guardedTransport is a zmq4 transport whose connections are guarded.
type guardedTransport struct{ base transport.Transport }

func (t guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.base.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return guardOf(ctx).wrap(c), nil
}

func (t guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.base.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return guardListener{l, guardOf(ctx)}, nil
}

func (t guardedTransport) Addr(ep string) (string, error) { return t.base.Addr(ep) }

type guardListener struct {
	net.Listener
	g *guard
}

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.g.wrap(c), nil
}

// RefusedError says why the guard closed a connection. It is a net.Error
// that is not a timeout, which zmq4 takes for a lost connection.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string   { return "kvevents: connection refused: " + e.Reason }
func (e *RefusedError) Timeout() bool   { return false }
func (e *RefusedError) Temporary() bool { return false }

var _ net.Error = (*RefusedError)(nil)

// guardConn is a guarded connection. Read is called by one goroutine at a
// time (zmq4's handshake, then its reader), so its state needs no lock.
type guardConn struct {
	net.Conn
	g       *guard
	pending []byte // checked bytes zmq4 has not read yet
	err     error  // once set, every Read returns it
	greeted bool   // the greeting has been checked
	ready   bool   // a command (the handshake's READY) has been checked
	more    bool   // the last frame had MORE: the next continues its message
	frames  int    // frames of the message so far
	bytes   int64  // bytes of the message so far
	once    sync.Once
}

func (c *guardConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if err := c.next(); err != nil {
			c.err = err
			return 0, err
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	if len(c.pending) == 0 {
		c.pending = nil // a large frame's buffer is zmq4's copy now
	}
	return n, nil
}

func (c *guardConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.Conn.Close()
		c.g.remove(c)
	})
	return err
}

// next reads and checks the next unit (the greeting or a frame) into
// pending.
func (c *guardConn) next() error {
	if !c.greeted {
		b := make([]byte, greetingLen)
		if _, err := io.ReadFull(c.Conn, b); err != nil {
			return c.readErr(err)
		}
		if b[0] != 0xff || b[9] != 0x7f || b[10] < 3 {
			return c.refuse("not a ZMTP 3 greeting")
		}
		c.greeted, c.pending = true, b
		return nil
	}
	var hdr [9]byte
	if _, err := io.ReadFull(c.Conn, hdr[:2]); err != nil {
		return c.readErr(err)
	}
	flags, n, size := hdr[0], 2, uint64(hdr[1])
	if flags&flagLong != 0 {
		if _, err := io.ReadFull(c.Conn, hdr[2:]); err != nil {
			return c.readErr(err)
		}
		n, size = 9, binary.BigEndian.Uint64(hdr[1:])
	}
	cmd := flags&flagCommand != 0
	if cmd && (flags&flagMore != 0 || c.more) {
		return c.refuse("a command inside a multipart message")
	}
	if !c.more {
		c.frames, c.bytes = 0, 0
	}
	switch {
	case size > uint64(c.g.max):
		return c.refuse(fmt.Sprintf("a frame of %d bytes, beyond the %d-byte limit", size, c.g.max))
	case c.bytes+int64(size) > c.g.max:
		return c.refuse(fmt.Sprintf("a message of more than %d bytes", c.g.max))
	case c.frames >= maxFrames:
		return c.refuse(fmt.Sprintf("a message of more than %d frames", maxFrames))
	}
	buf, err := readGrowing(c.Conn, hdr[:n], int(size))
	if err != nil {
		return c.readErr(err)
	}
	if cmd {
		if err := checkCommand(buf[n:]); err != nil {
			return c.refuse(err.Error())
		}
		if !c.ready {
			c.ready = true
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	c.frames++
	c.bytes += int64(size)
	c.more = flags&flagMore != 0
	c.pending = buf
	return nil
}

// readGrowing appends size bytes from r to prefix, growing the buffer as
// they arrive rather than by the declared size.
func readGrowing(r io.Reader, prefix []byte, size int) ([]byte, error) {
	buf := make([]byte, len(prefix), len(prefix)+min(size, 64<<10))
	copy(buf, prefix)
	for left := size; left > 0; {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), len(buf)+min(left, len(buf)))
			copy(grown, buf)
			buf = grown
		}
		chunk := min(left, cap(buf)-len(buf))
		if _, err := io.ReadFull(r, buf[len(buf):len(buf)+chunk]); err != nil {
			return nil, err
		}
		buf = buf[:len(buf)+chunk]
		left -= chunk
	}
	return buf, nil
}

// checkCommand checks a command frame's body: a name length and name, and
// for READY, metadata properties (a name length and name, a 4-byte value
// length and value) that each lie within the body, the last whose name
// zmq4 title-cases to Socket-Type (zmq4 keeps the last) naming a socket
// type zmq4 knows.
func checkCommand(body []byte) error {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return errors.New("a malformed command")
	}
	name, p := string(body[1:1+int(body[0])]), body[1+int(body[0]):]
	if name != zmq4.CmdReady {
		return nil
	}
	title := cases.Title(language.Und, cases.NoLower)
	sockType := ""
	for len(p) > 0 {
		k := int(p[0])
		if len(p) < 1+k+4 {
			return errors.New("a malformed READY property name")
		}
		key := p[1 : 1+k]
		v := binary.BigEndian.Uint32(p[1+k:])
		p = p[1+k+4:]
		if uint64(v) > uint64(len(p)) {
			return errors.New("a READY property value beyond the command")
		}
		if title.String(string(key)) == "Socket-Type" {
			sockType = string(p[:v])
		}
		p = p[v:]
	}
	switch zmq4.SocketType(sockType) {
	case zmq4.Pair, zmq4.Pub, zmq4.Sub, zmq4.Req, zmq4.Rep, zmq4.Dealer, zmq4.Router, zmq4.Pull, zmq4.Push, zmq4.XPub, zmq4.XSub:
		return nil
	}
	return fmt.Errorf("a READY with an unknown Socket-Type %q", sockType)
}

// readErr returns the error of a read from the peer: a handshake past its
// deadline is refused; an end of stream in the middle of a unit is io.EOF,
// which zmq4 takes for a lost connection (it does not know
// io.ErrUnexpectedEOF).
func (c *guardConn) readErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !c.ready {
		return c.refuse(fmt.Sprintf("no ZMTP handshake in %v", c.g.handshake))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return io.EOF
	}
	return err
}

// refuse closes the connection and reports why.
func (c *guardConn) refuse(reason string) error {
	err := &RefusedError{Reason: reason + " from " + c.RemoteAddr().String()}
	_ = c.Close()
	if c.g.refused != nil {
		c.g.refused(err)
	}
	return err
}
