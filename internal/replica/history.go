package replica

// History is this replica's recent routing decisions, which it sends a
// peer that asks (a replica that starts late, or reconnects after an
// outage) so that the peer follows the conversations and prefixes routed
// while it was away. It is bounded both in decisions and in block hashes;
// the oldest go first. Not safe for concurrent use: its one writer is the
// sender, which also answers the requests.
type History struct {
	ring         []Event
	next, n      int
	hashes, maxH int
}

// Defaults of a History: the last 4,096 decisions, 1M block hashes (8 MiB,
// a few minutes of a busy replica's prompts).
const (
	DefaultHistoryEvents = 4096
	DefaultHistoryHashes = 1 << 20
)

// NewHistory returns a history of at most events decisions and hashes
// block hashes (the defaults for values <= 0).
func NewHistory(events, hashes int) *History {
	if events <= 0 {
		events = DefaultHistoryEvents
	}
	if hashes <= 0 {
		hashes = DefaultHistoryHashes
	}
	return &History{ring: make([]Event, events), maxH: hashes}
}

// Add records a Routed event as a Learned one (its load is not history),
// and a Stored one as it is.
func (h *History) Add(e Event) {
	if e.Kind == Stored {
		e.Hashes = nil
	} else if e.Kind != Routed || len(e.Hashes) > h.maxH {
		return
	}
	for h.n > 0 && (h.n == len(h.ring) || h.hashes+len(e.Hashes) > h.maxH) {
		h.dropOldest()
	}
	kind := Learned
	if e.Kind == Stored {
		kind = Stored
	}
	h.ring[h.next] = Event{Kind: kind, Backend: e.Backend, Claim: e.Claim, Hashes: e.Hashes}
	h.next = (h.next + 1) % len(h.ring)
	h.n++
	h.hashes += len(e.Hashes)
}

func (h *History) dropOldest() {
	i := (h.next - h.n + len(h.ring)) % len(h.ring)
	h.hashes -= len(h.ring[i].Hashes)
	h.ring[i] = Event{}
	h.n--
}

// Events appends the recorded decisions to dst, oldest first, so that
// applying them in order leaves the newest most recent.
func (h *History) Events(dst []Event) []Event {
	for k := range h.n {
		dst = append(dst, h.ring[(h.next-h.n+k+len(h.ring))%len(h.ring)])
	}
	return dst
}
