// Package server is the composition root of `kvroute serve`: from a
// validated configuration it builds every part of one router (the fleet,
// the scheduler and its policy, the control plane's members with their KV
// event streams, the engine monitor, admission, the link to the peer
// replicas, the tokenizer, the tracer, the admin API, the metrics
// registry, the connections to the backends) and hands them, already built, to the data
// plane (package proxy). It starts and stops them in order and applies
// reloads.
//
// It must not serve requests nor hold per-request or per-backend state of
// its own: the data plane, members and fleet do.
package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/tracer"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/epp"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/monitor"
	"github.com/kvroute/kvroute/internal/peerlink"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// Server is one router: its parts, the data plane over them, and their
// lifecycle (New, Start, Reload, Shutdown).
type Server struct {
	cfg      *config.Config
	log      *slog.Logger
	fleet    *fleet.Fleet
	sched    *scheduler.Scheduler
	set      *members.Set
	upstream *http.Transport
	metrics  *proxy.Metrics
	monitor  *monitor.Monitor // nil with engines.enabled off
	scrapes  *http.Transport  // the monitor's connections; nil when monitor is
	peers    *peerlink.Link   // nil with sync off
	tracer   *tracer.Tracer   // nil with tracing off
	adminAPI *admin.Handler
	proxy    *proxy.Server
	// epp is the Endpoint Picker (epp.go); nil without epp.listen.
	epp                    *epp.Server
	eppAddr, eppHealthAddr string

	// cert is the listener's certificate (listen_tls), replaced on reload;
	// nil without TLS. upstreamTLS is upstream.tls, replaced on reload.
	cert        atomic.Pointer[tls.Certificate]
	upstreamTLS atomic.Pointer[config.BackendTLS]

	// reload serialises Reload; last is the configuration last applied
	// (the startup one until the first reload).
	reload sync.Mutex
	last   *config.Config

	mu     sync.Mutex // guards stop
	stop   context.CancelFunc
	checks sync.WaitGroup
}

