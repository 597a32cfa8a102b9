package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// discardLogger silences zmq4's own logging (it logs failed handshakes of
// stray connections); the subscriber reports what matters through its
// Handler.
var discardLogger = log.New(io.Discard, "", 0)

// ResetReason says why a Handler must stop trusting what the stream told it
// so far about the engine's cache.
type ResetReason uint8

const (
	// ResetGap: batches were lost and replay could not recover them (no
	// replay endpoint, a failed replay, or batches older than the
	// engine's buffer).
	ResetGap ResetReason = iota + 1
	// ResetRestart: the sequence went backwards: the engine restarted
	// and its cache is empty (the batch that follows is the new run's).
	// A restart is only seen this way: an engine that restarted while
	// the subscriber was away and has since published more batches than
	// it had before looks like a gap (ResetGap, or a replay of the new
	// run's batches).
	ResetRestart
	// ResetStale: no message for StaleAfter. The engine may only be idle:
	// if the next batch continues the sequence, nothing was lost.
	ResetStale
)

func (r ResetReason) String() string {
	switch r {
	case ResetGap:
		return "gap"
	case ResetRestart:
		return "restart"
	case ResetStale:
		return "stale"
	}
	return "unknown"
}

// Counter names an occurrence worth a metric.
type Counter uint8

const (
	// DecodeErrors: a message that was not a well-formed batch (wrong
	// frame count, sequence frame not 8 bytes, payload Decode rejects); it
	// is skipped, and its sequence number still counts as received.
	DecodeErrors Counter = iota + 1
	// Gaps: the sequence jumped forward.
	Gaps
	// Replays: a gap filled completely by replay.
	Replays
	// ReplayFailures: a replay that failed or came back short.
	ReplayFailures
	// Reconnects: the subscriber opened its socket again (after a failed
	// dial or, when it connects, after StaleAfter of silence).
	Reconnects
	// Refused: a peer's connection closed for breaking the socket's
	// limits: a frame or message beyond MaxMessageBytes, malformed ZMTP,
	// or a handshake not finished in time (guard.go).
	Refused
)

func (c Counter) String() string {
	switch c {
	case DecodeErrors:
		return "decode_errors"
	case Gaps:
		return "gaps"
	case Replays:
		return "replays"
	case ReplayFailures:
		return "replay_failures"
	case Reconnects:
		return "reconnects"
	case Refused:
		return "refused"
	}
	return "unknown"
}

// Handler receives a stream's batches and faults. Subscribe calls its
// methods from its own goroutine, one at a time, in stream order.
type Handler interface {
	// Batch delivers one batch and its sequence number. Sequence numbers
	// are increasing and, between two Resets, without holes except for
	// the numbers of skipped undecodable messages (counted as
	// DecodeErrors).
	Batch(seq uint64, b Batch)
	// Reset says that the batches delivered so far no longer describe
	// the engine's cache (ResetStale: may no longer).
	Reset(reason ResetReason)
	// Count reports one occurrence of c.
	Count(c Counter)
}

// SubscriberConfig configures Subscribe.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB endpoint, tcp://host:5557.
	Endpoint string
	// Bind makes the subscriber listen on Endpoint (tcp://*:5557 or
	// tcp://127.0.0.1:5557) for an engine whose publisher connects.
	Bind bool
	// ReplayEndpoint, if not empty, is the engine's replay ROUTER
	// endpoint, asked for the batches of a gap.
	ReplayEndpoint string
	// Topic filters messages by the prefix of their topic frame ("" takes
	// every message).
	Topic string
	// StaleAfter is the silence after which the stream is reported stale
	// (default 30 s). A subscriber that connects also reconnects then,
	// since a silent connection may be a dead one.
	StaleAfter time.Duration
	// ReplayTimeout bounds one replay, dial included (default 2 s).
	ReplayTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed dials
	// (defaults 100 ms and 5 s).
	RetryMin, RetryMax time.Duration
	// MaxMessageBytes bounds one message from a peer, its frames together
	// (DefaultMaxMessageBytes when 0): a peer that declares more has its
	// connection closed before anything is allocated (Refused).
	MaxMessageBytes int
	// Refused, if not nil, is told why each refused connection was closed,
	// from the goroutine that read it (for logging; Handler.Count(Refused)
	// counts them in stream order).
	Refused func(error)

	// handshakeTimeout, when set, replaces handshakeTimeout (tests).
	handshakeTimeout time.Duration
}

