// Package proxy is the data plane of `kvroute serve`: one exchange per
// request (exchange.go) reads and parses the body once, asks the scheduler
// for a backend, forwards the original bytes with the standard library's
// reverse proxy (streams flushed event by event), retries on another
// backend when one fails before the first response byte, and settles the
// request once: metrics, decision log, load release, admission wake. It
// also serves /v1/models, the probes, /metrics and the admin API, and wires
// the control plane (package members, which owns everything known about
// each backend) and the engine monitor.
//
// It must not make routing decisions of its own for completions (package
// scheduler does) nor keep per-backend state (package members does), and
// it never alters a request or response body: it only ever appends an
// error event to an event stream its backend broke (streamerr.go).
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/monitor"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/peerlink"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Server is one router: the control plane's set of backends (package
// members), a scheduler with one policy, and the data plane in front of
// them: one exchange per request (exchange.go).
type Server struct {
	cfg      *config.Config
	log      *slog.Logger
	fleet    *fleet.Fleet
	sched    *scheduler.Scheduler
	set      *members.Set
	upstream *http.Transport
	metrics  *metrics
	monitor  *monitor.Monitor // nil with engines.enabled off
	scrapes  *http.Transport  // the monitor's connections; nil when monitor is
	parse    request.Options
	handler  http.Handler
	// proxyLog is the reverse proxy's error log, at debug level.
	proxyLog *log.Logger
	// splitProto is the disaggregation protocol when the fleet has
	// prefill engines, "" otherwise (disagg.go).
	splitProto string
	// cert is the listener's certificate (listen_tls), replaced on reload;
	// nil without TLS. upstreamTLS is upstream.tls, replaced on reload.
	cert        atomic.Pointer[tls.Certificate]
	upstreamTLS atomic.Pointer[config.BackendTLS]
	// tracing is the OpenTelemetry tracer; nil with tracing off.
	tracing *tracing
	// creds are the API keys and the sources of priority, replaced on
	// reload.
	creds atomic.Pointer[credentials]
	// precise gets requests' token ids for precise routing (precise.go);
	// nil when no backend has a KV event stream.
	precise *precise
	// streamMetrics count the KV event streams (kvstream.go); nil with
	// precise.
	streamMetrics *streamMetrics

	// decisions is the admin API's log of the last routing decisions,
	// and adminAPI the handler mounted at /admin/.
	decisions *admin.Log
	adminAPI  *admin.Handler

	// adm is the admission queue; nil when no admission limit is set.
	adm *admission.Controller
	// plane is what every request's lifecycle shares (exchange.go).
	plane *lifecycle.Plane
	// bodies is the budget of request bodies held in memory, and shares
	// each client's part of it while its bodies arrive (body.go).
	bodies budget
	shares shares
	// limits counts and logs the client limits hit (hits.go).
	limits *limitHits
	// via is the router's name in the Via headers of the requests it
	// forwards, which tells it a request that looped back (via.go).
	via string
	// passAllow are the endpoints passed through (passthrough.allow).
	passAllow []config.Endpoint

	// failures limits failed API key and admin token checks per client;
	// nil when off.
	failures *authFailures

	// modelList is the cached GET /v1/models answer.
	modelList modelCache

	// peers is the link to the other replicas; nil with sync off.
	peers *peerlink.Link

	// reload serialises Reload; last is the configuration last applied
	// (the startup one until the first reload).
	reload sync.Mutex
	last   *config.Config

	mu      sync.Mutex // guards the fields below
	httpSrv *http.Server
	ln      net.Listener
	// adminSrv and adminLn serve admin.listen; nil without it.
	adminSrv *http.Server
	adminLn  net.Listener
	stop     context.CancelFunc
	checks   sync.WaitGroup
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
	p, err := policy.New(cfg.Policy, policy.Options{Seed: cfg.PolicyOptions.Seed, LoadFactor: cfg.PolicyOptions.LoadFactor})
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		log:      logger,
		fleet:    fleet.New(),
		parse:    request.Options{SessionField: cfg.Session.BodyField, MaxMessages: cfg.Limits.MaxMessages},
		last:     cfg,
		proxyLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	s.upstream = newTransport(cfg.Upstream, s.dialBackendTLS)
	s.upstreamTLS.Store(cfg.Upstream.TLS)
	if cfg.ListenTLS.Enabled() {
		c, err := cfg.ListenTLS.Load()
		if err != nil {
			return nil, err
		}
		s.cert.Store(c)
	}
	s.bodies.limit = cfg.Limits.BufferedBytes()
	s.shares.limit = cfg.Limits.BufferedBytesPerClient()
	s.via = viaName()
	s.passAllow = cfg.Passthrough.Endpoints()
	sc := scheduler.Config{BlockChars: cfg.Prefix.BlockChars, Capacity: cfg.Prefix.CapacityBlocks}
	if cfg.Split() {
		s.splitProto = cfg.Disaggregation.Protocol
		sc.Filters = append(sc.Filters, disagg.Roles{Of: s.roleOf})
	}
	if wantsPrecise(entries) {
		pc := cfg.KVEvents.Precise()
		sc.Precise = &pc
	}
	s.sched = scheduler.New(s.fleet, p, sc)
	s.metrics = newMetrics(s.fleet)
	s.limits = newLimitHits(s.metrics.reg, logger)
	if sc.Precise != nil {
		if s.precise, err = newPrecise(cfg, s.fleet, s.sched.Precise(), s.metrics.reg, s.dialBackendTLS); err != nil {
			return nil, err
		}
		s.streamMetrics = newStreamMetrics(s.metrics.reg)
	}
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvroute_buffered_body_bytes",
		Help: "Bytes of request bodies the router holds in memory (read whole before routing, kept until the request ends), against limits.max_buffered_bytes.",
	}, func() float64 { return float64(s.bodies.used.Load()) }))
	var stream members.Stream
	if s.precise != nil {
		stream = s.kvStream
	}
	s.set = members.New(members.Config{
		Fleet:          s.fleet,
		Forget:         s.sched.Index().RemoveBackend,
		Transport:      s.upstream,
		Log:            logger,
		Series:         s.metrics.series(),
		Health:         cfg.Health,
		DiscoverModels: cfg.Upstream.DiscoverModels,
		FleetSection:   cfg.Fleet,
		KVStream:       stream,
	}, entries)
	if s.adm, err = newAdmission(cfg, s.fleet, s.metrics.reg); err != nil {
		return nil, err
	}
	if err := s.newMonitor(); err != nil {
		return nil, err
	}
	if err := s.newSync(); err != nil {
		return nil, err
	}
	if s.adminAPI, err = s.newAdmin(); err != nil {
		return nil, err
	}
	s.plane = s.newPlane()
	if s.tracing, err = newTracing(cfg.Tracing, logger); err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	creds, err := newCredentials(cfg)
	if err != nil {
		return nil, err
	}
	s.creds.Store(creds)
	s.failures = newAuthFailures(cfg.Limits.AuthFailuresPerMinute)
	s.handler = s.accessLog(s.guardLoop(guardFraming(s.limitBody(s.requireKey(s.routes())))))
	return s, nil
}

