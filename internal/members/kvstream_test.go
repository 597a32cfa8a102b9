package members

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// streams records the streams a Set runs: which are running, on which
// endpoints.
type streams struct {
	mu      sync.Mutex
	running map[string]string // backend name -> endpoint|replay|bind
}

func (r *streams) run(ctx context.Context, m *Member, endpoint, replay string, bind bool) {
	key := endpoint + "|" + replay
	if bind {
		key += "|bind"
	}
	r.mu.Lock()
	r.running[m.B.Name] = key
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	delete(r.running, m.B.Name)
	r.mu.Unlock()
}

func (r *streams) snapshot() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for k, v := range r.running {
		out[k] = v
	}
	return out
}

// waitFor polls until the running streams are want.
func (r *streams) waitFor(t *testing.T, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := r.snapshot()
		if equalMaps(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("streams %v, want %v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestStreamsFollowMembers: one stream per backend with kv_events, started
// with the set, stopped when a reload removes the backend, started for one
// a reload adds, and all stopped with the set.
func TestStreamsFollowMembers(t *testing.T) {
	c := config.Default()
	c.Health.Path = ""
	c.Backends = []config.Backend{
		{URL: "http://10.0.0.1:8000", Name: "a", Models: []string{"m"}, KVEvents: "5557", KVEventsReplay: "5558"},
		{URL: "http://10.0.0.2:8000", Name: "b", Models: []string{"m"}},
		{URL: "http://10.0.0.3:8000", Name: "c", Models: []string{"m"}, KVEvents: "tcp://*:6000", KVEventsBind: true},
	}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	rec := &streams{running: map[string]string{}}
	s := New(Config{Fleet: fleet.New(), Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health,
		FleetSection: c.Fleet, KVStream: rec.run}, es)
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	rec.waitFor(t, map[string]string{"a": "tcp://10.0.0.1:5557|tcp://10.0.0.1:5558", "c": "tcp://*:6000||bind"})

	c2 := config.Default()
	c2.Backends = []config.Backend{c.Backends[1], c.Backends[2], {URL: "http://10.0.0.4:8000", Name: "d", Models: []string{"m"}, KVEvents: "tcp://{host}:7000"}}
	es2, err := c2.Entries()
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(es2, c2.Fleet)
	rec.waitFor(t, map[string]string{"c": "tcp://*:6000||bind", "d": "tcp://10.0.0.4:7000|"})
	cancel()
	s.Wait()
	rec.waitFor(t, map[string]string{})
}