func (c *SubscriberConfig) defaults() {
	if c.StaleAfter <= 0 {
		c.StaleAfter = 30 * time.Second
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(5*time.Second, c.RetryMin)
	}
}

// Subscribe reads the event stream at cfg.Endpoint into h until ctx ends,
// then returns nil, having closed its sockets and stopped every goroutine
// it started. It checks the sequence: a jump forward asks the replay
// endpoint for the missing batches (Reset(ResetGap) when there is none or
// it cannot provide them all), a jump backward is a restart, and silence
// beyond StaleAfter is reported once per silence. It reconnects by itself.
// It returns an error only for a configuration it cannot run: an endpoint
// zmq4 does not parse, or one it cannot bind.
func Subscribe(ctx context.Context, cfg SubscriberConfig, h Handler) error {
	cfg.defaults()
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return fmt.Errorf("kvevents: subscribe: replay: %w", err)
		}
	}
	s := &stream{cfg: cfg, h: h, refusedc: make(chan struct{}, 1)}
	backoff := cfg.RetryMin
	for first := true; ; first = false {
		if !first {
			h.Count(Reconnects)
		}
		sock, err := s.open(ctx)
		s.countRefused()
		if err != nil {
			if cfg.Bind {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, cfg.RetryMax)
			continue
		}
		backoff = cfg.RetryMin
		s.run(ctx, sock)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// checkEndpoint rejects an endpoint no dial or listen can ever accept, so
// that Subscribe reports it instead of retrying forever: a tcp://host:port
// or ipc://path endpoint.
func checkEndpoint(ep string) error {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		if _, port, err := net.SplitHostPort(ep[len("tcp://"):]); err != nil || port == "" {
			return fmt.Errorf("endpoint %q: want tcp://host:port", ep)
		}
		return nil
	case strings.HasPrefix(ep, "ipc://") && len(ep) > len("ipc://"):
		return nil
	}
	return fmt.Errorf("endpoint %q: want tcp://host:port or ipc://path", ep)
}

// stream is one subscription's sequence state, kept across reconnects.
type stream struct {
	cfg     SubscriberConfig
	h       Handler
	started bool
	next    uint64 // the sequence number expected next
	stale   bool   // Reset(ResetStale) sent since the last message
	// refused counts refused connections not yet passed to the Handler;
	// refusedc is signalled when it grows. The guards' callback runs on
	// zmq4's goroutines, the Handler on Subscribe's.
	refused  atomic.Int64
	refusedc chan struct{}
}

// guard returns a guard for one of the stream's sockets.
func (s *stream) guard() *guard {
	g := newGuard(s.cfg.MaxMessageBytes, func(err error) {
		s.refused.Add(1)
		select {
		case s.refusedc <- struct{}{}:
		default:
		}
		if s.cfg.Refused != nil {
			s.cfg.Refused(err)
		}
	})
	if s.cfg.handshakeTimeout > 0 {
		g.handshake = s.cfg.handshakeTimeout
	}
	return g
}

// countRefused passes the refused connections counted so far to the
// Handler.
func (s *stream) countRefused() {
	for n := s.refused.Swap(0); n > 0; n-- {
		s.h.Count(Refused)
	}
}

// open makes the SUB socket, connected (or bound) and subscribed.
func (s *stream) open(ctx context.Context) (*subSocket, error) {
	g := s.guard()
	sctx, cancel := context.WithCancel(g.context(ctx))
	sock := zmq4.NewSub(sctx, zmq4.WithLogger(discardLogger), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	ss := &subSocket{sock: sock, g: g, ctx: sctx, cancel: cancel}
	var err error
	if s.cfg.Bind {
		err = sock.Listen(endpoint(s.cfg.Endpoint))
	} else {
		err = sock.Dial(endpoint(s.cfg.Endpoint))
	}
	if err == nil {
		err = sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic)
	}
	if err != nil {
		ss.close()
		return nil, fmt.Errorf("kvevents: subscribe %s: %w", s.cfg.Endpoint, err)
	}
	return ss, nil
}

// subSocket is a zmq4 socket with its guard.
type subSocket struct {
	sock   zmq4.Socket
	g      *guard
	ctx    context.Context
	cancel context.CancelFunc
}

// close closes the socket and every connection it opened, those zmq4
// holds and those whose handshake failed.
func (ss *subSocket) close() {
	ss.cancel()
	_ = ss.sock.Close()
	ss.g.closeAll()
}

