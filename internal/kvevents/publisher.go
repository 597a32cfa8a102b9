package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// The ZMQ transport, after vLLM's ZmqEventPublisher
// (vllm/distributed/kv_events.py; SGLang's is the same): a PUB socket sends
// each batch as three frames [topic, sequence number as 8 bytes big-endian
// (0 for the first batch after the publisher starts), msgpack payload]; an
// optional ROUTER socket serves replays: a request [empty delimiter, first
// wanted sequence number as 8 bytes] is answered by one
// [empty delimiter, seq, payload] message per buffered batch from that
// number on, then [empty delimiter, -1 as 8 bytes, empty payload]. A REQ or
// DEALER socket sends and strips the delimiter. Both speak ZMTP 3 (through
// github.com/go-zeromq/zmq4), so libzmq peers interoperate.

// endSeq is the replay's end marker, -1 as 8 big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// binds reports whether a socket on endpoint binds rather than connects:
// vLLM's rule (a wildcard host, an IPv6 "::", or an ipc:// or inproc://
// endpoint binds).
func binds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// PublisherConfig configures a Publisher; its fields are vLLM's
// --kv-events-config keys of the same names.
type PublisherConfig struct {
	// Endpoint is the PUB socket's endpoint: tcp://*:5557 binds (so does
	// any endpoint with "*"), tcp://host:5557 connects to a subscriber
	// that binds.
	Endpoint string
	// ReplayEndpoint, if not empty, is where the ROUTER socket for replays
	// binds.
	ReplayEndpoint string
	// Topic is the first frame of every message; subscribers filter on
	// its prefix.
	Topic string
	// BufferSteps is how many of the latest batches replay can serve
	// (vLLM's default 10,000).
	BufferSteps int
	// HWM is the PUB socket's high-water mark in messages: past it,
	// messages are dropped rather than queued (vLLM's default 100,000).
	HWM int
	// Encoding is the shape of the events Publish encodes.
	Encoding Encoding
	// Bind makes the PUB socket bind even to an endpoint without a
	// wildcard (tcp://127.0.0.1:5557), which vLLM's rule would connect.
	Bind bool
	// MaxMessageBytes bounds a message from a peer (a subscription, a
	// replay request); DefaultMaxMessageBytes when 0. See guard.go.
	MaxMessageBytes int
}

// Publisher publishes batches as vLLM's ZmqEventPublisher does. It is safe
// for concurrent use; Publish never blocks on the network (the socket
// queues up to HWM messages).
type Publisher struct {
	cfg    PublisherConfig
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	guards []*guard    // the sockets' guards
	cancel context.CancelFunc
	done   chan struct{} // closed when the replay loop has returned
	dialed chan struct{} // closed when the redial loop has returned

	mu   sync.Mutex
	seq  uint64    // the next batch's sequence number
	ring []payload // the last BufferSteps batches, oldest at ring[head] once full
	head int
	// drop, set only by tests, says not to send a sequence number on the
	// PUB socket (it still goes to the replay buffer), to make a gap.
	drop func(seq uint64) bool
}

type payload struct {
	seq  uint64
	data []byte
}

