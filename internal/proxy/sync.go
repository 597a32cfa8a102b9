package proxy

import (
	"context"

	"github.com/kvroute/kvroute/internal/openai"

	"github.com/kvroute/kvroute/internal/peerlink"
)

// newSync builds the link to the other replicas when sync.url is set (its
// metrics join the router's); it connects in Start. A reload does not
// change it: the sync section takes effect at the next start.
func (s *Server) newSync() error {
	if !s.cfg.Sync.Enabled() {
		return nil
	}
	l, err := peerlink.New(peerlink.Config{Sync: s.cfg.Sync, Fleet: s.fleet, Scheduler: s.sched, Log: s.log, Registerer: s.metrics.reg})
	if err != nil {
		return err
	}
	s.peers = l
	return nil
}

// startSync connects to NATS, or keeps trying in the background.
func (s *Server) startSync(ctx context.Context) error {
	if s.peers == nil {
		return nil
	}
	return s.peers.Start(ctx)
}

func (s *Server) stopSync() {
	if s.peers != nil {
		s.peers.Close()
	}
}

// awaitPeers holds a request while this replica catches up with its peers
// after a reconnection to NATS (peerlink.Link.CaughtUp: until each peer it
// knew has sent its load and its decisions, at most sync.peer_timeout):
// routed before, a new conversation would go where this replica alone
// thinks best, and its next turn, at a replica that sees the peers' load,
// would leave it.
func (s *Server) awaitPeers(ctx context.Context) *openai.Error {
	if s.peers == nil {
		return nil
	}
	select {
	case <-s.peers.CaughtUp():
		return nil
	case <-ctx.Done():
		return &openai.Error{Status: statusClientGone, Code: "client_gone", Message: ctx.Err().Error()}
	}
}

// Peers returns the link to the other replicas, nil with sync off.
func (s *Server) Peers() *peerlink.Link { return s.peers }

// Kill stops the router as a crash would, for tests and benchmarks of a
// lost replica: its link to the peers closes unflushed (Link.Abort), then
// its listeners and every connection close at once, with no drain; the
// requests in flight fail. Shutdown afterwards releases the rest.
func (s *Server) Kill() {
	s.mu.Lock()
	srv, stop, asrv := s.httpSrv, s.stop, s.adminSrv
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	if s.peers != nil {
		s.peers.Abort()
	}
	if asrv != nil {
		_ = asrv.Close()
	}
	if srv != nil {
		_ = srv.Close()
	}
}