// recvLoop sends the socket's messages to out until the socket closes
// (ctx ends) or stop closes, then closes done. A failed Recv is a lost
// connection: unless keep is set (a bound socket, whose other peers
// remain and whose lost ones redial), it ends the loop too.
func recvLoop(ctx context.Context, sock zmq4.Socket, keep bool, out chan<- zmq4.Msg, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil || !keep {
				return
			}
			continue
		}
		select {
		case out <- msg:
		case <-stop:
			return
		}
	}
}

// run handles the socket's messages until ctx ends, the socket fails or,
// for a connecting subscriber, the stream goes stale; it closes the socket
// and waits for its reader before returning.
func (s *stream) run(ctx context.Context, ss *subSocket) {
	msgs := make(chan zmq4.Msg, 64)
	stop, done := make(chan struct{}), make(chan struct{})
	go recvLoop(ss.ctx, ss.sock, s.cfg.Bind, msgs, stop, done)
	defer func() {
		close(stop)
		ss.close()
		<-done
		s.countRefused()
	}()
	timer := time.NewTimer(s.cfg.StaleAfter)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-s.refusedc:
			s.countRefused()
		case msg := <-msgs:
			s.stale = false
			s.handle(ctx, msg)
			timer.Reset(s.cfg.StaleAfter)
		case <-timer.C:
			if !s.stale {
				s.stale = true
				s.h.Reset(ResetStale)
			}
			if !s.cfg.Bind {
				return
			}
			timer.Reset(s.cfg.StaleAfter)
		}
	}
}

// handle checks one message's sequence number and delivers its batch.
func (s *stream) handle(ctx context.Context, msg zmq4.Msg) {
	if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
		s.h.Count(DecodeErrors)
		return
	}
	seq := binary.BigEndian.Uint64(msg.Frames[1])
	switch {
	case !s.started:
		s.started = true
	case seq < s.next:
		s.h.Reset(ResetRestart)
	case seq > s.next:
		s.h.Count(Gaps)
		if s.cfg.ReplayEndpoint == "" || !s.replay(ctx, s.next, seq) {
			s.h.Reset(ResetGap)
		}
	}
	s.next = seq + 1
	s.deliver(seq, msg.Frames[2])
}

func (s *stream) deliver(seq uint64, payload []byte) {
	b, err := Decode(payload)
	if err != nil {
		s.h.Count(DecodeErrors)
		return
	}
	s.h.Batch(seq, b)
}

// replay asks for batches from..upto-1 and delivers them, reporting
// whether all of them came.
func (s *stream) replay(ctx context.Context, from, upto uint64) bool {
	ok := s.fetch(ctx, from, upto)
	if ok {
		s.h.Count(Replays)
	} else {
		s.h.Count(ReplayFailures)
	}
	return ok
}

func (s *stream) fetch(ctx context.Context, from, upto uint64) bool {
	g := s.guard()
	rctx, cancel := context.WithTimeout(g.context(ctx), s.cfg.ReplayTimeout)
	sock := zmq4.NewDealer(rctx, zmq4.WithLogger(discardLogger), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	ss := &subSocket{sock: sock, g: g, ctx: rctx, cancel: cancel}
	if err := sock.Dial(endpoint(s.cfg.ReplayEndpoint)); err != nil {
		ss.close()
		return false
	}
	replies := make(chan zmq4.Msg, 64)
	stop, done := make(chan struct{}), make(chan struct{})
	go recvLoop(rctx, sock, false, replies, stop, done)
	defer func() {
		close(stop)
		ss.close()
		<-done
	}()
	if err := sock.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(from))); err != nil {
		return false
	}
	want := from
	for {
		select {
		case <-rctx.Done():
			return false
		case <-done:
			return false
		case msg := <-replies:
			f := msg.Frames
			if len(f) == 3 && len(f[0]) == 0 {
				f = f[1:] // the delimiter a ROUTER adds for REQ peers
			}
			if len(f) != 2 || len(f[0]) != 8 {
				return false
			}
			seq := binary.BigEndian.Uint64(f[0])
			switch {
			case seq == binary.BigEndian.Uint64(endSeq):
				return want == upto
			case seq < want || seq >= upto:
				// Already delivered, or coming on the PUB socket.
			case seq > want:
				return false // the buffer no longer holds want
			default:
				s.deliver(seq, f[1])
				want++
			}
		}
	}
}