// New builds a router from cfg, which must have passed Validate. Backends
// without a configured models list are asked for their /v1/models (bounded
// by health.timeout) when upstream.discover_models is on; that is the only
// network I/O New does. A nil logger discards logs.
//
// In-process users (tests, `kvroute compare`) build the Config with
// config.Default, set Backends and Policy, call Validate, then New and
// either Start or mount Handler in a server of their own.
func New(cfg *config.Config, logger *slog.Logger) (*Server, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	entries, err := cfg.Entries()
	if err != nil {
		return nil, err
	}
	p, err := policy.New(cfg.Policy, policyOptions(cfg))
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: logger, fleet: fleet.New(), last: cfg}
	s.upstream = newTransport(cfg.Upstream, s.dialBackendTLS)
	// A drained engine is often stopped and started again on its address
	// (a rolling restart); its pooled connections then lead nowhere, and
	// the first requests sent on them after the undrain would fail
	// ("broken pipe") and open its breaker. The transport cannot close
	// one host's idle connections, so all are closed: the others are
	// dialled again, once an undrain.
	s.fleet.Undrained = func(*fleet.Backend) { s.upstream.CloseIdleConnections() }
	s.upstreamTLS.Store(cfg.Upstream.TLS)
	if cfg.ListenTLS.Enabled() {
		c, err := cfg.ListenTLS.Load()
		if err != nil {
			return nil, err
		}
		s.cert.Store(c)
	}
	sc := scheduler.Config{BlockChars: cfg.Prefix.BlockChars, Capacity: cfg.Prefix.CapacityBlocks, ProbeInterval: cfg.PolicyOptions.Probes()}
	if wantsPrecise(entries) {
		pc := cfg.KVEvents.Precise()
		sc.Precise = &pc
	}
	var roles disagg.Roles
	if cfg.MaySplit() {
		// Each leg goes to an engine of its role (package disagg), the
		// roles of the live fleet (a pod's label for a Kubernetes pool);
		// the members are built below, hence the closure.
		// vLLM's prefill engines (any KV connector's) serve a whole
		// request when nothing else can; SGLang's do not.
		roles = disagg.Roles{Of: func(b *fleet.Backend) string { return s.set.RoleOf(b) }, Whole: cfg.Disaggregation.Protocol == config.ProtocolVLLM}
		sc.Filters = append(sc.Filters, roles)
	}
	s.sched = scheduler.New(s.fleet, p, sc)
	s.sched.SetResponseBounds(cfg.Session.ResponseTTL, cfg.Session.MaxResponses)
	var decider *disagg.Decider
	if d := cfg.Disaggregation; cfg.MaySplit() && d.Split == config.SplitConditional {
		// The conditional split: the simulator's decision, on the same
		// scheduler's state and the same role filter as the legs.
		decider = &disagg.Decider{Sched: s.sched, Roles: roles,
			Costs: disagg.Costs{TransferLatency: d.KVTransferLatency, TransferPerToken: d.KVTransferTimePerToken}}
	}
	s.metrics = proxy.NewMetrics(s.fleet)
	reg := s.metrics.Registry()
	reg.MustRegister(s.sched.Collector())
	var tok *tokenize.Tokenizer
	var stream members.Stream
	series := s.metrics.Series()
	if sc.Precise != nil {
		if tok, err = tokenize.NewTokenizer(cfg.KVEvents, newTransport(cfg.Upstream, s.dialBackendTLS), reg); err != nil {
			return nil, err
		}
		follower := members.NewKVFollower(s.fleet, s.sched.Precise(), cfg.KVEvents, reg, logger)
		stream = follower.Follow
		series.Others = append(series.Others, follower.Families()...)
	}
	s.set = members.New(members.Config{
		Fleet:          s.fleet,
		Forget:         s.sched.Forget,
		SetCPUCapacity: s.sched.SetCPUCapacity,
		Transport:      s.upstream,
		Log:            logger,
		Series:         series,
		Health:         cfg.Health,
		DiscoverModels: cfg.Upstream.DiscoverModels,
		FleetSection:   cfg.Fleet,
		KVStream:       stream,
		Adapters:       s.sched.SetAdapters,
	}, entries)
	adm, err := newAdmission(cfg, s.fleet, reg)
	if err != nil {
		return nil, err
	}
	if err := s.newMonitor(); err != nil {
		return nil, err
	}
	if err := s.newSync(); err != nil {
		return nil, err
	}
	token, err := cfg.Admin.ResolveToken()
	if err != nil {
		return nil, err
	}
	decisions := admin.NewLog(cfg.Admin.Decisions)
	if token != "" {
		logger.Info("admin API enabled", "path", admin.Prefix)
	}
	s.adminAPI = admin.New(token, adminSource{s}, decisions)
	if s.tracer, err = proxy.NewTracer(cfg.Tracing, logger); err != nil {
		return nil, err
	}
	s.proxy, err = proxy.New(proxy.Parts{Config: cfg, Log: logger, Fleet: s.fleet, Scheduler: s.sched, Members: s.set,
		Upstream: s.upstream, Metrics: s.metrics, Tokenizer: tok, Admission: adm, Peers: s.peers,
		Tracer: s.tracer, Decisions: decisions, Admin: s.adminAPI, Decider: decider})
	if err != nil {
		return nil, err
	}
	s.newEPP()
	return s, nil
}

// wantsPrecise reports whether any entry has a KV event stream.
func wantsPrecise(entries []config.Entry) bool {
	for i := range entries {
		if entries[i].KVEvents != "" {
			return true
		}
	}
	return false
}

// Handler returns the router's HTTP handler.
func (s *Server) Handler() http.Handler { return s.proxy.Handler() }

// Proxy returns the data plane.
func (s *Server) Proxy() *proxy.Server { return s.proxy }

// Scheduler returns the scheduler, for in-process users that want to read
// its policy or prefix index.
func (s *Server) Scheduler() *scheduler.Scheduler { return s.sched }

// Fleet returns the fleet of backends, whose Load the router keeps.
func (s *Server) Fleet() *fleet.Fleet { return s.fleet }

// Members returns the control plane's set of backends.
func (s *Server) Members() *members.Set { return s.set }

// Peers returns the link to the other replicas, nil with sync off.
func (s *Server) Peers() *peerlink.Link { return s.peers }

// Metrics returns the router's metrics, for in-process users that read
// them without scraping (its Registry is a prometheus.Gatherer).
func (s *Server) Metrics() *proxy.Metrics { return s.metrics }

