// Package epp serves kvroute as a Gateway API Inference Extension Endpoint
// Picker: an Envoy external processor (the gRPC service
// envoy.service.ext_proc.v3.ExternalProcessor) that a gateway (Envoy
// Gateway, Istio, kgateway, NGINX Gateway Fabric's shim) asks where each
// request of an InferencePool goes, the gateway forwarding the bytes
// itself. It is a front of the request lifecycle (package lifecycle), as
// the HTTP data plane (package proxy) is:
//
//	gateway ──request_headers, request_body (chunks, or one)──▶ buffer (limits.max_body_bytes)
//	        ◀──request_headers response: x-gateway-destination-endpoint, envoy.lb metadata──  read, admit, split, Route
//	        ◀──request_body response: the body, passed back──
//	        ──response_headers (served endpoint, status)──▶ Served, Status
//	        ──response_body chunks──▶ FirstByte, Tally ──▶ Settle (end of the body, or of the stream)
//
// One stream is one request. What the lifecycle decides, judges and
// accounts is the HTTP front's (the same Plane, the same read, admission
// and split, through Router); this package only speaks the protocol: the
// decision's header and metadata, the subset hint, the fallbacks, the
// immediate responses in OpenAI's error shape, and the gRPC health service.
//
// It must not route (package scheduler does), judge an outcome (package
// lifecycle does) or keep per-backend state (packages fleet and members).
package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tracer"
)

// The protocol's names (docs/proposals/004-endpoint-picker-protocol in
// the Inference Extension).
const (
	// HeaderDestination carries the decision: the pick, then the
	// fallbacks, comma-separated ip:port.
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataLB is the namespace of the decision in the response's
	// dynamic metadata and of the served endpoint in the request's
	// metadata context.
	MetadataLB = "envoy.lb"
	// MetadataSubset is the namespace of the subset hint, and KeySubset
	// its key (a list of ip:port the pick must come from).
	MetadataSubset = "envoy.lb.subset_hint"
	KeySubset      = "x-gateway-destination-endpoint-subset"
	// KeyServed is the endpoint that served, on the response path.
	KeyServed = "x-gateway-destination-endpoint-served"
	// HeaderPrefiller names a split request's prefill engine (ip:port) to
	// the decode engine's P/D sidecar.
	HeaderPrefiller = "x-prefiller-host-port"
	// ServiceName is the ext_proc service's name, for the health service.
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// The health services' names besides it.
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
	// Front names the picker in the access log.
	Front = "epp"
	// headerRequestID is the request id's header (the access log's).
	headerRequestID = "x-request-id"
)

// Router is what the picker shares with the HTTP front (a *proxy.Server):
// the plane, and the read, admission and split of a request by the same
// rules. in carries the request's headers, the gateway's address and the
// stream's context; it has no body.
type Router interface {
	Plane() *lifecycle.Plane
	ReadFor(in *http.Request, r *lifecycle.Request, kind request.Kind, body []byte) *openai.Error
	ReadPassFor(in *http.Request, r *lifecycle.Request, body []byte) *openai.Error
	AdmitFor(in *http.Request, r *lifecycle.Request) (func(), *openai.Error)
	SplitFor(r *lifecycle.Request)
	// TokenizeFor is the precise index's keys of r's prompt, and what to
	// call with its status once it settled (nil for nothing).
	TokenizeFor(in *http.Request, r *lifecycle.Request) (keys []uint64, remember func(status int))
	// BeginAccess and EndAccess are the request's access log line, the
	// HTTP front's, naming front: its request id, then the line once it
	// settled (tally: its counted answer's, nil for none).
	BeginAccess(in *http.Request, front string) (id string, made bool)
	EndAccess(in *http.Request, r *lifecycle.Request, front string, tally *lifecycle.Tally)
	HoldBody(n int64) bool
	GiveBody(n int64)
}

// Parts are what the picker is given, built by the composition root.
type Parts struct {
	Config config.EPP
	// MaxBody is limits.max_body_bytes: a longer body gets a 413.
	MaxBody int64
	Router  Router
	Members *members.Set
	// Ready reports whether the pool is synced (readiness); nil: always.
	Ready func() bool
	// TLS serves the listeners over TLS (listen_tls); nil: plaintext.
	TLS *tls.Config
	// Tracer traces each request (trace.go), the router's tracer the HTTP
	// front writes with too; nil with tracing off.
	Tracer *tracer.Tracer
	Log    *slog.Logger
}

