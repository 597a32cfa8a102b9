package compare

import "github.com/kvroute/kvroute/internal/peerlink"

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
	ns, err := peerlink.LoopbackServer(0)
	if err != nil {
		return "", err
	}
	s.closers = append(s.closers, func() error { ns.Shutdown(); return nil })
	return ns.ClientURL(), nil
}