// Handler returns the router's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Scheduler returns the scheduler, for in-process users that want to read
// its policy or prefix index.
func (s *Server) Scheduler() *scheduler.Scheduler { return s.sched }

// Fleet returns the fleet of backends, whose Load the router keeps.
func (s *Server) Fleet() *fleet.Fleet { return s.fleet }

// Start listens on the configured address, serves in the background and
// starts the active health checks. Use Addr to learn the bound address
// when listen ends in ":0".
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
	ctx, stop := context.WithCancel(context.Background())
	conns := newConnLimit(ln, s.cfg.Limits.Connections(fileLimit()), s.limits)
	ln = conns
	srv := s.httpServer(s.handler)
	srv.ConnState = conns.track
	var asrv *http.Server
	if aln != nil {
		mux := http.NewServeMux()
		mux.Handle(admin.Prefix, s.failures.guardAdmin(s.adminAPI))
		mux.Handle("/metrics", s.metrics.handler())
		asrv = s.httpServer(guardFraming(mux))
	}
	s.mu.Lock()
	s.httpSrv, s.ln, s.stop, s.adminSrv, s.adminLn = srv, ln, stop, asrv, aln
	s.mu.Unlock()
	s.set.Start(ctx)
	s.startMonitor(ctx)
	if err := s.startSync(ctx); err != nil {
		stop()
		_ = ln.Close()
		if aln != nil {
			_ = aln.Close()
		}
		return err
	}
	s.serve(srv, ln)
	if asrv != nil {
		s.serve(asrv, aln)
		s.log.Info("admin API listening", "addr", aln.Addr().String())
	}
	s.log.Info("listening", "addr", ln.Addr().String(), "tls", s.cert.Load() != nil, "policy", s.sched.Policy().Name(), "backends", len(s.fleet.Snapshot().All))
	return nil
}

