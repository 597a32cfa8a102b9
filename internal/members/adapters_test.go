package members

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// modelsServer serves a /v1/models of base and n adapters of it.
func modelsServer(t *testing.T, base string, n int) *httptest.Server {
	t.Helper()
	data := []map[string]any{{"id": base, "object": "model"}}
	for i := range n {
		data = append(data, map[string]any{"id": fmt.Sprintf("adapter-%d", i), "object": "model", "parent": base})
	}
	body, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(srv.Close)
	return srv
}

// The adapters an engine listed were learned for good: a backend's
// removal left them known (the heap grew with every refetch of new
// names). The fleet's adapters are its records' now: a released record
// takes its adapters with it.
func TestAdaptersForgotten(t *testing.T) {
	a := modelsServer(t, "base", 50)
	c := config.Default()
	c.Backends = []config.Backend{{URL: a.URL, Name: "a"}, {URL: "http://b:1", Name: "b", Models: []string{"other-base"}}}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	known := map[string]string{}
	learn := func(p map[string]string) {
		mu.Lock()
		defer mu.Unlock()
		for k, v := range p { // as the scheduler's LearnAdapters kept them, or SetAdapters replaces them
			known[k] = v
		}
		for k := range known {
			if _, ok := p[k]; !ok {
				delete(known, k)
			}
		}
	}
	s := New(Config{Fleet: fleet.New(), Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health,
		FleetSection: c.Fleet, DiscoverModels: true, Adapters: learn}, es)
	if known["adapter-7"] != "base" || len(known) != 50 {
		t.Fatalf("known adapters after a joined: %d, adapter-7 of %q", len(known), known["adapter-7"])
	}
	c2 := config.Default()
	c2.Backends = c.Backends[1:]
	es, err = c2.Entries()
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(es, c2.Fleet)
	s.mu.Lock()
	s.release(time.Now().Add(c2.Fleet.RejoinGrace + time.Second))
	s.mu.Unlock()
	if len(known) != 0 {
		t.Errorf("%d adapters still known after their only engine was released", len(known))
	}
}

// A backend removed while a request ran there and re-added under another
// role kept its old record, and so its old role, kind, kv_events and tls:
// re-added as prefill, it still got every decode leg. It gets a record of
// its new entry; the request in flight still ends on it.
func TestReAddedTakesNewSettings(t *testing.T) {
	c := config.Default()
	c.Backends = []config.Backend{{URL: "http://a:1", Name: "a", Models: []string{"m"}, Role: "decode"}, {URL: "http://b:1", Name: "b", Models: []string{"m"}}}
	s, _, _ := newSet(t, c)
	old := s.ByName("a")
	stream := old.B.Start(10, 10, 10, time.Now())
	apply := func(bs ...config.Backend) {
		t.Helper()
		c := config.Default()
		c.Backends = bs
		es, err := c.Entries()
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(es, c.Fleet)
	}
	apply(c.Backends[1])
	if !old.B.Draining() || old.B.Retired() {
		t.Fatalf("a with a request in flight: draining %v, retired %v", old.B.Draining(), old.B.Retired())
	}
	readded := c.Backends[0]
	readded.Role = "prefill"
	apply(readded, c.Backends[1])
	m := s.ByName("a")
	if m == nil {
		t.Fatal("a not back")
	}
	if got := s.RoleOf(m.B); got != "prefill" {
		t.Errorf("re-added a has role %q, want prefill (its new entry's)", got)
	}
	if m.B.Draining() {
		t.Error("re-added a still draining")
	}
	stream.Done(time.Now())
}
