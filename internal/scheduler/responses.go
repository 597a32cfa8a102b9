package scheduler

import (
	"errors"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// Stored responses. An engine that serves the Responses API with its store
// on keeps each response in its own memory, and a request naming it in
// previous_response_id works only there: anywhere else it is not found.
// The router learns where each response lives from what it relays (the
// proxy tells ResponseStored), shares it with its peers (ResponseEvents)
// and routes a continuation, and the requests on a stored response (GET,
// DELETE, cancel, input_items), to that engine alone: the candidates are
// narrowed to it before the policy's pick.

// ErrResponseGone: the request names a stored response whose engine has
// left the fleet; no other engine holds it (a 404, in the engine's words).
var ErrResponseGone = errors.New("the engine holding the response is gone")

// Bounds of the table of stored responses: entries are forgotten after
// DefaultResponseTTL, or the oldest first beyond DefaultMaxResponses (48
// bytes each: 6 MiB at the bound).
const (
	DefaultResponseTTL  = 6 * time.Hour
	DefaultMaxResponses = 1 << 17
)

// ResponseEvents hears of the responses this router learnt were stored
// (the part of Events for them; an Events that is not one hears nothing
// of them). Stored runs on a request's goroutine: it must not block.
type ResponseEvents interface {
	// Stored: the response with id hash h was stored on b at at (Unix
	// nanoseconds).
	Stored(b *fleet.Backend, h uint64, at int64)
}

// HashResponse is the one hash of a response id the table and the peers'
// events key on (never 0).
func HashResponse(id string) uint64 { return xxhash.Sum64String(id) | 1 }

// homes is the table of stored responses: the engine each lives on, by
// name (a peer names backends alike), and when it was learnt. Bounded in
// age and in entries, the oldest learnt first.
type homes struct {
	mu    sync.Mutex
	m     map[uint64]home
	order []uint64 // ring of keys in the order learnt
	next  int
	ttl   time.Duration
	max   int
}

type home struct {
	name string
	at   time.Time
}

func (t *homes) put(h uint64, name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.ttl, t.max = DefaultResponseTTL, DefaultMaxResponses
		t.m = make(map[uint64]home)
	}
	if t.max < 0 {
		return
	}
	if cur, ok := t.m[h]; ok {
		if !at.After(cur.at) {
			return
		}
		t.m[h] = home{name, at}
		return
	}
	if len(t.order) < t.max {
		t.order = append(t.order, h)
	} else {
		old := t.order[t.next]
		delete(t.m, old)
		t.order[t.next] = h
		t.next = (t.next + 1) % t.max
	}
	t.m[h] = home{name, at}
}

func (t *homes) get(h uint64, now time.Time) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[h]
	if !ok || now.Sub(e.at) > t.ttl {
		return "", false
	}
	return e.name, true
}

// SetResponseBounds sets how long and how many stored responses the
// table keeps (0: the defaults; n < 0 keeps none, so that continuations
// are routed as any request, as by a balancer that does not learn
// response ids). Call it before the first routing.
func (s *Scheduler) SetResponseBounds(ttl time.Duration, n int) {
	s.homes.mu.Lock()
	defer s.homes.mu.Unlock()
	s.homes.ttl, s.homes.max = DefaultResponseTTL, DefaultMaxResponses
	if ttl > 0 {
		s.homes.ttl = ttl
	}
	if n != 0 {
		s.homes.max = n
	}
	s.homes.m = make(map[uint64]home)
	s.homes.order, s.homes.next = nil, 0
}

// ResponseStored records that b stored the response id at now, and tells
// the peers.
func (s *Scheduler) ResponseStored(id string, b *fleet.Backend, now time.Time) {
	if id == "" {
		return
	}
	h := HashResponse(id)
	s.homes.put(h, b.Name, now)
	if e, ok := s.events.(ResponseEvents); ok {
		e.Stored(b, h, now.UnixNano())
	}
}

// LearnResponse applies a peer's ResponseEvents.Stored.
func (s *Scheduler) LearnResponse(b *fleet.Backend, h uint64, at int64) {
	if h != 0 {
		s.homes.put(h, b.Name, time.Unix(0, at))
	}
}

// ResponseHome is the name of the engine that stored the response id, if
// the table knows it at now.
func (s *Scheduler) ResponseHome(id string, now time.Time) (string, bool) {
	return s.homes.get(HashResponse(id), now)
}

// pinResponse sets sc.cands to the engine that stored the response v
// continues, when the table knows it at now (pinned): warm-up and the
// adapter stage do not apply, as no other engine could serve it. The
// error is ErrResponseGone when that engine has left the fleet,
// ErrNoBackend when it is there but may not take the request now
// (ejected, draining, excluded after a failed attempt).
func (s *Scheduler) pinResponse(sc *scratch, snap *fleet.Snapshot, v *request.View, exclude []int, now time.Time) (pinned bool, err error) {
	if v.PreviousResponseID == "" {
		return false, nil
	}
	name, ok := s.ResponseHome(v.PreviousResponseID, now)
	if !ok {
		return false, nil
	}
	sc.cands = sc.cands[:0]
	parent := s.Parent(v.Model)
	for _, b := range snap.Healthy {
		if b.Name == name && s.serves(b, v.Model, parent) && !excluded(exclude, b.ID) {
			sc.cands = append(sc.cands, b)
		}
	}
	if len(sc.cands) > 0 {
		if s.narrow(sc, v) == 0 {
			return true, ErrNoBackend
		}
		return true, nil
	}
	for _, b := range snap.All {
		if b.Name == name {
			return true, ErrNoBackend
		}
	}
	return true, ErrResponseGone
}
