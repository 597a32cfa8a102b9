package proxy

import (
	"context"

	"github.com/kvroute/kvroute/internal/openai"
)

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
