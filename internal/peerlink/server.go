package peerlink

import (
	"errors"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// LoopbackServer starts a NATS server in this process on 127.0.0.1:port
// (0: a free port), for replicas on one machine: kvroute compare's, and
// tests'. The caller stops it with Shutdown.
func LoopbackServer(port int) (*server.Server, error) {
	if port == 0 {
		port = -1 // nats-server's "a free port"
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("nats-server did not start")
	}
	return ns, nil
}
