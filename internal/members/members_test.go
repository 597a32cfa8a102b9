package members

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
)

// newSet builds a set over the config's entries, with no network and no
// metrics.
func newSet(t *testing.T, c *config.Config) (*Set, *fleet.Fleet, *[]int) {
	t.Helper()
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	f := fleet.New()
	var forgot []int
	s := New(Config{Fleet: f, Forget: func(id int) { forgot = append(forgot, id) }, Transport: http.DefaultTransport,
		Health: c.Health, FleetSection: c.Fleet}, es)
	return s, f, &forgot
}

// TestMaxContext: the largest context among the backends serving a model,
// each backend's from its own entry or its /v1/models; a backend of
// unknown context lifts the limit; one serving other models does not count.
func TestMaxContext(t *testing.T) {
	models := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"data":[{"id":"m","max_model_len":8192},{"id":"n"},{"id":"llama","meta":{"n_ctx":16384,"n_ctx_train":131072}}]}`))
	}))
	defer models.Close()
	tests := []struct {
		name     string
		backends []config.Backend
		model    string
		want     int
		known    bool
	}{
		{"configured", []config.Backend{{URL: "http://a:1", Models: []string{"m"}, MaxModelLen: 100}, {URL: "http://b:1", Models: []string{"m"}, MaxModelLen: 300}}, "m", 300, true},
		{"other model ignored", []config.Backend{{URL: "http://a:1", Models: []string{"m"}, MaxModelLen: 100}, {URL: "http://b:1", Models: []string{"x"}}}, "m", 100, true},
		{"unknown lifts", []config.Backend{{URL: "http://a:1", Models: []string{"m"}, MaxModelLen: 100}, {URL: "http://b:1", Models: []string{"m"}}}, "m", 0, false},
		{"discovered", []config.Backend{{URL: models.URL}}, "m", 8192, true},
		{"discovered without a length", []config.Backend{{URL: models.URL}}, "n", 0, false},
		{"configured wins over discovered", []config.Backend{{URL: models.URL, MaxModelLen: 50}}, "m", 50, true},
		{"llama.cpp meta.n_ctx", []config.Backend{{URL: models.URL}}, "llama", 16384, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config.Default()
			c.Backends = tt.backends
			c.Health.Timeout = time.Second
			es, err := c.Entries()
			if err != nil {
				t.Fatal(err)
			}
			s := New(Config{Fleet: fleet.New(), Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health, DiscoverModels: true}, es)
			got, known := s.MaxContext(tt.model)
			if got != tt.want || known != tt.known {
				t.Errorf("MaxContext(%q) = %d, %v; want %d, %v", tt.model, got, known, tt.want, tt.known)
			}
		})
	}
}

// TestApplyKeepsRecords: a reload keeps the record (and breaker) of an
// unchanged entry, updates its context length in place, adds new entries
// and drains removed ones, whose prefixes are forgotten after the rejoin
// grace.
func TestApplyKeepsRecords(t *testing.T) {
	c := config.Default()
	c.Backends = []config.Backend{{URL: "http://a:1", Name: "a", Models: []string{"m"}}, {URL: "http://b:1", Name: "b", Models: []string{"m"}}}
	s, f, forgot := newSet(t, c)
	a := s.ByName("a")
	s.Failed(a, errTest{})
	c2 := config.Default()
	c2.Backends = []config.Backend{{URL: "http://a:1", Name: "a", Models: []string{"m"}, MaxModelLen: 77}, {URL: "http://c:1", Name: "c", Models: []string{"m"}}}
	es, err := c2.Entries()
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(es, c2.Fleet)
	if s.ByName("a") != a || a.Breaker().Fails != 1 || a.ContextOf("m") != 77 {
		t.Errorf("a: same record %v, fails %d, context %d", s.ByName("a") == a, a.Breaker().Fails, a.ContextOf("m"))
	}
	if s.ByName("c") == nil || s.Of(s.ByName("c").B) != s.ByName("c") {
		t.Error("c was not added, or Of does not find it by ID")
	}
	if b := s.ByName("b"); b != nil {
		t.Errorf("b still listed: %+v", b.B.Name)
	}
	if len(*forgot) != 0 || len(f.Snapshot().All) != 2 {
		t.Errorf("forgotten %v, fleet %d backends; want b's index kept through its grace and two backends", *forgot, len(f.Snapshot().All))
	}
	s.mu.Lock()
	s.release(time.Now().Add(c2.Fleet.RejoinGrace))
	s.mu.Unlock()
	if len(*forgot) != 1 || len(s.All()) != 2 {
		t.Errorf("after the grace: forgotten %v, %d records; want b's ID forgotten and two records", *forgot, len(s.All()))
	}
}

// TestLimitsToFleet: an entry's max_num_seqs, max_num_batched_tokens and
// max_model_len reach the fleet, where the kvroute policy reads them, and a
// reload updates them in place.
func TestLimitsToFleet(t *testing.T) {
	c := config.Default()
	c.Backends = []config.Backend{{URL: "http://a:1", Name: "a", Models: []string{"m"}, MaxNumSeqs: 8, MaxNumBatchedTokens: 512, MaxModelLen: 4096}}
	s, _, _ := newSet(t, c)
	a := s.ByName("a")
	if got, want := a.B.Limits(), (fleet.Limits{MaxNumSeqs: 8, MaxBatchedTokens: 512, ContextLen: 4096, PlausibleSeqs: 8}); got != want {
		t.Fatalf("limits %+v, want %+v", got, want)
	}
	c.Backends[0].MaxNumSeqs, c.Backends[0].MaxNumBatchedTokens, c.Backends[0].MaxModelLen = 16, 0, 0
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(es, c.Fleet)
	if got, want := a.B.Limits(), (fleet.Limits{MaxNumSeqs: 16, PlausibleSeqs: 16}); got != want {
		t.Fatalf("after a reload: limits %+v, want %+v", got, want)
	}
}

// TestPresetPrior: an entry's preset gives its backend's cost model the
// preset's prior (coefficients, chunk, KV transfer) instead of the generic
// one; a reload that keeps it keeps what the backend learned, and one that
// drops it returns the backend to the generic prior.
func TestPresetPrior(t *testing.T) {
	c := config.Default()
	c.Backends = []config.Backend{{URL: "http://a:1", Name: "a", Preset: "h100-llama3-70b-tp4"}, {URL: "http://b:1", Name: "b"}}
	s, _, _ := newSet(t, c)
	p, err := engine.LookupPreset("h100-llama3-70b-tp4")
	if err != nil {
		t.Fatal(err)
	}
	want := costmodel.New(p.Costs()).Prior()
	a, b := s.ByName("a").B, s.ByName("b").B
	if got := a.Cost().Prior(); got != want {
		t.Fatalf("prior %+v, want the preset's %+v", got, want)
	}
	if got, generic := b.Cost().Prior(), costmodel.New(costmodel.Generic()).Prior(); got != generic {
		t.Fatalf("prior of a backend with no preset %+v, want the generic %+v", got, generic)
	}
	if a.Chunk() != int64(p.MaxBatchedTokens) {
		t.Errorf("chunk %d, want the preset's %d", a.Chunk(), p.MaxBatchedTokens)
	}
	learned := a.Cost()
	apply := func() {
		t.Helper()
		es, err := c.Entries()
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(es, c.Fleet)
	}
	apply()
	if a.Cost() != learned {
		t.Error("a reload with the same preset replaced the cost model")
	}
	c.Backends[0].Preset = ""
	apply()
	if got, generic := a.Cost().Prior(), costmodel.New(costmodel.Generic()).Prior(); got != generic {
		t.Errorf("after the preset was dropped: prior %+v, want the generic %+v", got, generic)
	}
}

type errTest struct{}

func (errTest) Error() string { return "test failure" }

// TestReportedContext: the context length the engine reports per request
// (llama.cpp's /slots n_ctx) counts when nothing is configured, and the
// smaller of it and /v1/models' wins (llama.cpp's /v1/models gives all
// slots' context together).
func TestReportedContext(t *testing.T) {
	tests := []struct {
		name                 string
		configured, reported int
		discovered           map[string]int
		want                 int
	}{
		{"nothing known", 0, 0, nil, 0},
		{"reported only", 0, 4096, nil, 4096},
		{"discovered only", 0, 0, map[string]int{"m": 16384}, 16384},
		{"smaller of the two", 0, 4096, map[string]int{"m": 16384}, 4096},
		{"configured wins", 1000, 4096, map[string]int{"m": 16384}, 1000},
	}
	for _, tt := range tests {
		m := &Member{B: fleet.New().Add("b", nil, nil), discovered: tt.discovered}
		m.configured.Store(int64(tt.configured))
		m.SetReportedContext(tt.reported)
		if got := m.ContextOf("m"); got != tt.want {
			t.Errorf("%s: ContextOf = %d, want %d", tt.name, got, tt.want)
		}
		// The fleet's copy, which the kvroute policy reads.
		if got := m.B.Limits().ContextLen; got != tt.want {
			t.Errorf("%s: fleet context length %d, want %d", tt.name, got, tt.want)
		}
	}
}