// NewPublisher opens the sockets. The publisher runs until Close (or ctx's
// end, which also closes its sockets).
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kvevents: publisher without an endpoint")
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10_000
	}
	if cfg.HWM <= 0 {
		cfg.HWM = 100_000
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{cfg: cfg, cancel: cancel, done: make(chan struct{}), dialed: make(chan struct{})}
	bind := cfg.Bind || binds(cfg.Endpoint)
	g := newGuard(cfg.MaxMessageBytes, nil)
	p.guards = append(p.guards, g)
	// A connecting PUB dials through redial, which retries a failed dial
	// and redials a lost connection; zmq4's own retry gives up on a failed
	// handshake, and its reconnect runs once, inside the lost connection's
	// reader.
	p.pub = zmq4.NewPub(g.context(ctx), zmq4.WithLogger(discardLogger), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(dialTimeout))
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		cancel()
		return nil, fmt.Errorf("kvevents: publisher hwm: %w", err)
	}
	if bind {
		close(p.dialed)
		if err := p.pub.Listen(endpoint(cfg.Endpoint)); err != nil {
			cancel()
			_ = p.pub.Close()
			return nil, fmt.Errorf("kvevents: publisher %s: %w", cfg.Endpoint, err)
		}
	} else {
		go p.redial(ctx, g)
	}
	if cfg.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	rg := newGuard(cfg.MaxMessageBytes, nil)
	p.guards = append(p.guards, rg)
	p.replay = zmq4.NewRouter(rg.context(ctx), zmq4.WithLogger(discardLogger))
	if err := p.replay.Listen(endpoint(cfg.ReplayEndpoint)); err != nil {
		close(p.done)
		_ = p.Close()
		return nil, fmt.Errorf("kvevents: replay %s: %w", cfg.ReplayEndpoint, err)
	}
	go p.serveReplays(ctx)
	return p, nil
}

// Reconnection, as libzmq's defaults: a connecting socket redials every
// reconnectInterval (ZMQ_RECONNECT_IVL, 100 ms, without backoff), and a
// dial that connects nowhere gives up after dialTimeout.
const (
	reconnectInterval = 100 * time.Millisecond
	dialTimeout       = 5 * time.Second
)

// redial keeps the connecting PUB socket connected until ctx ends, as
// libzmq does in the background: it dials until a dial (the ZMTP handshake
// included) succeeds, waits for that connection to close, and dials again,
// reconnectInterval after each failure or loss.
func (p *Publisher) redial(ctx context.Context, g *guard) {
	defer close(p.dialed)
	ep := endpoint(p.cfg.Endpoint)
	for {
		if err := p.pub.Dial(ep); err != nil {
			// A failed handshake leaves its connection open in zmq4.
			g.closeAll()
		}
		for g.count() > 0 {
			select {
			case <-g.lost:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-time.After(reconnectInterval):
		case <-ctx.Done():
			return
		}
	}
}

// Addr is the PUB socket's bound address (nil when it connects): with
// port 0 in the endpoint, the port the system chose.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's bound address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Publish encodes b in the configured encoding and publishes it, returning
// its sequence number.
func (p *Publisher) Publish(b Batch) (uint64, error) {
	return p.PublishPayload(Encode(nil, b, p.cfg.Encoding))
}

// PublishPayload publishes an encoded payload as is and returns its
// sequence number. The publisher keeps data for replay: the caller must
// not modify it afterwards.
func (p *Publisher) PublishPayload(data []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, payload{seq, data})
	} else {
		p.ring[p.head] = payload{seq, data}
		p.head = (p.head + 1) % len(p.ring)
	}
	if p.drop != nil && p.drop(seq) {
		return seq, nil
	}
	msg := zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqBytes(seq), data)
	if err := p.pub.SendMulti(msg); err != nil {
		return seq, fmt.Errorf("kvevents: publish %d: %w", seq, err)
	}
	return seq, nil
}

func seqBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// buffered returns the buffered batches from seq on, oldest first.
func (p *Publisher) buffered(from uint64) []payload {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]payload, 0, len(p.ring))
	for i := range p.ring {
		if b := p.ring[(p.head+i)%len(p.ring)]; b.seq >= from {
			out = append(out, b)
		}
	}
	return out
}

// serveReplays answers replay requests until ctx ends. A malformed request
// is ignored, as vLLM does.
func (p *Publisher) serveReplays(ctx context.Context) {
	defer close(p.done)
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		from := binary.BigEndian.Uint64(msg.Frames[2])
		for _, b := range p.buffered(from) {
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seqBytes(b.seq), b.data)); err != nil {
				break
			}
		}
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// Close closes the sockets and waits for the replay and redial loops to
// return.
func (p *Publisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		if e := p.replay.Close(); err == nil {
			err = e
		}
	}
	for _, g := range p.guards {
		g.closeAll()
	}
	<-p.done
	<-p.dialed
	return err
}