// Server is the picker: the ext_proc service and the health service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	p      Parts
	plane  *lifecycle.Plane
	health *health.Server

	mu      sync.Mutex
	servers []*grpc.Server
	stop    chan struct{}

	// reports is set once the data plane sent any response phase: it
	// reports answers, so a stream that ends before its answer's is a
	// request that ended (the client left). Until then a routed request
	// whose stream ends without one holds its load for its predicted
	// length (unreported).
	reports atomic.Bool
	// unreported are those requests' pending settles (under mu), run at
	// once by Shutdown.
	unreported map[*exchange]*time.Timer
}

// New builds the picker over p. It does no I/O.
func New(p Parts) *Server {
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{p: p, plane: p.Router.Plane(), health: health.NewServer(), stop: make(chan struct{})}
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.setReady(false)
	return s
}

// setReady sets the readiness and the ext_proc service's health.
func (s *Server) setReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(ServiceReadiness, st)
	s.health.SetServingStatus(ServiceName, st)
}

// UseTLS serves the listeners over TLS with c (listen_tls's certificate),
// before Serve.
func (s *Server) UseTLS(c *tls.Config) { s.p.TLS = c }

// readyEvery is how often readiness is read again.
const readyEvery = time.Second

// watchReady keeps the readiness services in step with Ready until Shutdown.
func (s *Server) watchReady() {
	t := time.NewTicker(readyEvery)
	defer t.Stop()
	last := false
	for {
		ready := s.p.Ready == nil || s.p.Ready()
		if ready != last {
			s.setReady(ready)
			last = ready
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// Serve serves the ext_proc service (and health) on ln and, when
// healthLn is not nil, the health service on it too, in the background.
func (s *Server) Serve(ln, healthLn net.Listener) {
	var opts []grpc.ServerOption
	if s.p.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.p.TLS)))
	}
	main := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(main, s)
	healthpb.RegisterHealthServer(main, s.health)
	servers := []*grpc.Server{main}
	lns := []net.Listener{ln}
	if healthLn != nil {
		hs := grpc.NewServer(opts...)
		healthpb.RegisterHealthServer(hs, s.health)
		servers, lns = append(servers, hs), append(lns, healthLn)
	}
	s.mu.Lock()
	s.servers = servers
	s.mu.Unlock()
	for i, g := range servers {
		go func() {
			if err := g.Serve(lns[i]); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				s.p.Log.Error("endpoint picker", "addr", lns[i].Addr().String(), "err", err)
			}
		}()
	}
	go s.watchReady()
	s.p.Log.Info("endpoint picker listening", "addr", ln.Addr().String())
}

// Shutdown stops accepting streams and waits for the open ones (each a
// request, streams included) until ctx is done, when it ends them.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.health.Shutdown()
	s.settleUnreported()
	done := make(chan struct{})
	go func() {
		for _, g := range servers {
			g.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, g := range servers {
			g.Stop()
		}
		<-done
	}
}

// holdUnreported keeps x's load on its backend for d, then settles it
// (exchange.end).
func (s *Server) holdUnreported(x *exchange, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unreported == nil {
		s.unreported = map[*exchange]*time.Timer{}
	}
	s.unreported[x] = time.AfterFunc(d, func() { s.settleHeld(x) })
}

// settleHeld settles a held request once (its timer or Shutdown).
func (s *Server) settleHeld(x *exchange) {
	s.mu.Lock()
	t, ok := s.unreported[x]
	delete(s.unreported, x)
	s.mu.Unlock()
	if !ok {
		return
	}
	t.Stop()
	s.plane.Settle(&x.Request, false)
}

// settleUnreported settles every held request now.
func (s *Server) settleUnreported() {
	s.mu.Lock()
	held := make([]*exchange, 0, len(s.unreported))
	for x := range s.unreported {
		held = append(held, x)
	}
	s.mu.Unlock()
	for _, x := range held {
		s.settleHeld(x)
	}
}

// Process serves one request's stream (the ext_proc service).
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := newExchange(s, stream)
	defer x.end()
	return x.run()
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)
