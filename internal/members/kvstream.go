package members

import (
	"context"
)

// Stream follows one backend's KV cache event stream until ctx is done
// (the proxy's, which subscribes and feeds the precise index). endpoint
// and replay are the backend's own, its entry's templates applied to its
// host; replay is "" without one; bind says to bind endpoint rather than
// connect to it.
type Stream func(ctx context.Context, m *Member, endpoint, replay string, bind bool)

// startStream starts m's event stream, if its entry has one: one goroutine
// per backend, stopped when it leaves (remove) or the set stops. The caller
// holds mu.
func (s *Set) startStream(m *Member) {
	if s.c.KVStream == nil || m.Entry.KVEvents == "" || m.B.URL == nil || m.stopStream != nil {
		return
	}
	host := m.B.URL.Hostname()
	ctx, cancel := context.WithCancel(s.ctx)
	m.stopStream = cancel
	endpoint, replay, bind := m.Entry.KVEndpoint(host), m.Entry.KVReplayEndpoint(host), m.Entry.KVEventsBind
	s.checks.Go(func() { s.c.KVStream(ctx, m, endpoint, replay, bind) })
}

// stopStreamOf stops m's event stream; the caller holds mu.
func (s *Set) stopStreamOf(m *Member) {
	if m.stopStream != nil {
		m.stopStream()
		m.stopStream = nil
	}
}
