// Package proxy is the data plane of `kvroute serve`: the HTTP front of
// the request lifecycle (package lifecycle). One exchange per request
// (exchange.go) reads the body within the client's budgets and hands it
// to the lifecycle, which parses it once, routes each of its legs (one,
// or a prefill and a decode leg: disagg.go), runs their attempt loops and
// settles the request once (metrics, decision log, breaker, load release,
// admission wake); the exchange forwards with the standard library's
// reverse proxy (streams flushed event by event) and relays the answer.
// It also serves /v1/models, the probes, /metrics and the admin API, with
// the client limits (connections, bodies, API keys) in front of them.
//
// It is given every part it uses already built (Parts: the control plane's
// members, the scheduler, admission, the link to the peers, the tokenizer,
// the admin API); package server builds them from the configuration,
// starts and stops them, and applies reloads.
//
// It must not make routing decisions of its own for completions (package
// scheduler does) nor keep per-backend state (package members does). It
// forwards a client's bytes as sent, but for the legs of a split request,
// whose bodies the disaggregation protocol rewrites (package disagg), and
// it only ever appends an error event to an event stream its backend
// broke (streamerr.go).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/peerlink"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// Server is the data plane: one exchange per request (exchange.go) over
// the parts it is given (Parts).
type Server struct {
	cfg      *config.Config
	log      *slog.Logger
	fleet    *fleet.Fleet
	sched    *scheduler.Scheduler
	set      *members.Set
	upstream *http.Transport
	metrics  *Metrics
	parse    request.Options
	handler  http.Handler
	// proxyLog is the reverse proxy's error log, at debug level.
	proxyLog *log.Logger
	// splitter is the split decision (disagg.go); its Protocol is ""
	// unless the fleet may have prefill engines.
	splitter *disagg.Splitter
	// noDecodeWarned is when the last warning of a model served whole for
	// want of a decode engine was logged (unix nanoseconds; disagg.go).
	noDecodeWarned atomic.Int64
	// tracing is the OpenTelemetry tracer; nil with tracing off.
	tracing *tracing
	// creds are the API keys and the sources of priority, replaced on
	// reload.
	creds atomic.Pointer[credentials]
	// precise gets requests' token ids for precise routing (precise.go);
	// nil when no backend has a KV event stream.
	precise *tokenize.Tokenizer

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

	mu      sync.Mutex // guards the fields below
	httpSrv *http.Server
	ln      net.Listener
	// adminSrv and adminLn serve admin.listen; nil without it.
	adminSrv *http.Server
	adminLn  net.Listener
}

// Parts are what the data plane is given, built by the composition root
// (package server) from the configuration.
type Parts struct {
	// Config must have passed Validate; the data plane reads its limits,
	// timeouts and sections as they were at startup, but for what Reload
	// replaces.
	Config *config.Config
	// Log nil discards logs.
	Log       *slog.Logger
	Fleet     *fleet.Fleet
	Scheduler *scheduler.Scheduler
	Members   *members.Set
	// Upstream carries the requests to the backends.
	Upstream *http.Transport
	// Metrics is the router's registry with the data plane's families
	// (NewMetrics).
	Metrics *Metrics
	// Tokenizer gets token ids for precise routing; nil without.
	Tokenizer *tokenize.Tokenizer
	// Admission is the admission queue; nil admits everything.
	Admission *admission.Controller
	// Peers is the link to the other replicas; nil with sync off.
	Peers *peerlink.Link
	// Tracer traces each exchange (NewTracer); nil with tracing off.
	Tracer *Tracer
	// Decisions is the log the exchanges record to, and Admin the API
	// mounted at /admin/ (on the client listener without admin.listen).
	Decisions *admin.Log
	Admin     *admin.Handler
	// Decider says which requests of a fleet with prefill engines are
	// split (disaggregation.split conditional); nil splits every request
	// a prefill engine can take.
	Decider *disagg.Decider
}

