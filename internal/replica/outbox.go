package replica

import (
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// DefaultOutboxSize is the number of events an Outbox holds before it
// drops: about a second of a busy replica's routing (three events a
// request), time enough for the sender to catch up after a pause.
const DefaultOutboxSize = 16384

// Outbox takes this replica's events off the routing path: it is the
// scheduler's Events, and each call is one non-blocking channel send. When
// the sender falls behind and the queue is full, the event is dropped and
// counted; the next heartbeat corrects the peers' sum of this replica's
// load, and a dropped decision only costs them one prompt's blocks.
type Outbox struct {
	ch              chan Event
	queued, dropped atomic.Uint64
}

// NewOutbox returns an outbox of size events (DefaultOutboxSize if <= 0).
func NewOutbox(size int) *Outbox {
	if size <= 0 {
		size = DefaultOutboxSize
	}
	return &Outbox{ch: make(chan Event, size)}
}

// Routed implements scheduler.Events.
func (o *Outbox) Routed(id uint64, b *fleet.Backend, hashes []uint64, c policy.Claim, d fleet.Load) {
	o.put(Event{Kind: Routed, Request: id, Backend: b.Name, Load: d, Claim: c, Hashes: hashes})
}

// Changed implements scheduler.Events.
func (o *Outbox) Changed(id uint64, b *fleet.Backend, d fleet.Load) {
	o.put(Event{Kind: Changed, Request: id, Backend: b.Name, Load: d})
}

// Stored implements scheduler.ResponseEvents.
func (o *Outbox) Stored(b *fleet.Backend, h uint64, at int64) {
	o.put(Event{Kind: Stored, Backend: b.Name, Claim: policy.Claim{Session: h, At: at}})
}

func (o *Outbox) put(e Event) {
	select {
	case o.ch <- e:
		o.queued.Add(1)
	default:
		o.dropped.Add(1)
	}
}

// C is the queue, for the sender to wait on.
func (o *Outbox) C() <-chan Event { return o.ch }

// Drain appends to dst the events queued now, at most max of them, without
// waiting.
func (o *Outbox) Drain(dst []Event, max int) []Event {
	for range max {
		select {
		case e := <-o.ch:
			dst = append(dst, e)
		default:
			return dst
		}
	}
	return dst
}

// Queued is the number of events accepted into the queue.
func (o *Outbox) Queued() uint64 { return o.queued.Load() }

// Dropped is the number of events dropped because the queue was full.
func (o *Outbox) Dropped() uint64 { return o.dropped.Load() }

var (
	_ scheduler.Events         = (*Outbox)(nil)
	_ scheduler.ResponseEvents = (*Outbox)(nil)
)