// Start listens on the configured addresses, starts the control plane
// (health checks, DNS pools, KV event streams), the engine monitor and the
// link to the peers, then serves in the background. Use Addr to learn the
// bound address when listen ends in ":0".
func (s *Server) Start() error {
	var aln net.Listener
	if a := s.cfg.Admin.Listen; a != "" {
		var err error
		if aln, err = s.listen(a); err != nil {
			return fmt.Errorf("admin.listen: %w", err)
		}
	}
	ln, err := s.listen(s.cfg.Listen)
	if err != nil {
		if aln != nil {
			_ = aln.Close()
		}
		return fmt.Errorf("listen: %w", err)
	}
	eln, ehealth, err := s.listenEPP()
	if err != nil {
		_ = ln.Close()
		if aln != nil {
			_ = aln.Close()
		}
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	s.mu.Lock()
	s.stop = stop
	s.mu.Unlock()
	s.set.Start(ctx)
	s.startMonitor(ctx)
	if s.peers != nil {
		if err := s.peers.Start(ctx); err != nil {
			stop()
			_ = ln.Close()
			for _, l := range []net.Listener{aln, eln, ehealth} {
				if l != nil {
					_ = l.Close()
				}
			}
			return err
		}
	}
	s.proxy.Serve(ln, aln)
	s.serveEPP(eln, ehealth)
	all := s.fleet.Snapshot().All
	s.log.Info("listening", "addr", ln.Addr().String(), "tls", s.cert.Load() != nil, "policy", s.sched.Policy().Name(), "backends", len(all))
	s.logRoles(all)
	return nil
}

// logRoles says at startup how the fleet's backends divide into roles and
// whether requests may be split over a prefill and a decode engine, and
// how (disaggregation.protocol and split), so that a P/D fleet's operator
// sees at once whether the router took it for one.
func (s *Server) logRoles(all []*fleet.Backend) {
	count := map[string]int{}
	for _, b := range all {
		count[s.set.RoleOf(b)]++
	}
	d := s.cfg.Disaggregation
	if count[config.RolePrefill] == 0 {
		if s.cfg.MaySplit() {
			s.log.Info("disaggregation: no prefill engine yet; requests are served whole until one joins",
				"protocol", d.Protocol, "split", d.Split, "decode", count[config.RoleDecode], "both", count[config.RoleBoth])
		}
		return
	}
	s.log.Info("disaggregation on: requests may be split over a prefill and a decode engine",
		"protocol", d.Protocol, "split", d.Split,
		"prefill", count[config.RolePrefill], "decode", count[config.RoleDecode], "both", count[config.RoleBoth])
}

// Addr returns the address Start listens on, or "" before Start.
func (s *Server) Addr() string { return s.proxy.Addr() }

// AdminAddr returns the address admin.listen is bound to, or "" before
// Start or without admin.listen.
func (s *Server) AdminAddr() string { return s.proxy.AdminAddr() }

// Shutdown stops the health checks and the monitor, stops accepting
// connections and waits for in-flight requests (streams included) to
// finish until ctx is done, when it closes the remaining connections,
// and flushes the spans still buffered; the link to the peers closes
// last, so that the requests' ends are shared too.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.checks.Wait()
	s.set.Wait()
	s.shutdownEPP(ctx)
	err := s.proxy.Shutdown(ctx)
	if terr := s.tracer.Shutdown(ctx); err == nil {
		err = terr
	}
	s.upstream.CloseIdleConnections()
	if s.scrapes != nil {
		s.scrapes.CloseIdleConnections()
	}
	if s.peers != nil {
		s.peers.Close()
	}
	return err
}

// Kill stops the router as a crash would, for tests and benchmarks of a
// lost replica: its link to the peers closes unflushed (Link.Abort), then
// its listeners and every connection close at once, with no drain; the
// requests in flight fail. Shutdown afterwards releases the rest.
func (s *Server) Kill() {
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	if s.peers != nil {
		s.peers.Abort()
	}
	s.proxy.Kill()
	s.killEPP()
}

// newSync builds the link to the other replicas when sync.url is set (its
// metrics join the router's); it connects in Start. A reload does not
// change it: the sync section takes effect at the next start.
func (s *Server) newSync() error {
	if !s.cfg.Sync.Enabled() {
		return nil
	}
	l, err := peerlink.New(peerlink.Config{Sync: s.cfg.Sync, Fleet: s.fleet, Scheduler: s.sched, Log: s.log, Registerer: s.metrics.Registry()})
	if err != nil {
		return err
	}
	s.peers = l
	return nil
}

// policyOptions is what the routing policy is built with from cfg, at
// startup and on a reload: its seed and load factor, and the fleet's KV
// transfer figure (disaggregation.kv_transfer_time_per_token) that the
// decode leg's pick weighs where a backend's preset gives none.
func policyOptions(cfg *config.Config) policy.Options {
	return policy.Options{
		Seed:             cfg.PolicyOptions.Seed,
		LoadFactor:       cfg.PolicyOptions.LoadFactor,
		TransferPerToken: cfg.Disaggregation.KVTransferTimePerToken,
	}
}