// httpServer is an HTTP server for h with the client limits.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.Limits.ReadHeaderTimeout,
		MaxHeaderBytes:    int(s.cfg.Limits.MaxHeaderBytes),
		IdleTimeout:       s.cfg.Limits.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// serve runs srv on ln in the background.
func (s *Server) serve(srv *http.Server, ln net.Listener) {
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// AdminAddr returns the address admin.listen is bound to, or "" before
// Start or without admin.listen.
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Addr returns the address Start listens on, or "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Shutdown stops accepting connections and health checks, and waits for
// in-flight requests (streams included) to finish until ctx is done, when
// it closes the remaining connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, stop, asrv := s.httpSrv, s.stop, s.adminSrv
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.checks.Wait()
	s.set.Wait()
	var err error
	if asrv != nil {
		_ = asrv.Close() // admin calls are short; nothing to wait for
	}
	defer s.stopSync() // after the requests: their ends are shared too
	if srv != nil {
		if err = srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	s.upstream.CloseIdleConnections()
	if s.scrapes != nil {
		s.scrapes.CloseIdleConnections()
	}
	if terr := s.tracing.shutdown(ctx); err == nil {
		err = terr
	}
	return err
}

// newTransport returns the transport to the backends, which opens https
// connections with dialTLS. Compression is off so that the client's
// Accept-Encoding reaches the backend and the response bytes pass through
// untouched.
func newTransport(c config.Upstream, dialTLS dialFunc) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: c.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		DialTLSContext:        dialTLS,
		ResponseHeaderTimeout: c.ResponseHeaderTimeout,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}

// routes builds the handler's mux.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Chat, w, r) })
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Completion, w, r) })
	mux.HandleFunc("/v1/models", s.models)
	mux.HandleFunc("/v1/", s.passthrough)
	live := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("/healthz", live)
	// /health is what vLLM, SGLang, TGI and llama.cpp serve: a probe or a
	// load balancer set up for an engine works on the router too.
	mux.HandleFunc("/health", live)
	mux.HandleFunc("/readyz", s.readyz)
	if s.cfg.Admin.Listen == "" {
		mux.Handle(admin.Prefix, s.failures.guardAdmin(s.adminAPI))
	}
	mux.Handle("/metrics", s.metrics.handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, "not_found", "no route for "+r.Method+" "+r.URL.Path, 0)
	})
	return mux
}

// readyz answers 200 when at least one backend is healthy.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	n := len(s.fleet.Snapshot().Healthy)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if n == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("no healthy backend\n"))
		return
	}
	_, _ = fmt.Fprintf(w, "ok: %d healthy backends\n", n)
}

// bufferPool recycles the reverse proxy's copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
