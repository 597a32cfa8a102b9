package kvevents

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// A raw ZMTP 3.0 peer, written byte by byte from the specification
// (rfc.zeromq.org/spec/23): the greeting, then frames.

// greeting is a ZMTP 3.0 greeting with the NULL mechanism.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// frame is one frame with flags, in the short or long form by size.
func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | flagLong}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// ready is a READY command whose metadata says the peer is sockType.
func ready(sockType string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(sockType)))
	return frame(flagCommand, append(body, sockType...))
}

// handshake is what a PUB peer sends before its first message.
func handshake() []byte { return append(greeting(), ready("PUB")...) }

// attacks are byte streams a hostile peer sends, each of which the guard
// must refuse (limit: 4,096 bytes a message).
var attacks = []struct {
	name  string
	bytes []byte
}{
	// zmq4 v0.17.0 calls make([]byte, 1<<62): panic: makeslice: len out
	// of range.
	{"frame of 2^62 bytes", append(handshake(), flagLong, 0x40, 0, 0, 0, 0, 0, 0, 0)},
	// zmq4 slices the metadata without checking: panic: slice bounds out
	// of range.
	{"READY with a truncated property", append(greeting(), frame(flagCommand, append([]byte{5}, "READY\x0bSocket-Type\x00"...))...)},
	// zmq4 panics: unknown socket-type: "".
	{"READY without a Socket-Type", append(greeting(), frame(flagCommand, []byte("\x05READY"))...)},
	{"frame over the limit", append(handshake(), frame(0, make([]byte, 4097))...)},
	{"message over the limit", append(handshake(), append(frame(flagMore, make([]byte, 3000)), frame(0, make([]byte, 3000))...)...)},
	{"message of too many frames", append(handshake(), bytes.Repeat([]byte{flagMore, 0}, maxFrames+1)...)},
	{"not a greeting", bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 5)},
}

// refusedCount returns how many connections r was told were refused.
func refusedCount(r *recorder) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[Refused]
}

// closedByPeer checks that the other end closes c (an end of stream or a
// reset) within 10 s.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("the refused connection was not closed: %v", err)
	}
}

// TestRefusedConnecting: a subscriber that connects to a hostile
// publisher refuses each attack, keeps running and reconnects.
func TestRefusedConnecting(t *testing.T) {
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			conns := make(chan net.Conn, 8)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write(a.bytes)
					conns <- c
				}
			}()
			r := newRecorder()
			stop := subscribe(t, SubscriberConfig{Endpoint: "tcp://" + ln.Addr().String(), MaxMessageBytes: 4096, RetryMin: 10 * time.Millisecond}, r)
			r.wait(t, "a refusal", func() bool { return r.counts[Refused] > 0 })
			// The subscriber closed the connection and dials again.
			first := <-conns
			closedByPeer(t, first)
			_ = first.Close()
			select {
			case c := <-conns:
				_ = c.Close()
			case <-time.After(10 * time.Second):
				t.Fatal("the subscriber did not dial again")
			}
			stop()
		})
	}
}

// TestRefusedBound: a subscriber that binds (kv_events_bind) refuses each
// attack from any client, and still takes a real publisher's stream.
func TestRefusedBound(t *testing.T) {
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			addr := freeAddr(t)
			r := newRecorder()
			subscribe(t, SubscriberConfig{Endpoint: "tcp://" + addr, Bind: true, MaxMessageBytes: 4096}, r)
			var c net.Conn
			for deadline := time.Now().Add(10 * time.Second); ; {
				var err error
				if c, err = net.Dial("tcp", addr); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			defer c.Close()
			if _, err := c.Write(a.bytes); err != nil {
				t.Fatal(err)
			}
			r.wait(t, "a refusal", func() bool { return r.counts[Refused] > 0 })
			closedByPeer(t, c)
			p := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
			joined(t, p, r)
			if n := refusedCount(r); n != 1 {
				t.Errorf("%d refusals, want 1", n)
			}
		})
	}
}

