package fault

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/internal/admin"
)

const token = "0123456789abcdef0123"

// source is the router state behind a real admin API: named backends,
// their in-flight counts, and the calls made.
type source struct {
	mu       sync.Mutex
	inFlight map[string]int64
	draining map[string]bool
	calls    []string
}

func (s *source) Backends() []admin.Backend {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []admin.Backend
	for name, n := range s.inFlight {
		out = append(out, admin.Backend{Name: name, Draining: s.draining[name], Load: admin.Load{InFlight: n}})
	}
	return out
}

func (s *source) change(name, action string, drain bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.inFlight[name]; !ok {
		return admin.ErrUnknownBackend
	}
	s.calls = append(s.calls, action+" "+name)
	s.draining[name] = drain
	return nil
}

func (s *source) Drain(name string) error   { return s.change(name, "drain", true) }
func (s *source) Undrain(name string) error { return s.change(name, "undrain", false) }

// fakeRouter serves the real admin API over src and a /metrics page with
// kvroute_migrations_total as the router registers it.
func fakeRouter(t *testing.T, src *source) (*httptest.Server, *prometheus.CounterVec) {
	t.Helper()
	reg := prometheus.NewRegistry()
	moves := prometheus.NewCounterVec(prometheus.CounterOpts{Name: migrations, Help: "moves"}, []string{"reason", "outcome"})
	reg.MustRegister(moves)
	mux := http.NewServeMux()
	mux.Handle(admin.Prefix, admin.New(token, src, admin.NewLog(1)))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, moves
}

// TestAdmin drives a router in another process through its admin API
// and /metrics: drain and undrain by name (a DNS pool's name holds a
// slash), the in-flight count, the moved streams summed over reasons and
// nothing else; a wrong token or an unknown backend is an error that
// says why.
func TestAdmin(t *testing.T) {
	const pooled = "pool/10.0.0.7:8000"
	src := &source{inFlight: map[string]int64{"engine-0": 3, pooled: 0}, draining: map[string]bool{}}
	srv, moves := fakeRouter(t, src)
	a := Admin{URL: srv.URL, Token: token}

	if err := a.Drain("engine-0"); err != nil {
		t.Fatal(err)
	}
	if err := a.Drain(pooled); err != nil {
		t.Fatal(err)
	}
	if err := a.Undrain(pooled); err != nil {
		t.Fatal(err)
	}
	if want := []string{"drain engine-0", "drain " + pooled, "undrain " + pooled}; !slices.Equal(src.calls, want) {
		t.Errorf("calls %q, want %q", src.calls, want)
	}
	if n, err := a.InFlight("engine-0"); err != nil || n != 3 {
		t.Errorf("in flight %d (%v), want 3", n, err)
	}
	if _, err := a.InFlight("engine-9"); err == nil || !strings.Contains(err.Error(), "engine-9") {
		t.Errorf("in flight of an unknown backend: %v", err)
	}
	if err := a.Drain("engine-9"); err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "no backend is named 'engine-9'") {
		t.Errorf("drain of an unknown backend: %v", err)
	}
	if err := (Admin{URL: srv.URL, Token: "wrong-token-wrong-token"}).Drain("engine-0"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a wrong token: %v", err)
	}

	moves.WithLabelValues("broken", "moved").Add(4)
	moves.WithLabelValues("drain", "moved").Add(2)
	moves.WithLabelValues("broken", "failed").Add(7)
	if n, err := a.Moved(); err != nil || n != 6 {
		t.Errorf("moved %d (%v), want 6", n, err)
	}
	// The in-process router's registry reads the same.
	l := Local{Metrics: prometheus.Gatherers{prometheus.DefaultGatherer, gathererOf(t, moves)}}
	if n, err := l.Moved(); err != nil || n != 6 {
		t.Errorf("local: moved %d (%v), want 6", n, err)
	}
	if _, err := (Admin{URL: srv.URL + "/nowhere", Token: token}).Moved(); err == nil {
		t.Error("a page that is not the router's metrics read as moves")
	}
}

func gathererOf(t *testing.T, c prometheus.Collector) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewRegistry()
	// A second registry takes the same collector: it only reads it.
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}