// New builds the data plane over p. It does no I/O.
func New(p Parts) (*Server, error) {
	cfg, logger := p.Config, p.Log
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:       cfg,
		log:       logger,
		fleet:     p.Fleet,
		sched:     p.Scheduler,
		set:       p.Members,
		upstream:  p.Upstream,
		metrics:   p.Metrics,
		precise:   p.Tokenizer,
		adm:       p.Admission,
		peers:     p.Peers,
		decisions: p.Decisions,
		adminAPI:  p.Admin,
		tracing:   p.Tracer,
		parse:     request.Options{SessionField: cfg.Session.BodyField, MaxMessages: cfg.Limits.MaxMessages},
		proxyLog:  slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	s.bodies.limit = cfg.Limits.BufferedBytes()
	s.shares.limit = cfg.Limits.BufferedBytesPerClient()
	s.via = viaName()
	s.passAllow = cfg.Passthrough.Endpoints()
	s.splitter = &disagg.Splitter{Decider: p.Decider, Fleet: p.Fleet, RoleOf: p.Members.RoleOf}
	if cfg.MaySplit() {
		s.splitter.Protocol = cfg.Disaggregation.Protocol
		s.splitter.Transfer = disagg.Transfer{Hosts: cfg.Disaggregation.TransferHosts}
	}
	s.limits = newLimitHits(s.metrics.reg, logger)
	s.metrics.reg.MustRegister(&auditCollector{f: s.fleet, sched: s.sched})
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvroute_buffered_body_bytes",
		Help: "Bytes of request bodies the router holds in memory (read whole before routing, kept until the request ends), against limits.max_buffered_bytes.",
	}, func() float64 { return float64(s.bodies.used.Load()) }))
	s.plane = s.newPlane()
	creds, err := newCredentials(cfg)
	if err != nil {
		return nil, err
	}
	s.creds.Store(creds)
	s.failures = newAuthFailures(cfg.Limits.AuthFailuresPerMinute)
	s.handler = s.accessLog(s.guardLoop(guardFraming(s.limitBody(s.requireKey(s.routes())))))
	return s, nil
}

// Tracer is the data plane's OpenTelemetry tracer (tracing.go).
type Tracer = tracing

// NewTracer builds the tracer of the tracing section, or returns nil
// when tracing is off.
func NewTracer(c config.Tracing, log *slog.Logger) (*Tracer, error) {
	t, err := newTracing(c, log)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return t, nil
}

// Shutdown flushes the spans still buffered; a nil tracer has none.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// Handler returns the router's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// PrepareReload reads what the data plane takes from cfg on a reload (the
// API keys and the sources of priority) and returns the function that
// applies it: nothing is applied unless every part of a reload could be
// read.
func (s *Server) PrepareReload(cfg *config.Config) (apply func(), err error) {
	creds, err := newCredentials(cfg)
	if err != nil {
		return nil, err
	}
	return func() { s.creds.Store(creds) }, nil
}

// Serve serves the client API on ln (wrapped in the connection limit)
// and, when adminLn is not nil, the admin API and /metrics on it, in the
// background.
func (s *Server) Serve(ln, adminLn net.Listener) {
	conns := newConnLimit(ln, s.cfg.Limits.Connections(fileLimit()), s.limits)
	srv := s.httpServer(s.handler)
	srv.ConnState = conns.track
	var asrv *http.Server
	if adminLn != nil {
		mux := http.NewServeMux()
		mux.Handle(admin.Prefix, s.failures.guardAdmin(s.adminAPI))
		mux.Handle("/metrics", s.metrics.handler())
		asrv = s.httpServer(guardFraming(mux))
	}
	s.mu.Lock()
	s.httpSrv, s.ln, s.adminSrv, s.adminLn = srv, conns, asrv, adminLn
	s.mu.Unlock()
	s.serve(srv, conns)
	if asrv != nil {
		s.serve(asrv, adminLn)
		s.log.Info("admin API listening", "addr", adminLn.Addr().String())
	}
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
// Serve or without admin.listen.
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Addr returns the address Serve serves on, or "" before Serve.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Shutdown closes the admin listener, stops accepting connections and
// waits for in-flight requests (streams included) to finish until ctx is
// done, when it closes the remaining connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, asrv := s.httpSrv, s.adminSrv
	s.mu.Unlock()
	var err error
	if asrv != nil {
		_ = asrv.Close() // admin calls are short; nothing to wait for
	}
	if srv != nil {
		if err = srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	return err
}

// Kill closes the listeners and every connection at once, with no drain,
// as a crash would: the requests in flight fail.
func (s *Server) Kill() {
	s.mu.Lock()
	srv, asrv := s.httpSrv, s.adminSrv
	s.mu.Unlock()
	if asrv != nil {
		_ = asrv.Close()
	}
	if srv != nil {
		_ = srv.Close()
	}
}

// routes builds the handler's mux.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Chat, w, r) })
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Completion, w, r) })
	mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Responses, w, r) })
	mux.HandleFunc("/v1/messages", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(request.Messages, w, r) })
	mux.HandleFunc("/v1/responses/", s.serveStored)
	mux.HandleFunc("/v1/models", s.models)
	mux.HandleFunc("/v1/", s.passthrough)
	for _, p := range config.RootEndpoints {
		mux.HandleFunc(p, s.passthrough)
	}
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
	mux.Handle("/metrics", s.metricsPage())
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