// TestHandshakeTimeout: a client of a bound subscriber that sends part of
// a greeting and waits is closed after the handshake timeout, and a
// publisher that connects afterwards is served (zmq4 handshakes accepted
// connections one at a time: the silent client held its accept loop).
func TestHandshakeTimeout(t *testing.T) {
	addr := freeAddr(t)
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + addr, Bind: true, handshakeTimeout: 200 * time.Millisecond}, r)
	var c net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	defer c.Close()
	if _, err := c.Write(greeting()[:10]); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "a refusal", func() bool { return r.counts[Refused] > 0 })
	closedByPeer(t, c)
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
	joined(t, p, r)
}

// TestMessageAtTheLimit: a message of exactly MaxMessageBytes, frames
// together, passes; one byte less is refused.
func TestMessageAtTheLimit(t *testing.T) {
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv"})
	// joined's probes, batchN(-1), are the messages at the limit.
	limit := len("kv") + 8 + len(Encode(nil, batchN(-1), Current))
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), MaxMessageBytes: limit}, r)
	joined(t, p, r)
	if n := refusedCount(r); n != 0 {
		t.Errorf("%d refusals at the limit", n)
	}
	under := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), MaxMessageBytes: limit - 1}, under)
	deadline := time.Now().Add(10 * time.Second)
	for refusedCount(under) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a message one byte over the limit was not refused")
		}
		if _, err := p.Publish(batchN(-1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPublisherRedials: a connecting publisher whose first dial reaches
// something that is not a ZMTP peer (a port another program held, a proxy
// before its backend) keeps dialing, as libzmq does, and reaches the
// subscriber that binds afterwards; it dials again when that subscriber
// goes away and comes back.
func TestPublisherRedials(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	served := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write(bytes.Repeat([]byte("HTTP/1.1 400 Bad Request\r\n"), 4))
		close(served)
		_, _ = io.Copy(io.Discard, c)
	}()
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
	<-served
	_ = ln.Close()
	for round := range 2 {
		r := newRecorder()
		stop := subscribe(t, SubscriberConfig{Endpoint: "tcp://" + addr, Bind: true}, r)
		joined(t, p, r)
		stop()
		t.Logf("round %d: joined", round)
	}
}

// FuzzConn drives zmq4's connection reader (the code every KV-event
// socket's reader goroutine runs) through the guard with raw bytes from a
// peer: after a valid greeting and READY when the first byte is even, raw
// from the first byte otherwise. It must never panic, and every message it
// returns must be within the limits.
func FuzzConn(f *testing.F) {
	for _, a := range attacks {
		f.Add(append([]byte{1}, a.bytes...))
	}
	msg := append(frame(flagMore, []byte("kv@")), frame(flagMore, make([]byte, 8))...)
	f.Add(append([]byte{0}, append(msg, frame(0, Encode(nil, batchN(3), Current))...)...))
	f.Add([]byte{0, flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		in := data[1:]
		if data[0]%2 == 0 {
			in = append(handshake(), in...)
		}
		const limit = 4096
		local, remote := net.Pipe()
		defer remote.Close()
		go func() {
			_, _ = remote.Write(in)
			_ = remote.Close()
		}()
		g := newGuard(limit, nil)
		gc := g.wrap(local)
		defer gc.Close()
		drained := make(chan struct{})
		go func() {
			// zmq4's writes (its greeting, READY, PONG) must be read.
			defer close(drained)
			buf := make([]byte, 512)
			for {
				if _, err := remote.Read(buf); err != nil {
					return
				}
			}
		}()
		defer func() { _ = gc.Close(); <-drained }()
		conn, err := zmq4.Open(gc, null.Security(), zmq4.Sub, zmq4.SocketIdentity("fuzz"), false, nil)
		if err != nil {
			return
		}
		for {
			m, err := conn.RecvMsg()
			if err != nil {
				return
			}
			total := 0
			for _, fr := range m.Frames {
				total += len(fr)
			}
			if len(m.Frames) > maxFrames || total > limit {
				t.Fatalf("a message of %d frames and %d bytes passed", len(m.Frames), total)
			}
		}
	})
}
