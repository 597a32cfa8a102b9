package proxy

import (
	"context"
	"log/slog"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/peerlink"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Root is what the tests use of a whole router (package server's
// Server), beside its data plane.
type Root interface {
	Start() error
	Shutdown(context.Context) error
	Kill()
	Reload(*config.Config) error
	ReloadWith(func() (*config.Config, error)) error
	Fleet() *fleet.Fleet
	Scheduler() *scheduler.Scheduler
	Members() *members.Set
	Peers() *peerlink.Link
}

// BuildRouter builds a whole router from cfg: package server's New,
// installed by root_test.go (package proxy_test), since package server
// imports this one. The tests thus run the one composition root there is.
var BuildRouter func(cfg *config.Config, logger *slog.Logger) (*Server, Root, error)

// router is a whole router under test: its data plane, whose fields the
// tests read, and its root, which starts, reloads and stops it.
type router struct {
	*Server
	root Root
}

// newRouter builds a router from cfg (see BuildRouter).
func newRouter(cfg *config.Config, logger *slog.Logger) (*router, error) {
	s, root, err := BuildRouter(cfg, logger)
	if err != nil {
		return nil, err
	}
	return &router{Server: s, root: root}, nil
}

func (r *router) Start() error                       { return r.root.Start() }
func (r *router) Shutdown(ctx context.Context) error { return r.root.Shutdown(ctx) }
func (r *router) Kill()                              { r.root.Kill() }
func (r *router) Reload(cfg *config.Config) error    { return r.root.Reload(cfg) }
func (r *router) Fleet() *fleet.Fleet                { return r.root.Fleet() }
func (r *router) Scheduler() *scheduler.Scheduler    { return r.root.Scheduler() }
func (r *router) Members() *members.Set              { return r.root.Members() }
func (r *router) Peers() *peerlink.Link              { return r.root.Peers() }
func (r *router) ReloadWith(load func() (*config.Config, error)) error {
	return r.root.ReloadWith(load)
}

// metricValue sums the samples of the family name in the router's
// registry whose labels include the given name, value pairs: for the
// families other parts of the router register (members' KV streams).
func (r *router) metricValue(name string, labels ...string) float64 {
	fams, err := r.metrics.reg.Gather()
	if err != nil {
		return -1
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}
