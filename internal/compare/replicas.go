package compare

import (
	"errors"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// replicaCounts are the router counts of one policy's runs: one router,
// then replicas of them when more than one is asked for.
func replicaCounts(replicas int) []int {
	if replicas > 1 {
		return []int{1, replicas}
	}
	return []int{1}
}

// nats starts a NATS server on a free loopback port for the run's router
// replicas and returns its URL; it stops with the run.
func (s *servers) nats() (string, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return "", err
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		ns.Shutdown()
		return "", errors.New("nats-server did not start")
	}
	s.closers = append(s.closers, func() error { ns.Shutdown(); return nil })
	return ns.ClientURL(), nil
}
