package fault

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
)

// script is a Router that holds each engine busy for a number of polls
// after its drain, and records the calls.
type script struct {
	mu    sync.Mutex
	busy  map[string]int
	calls []string
	moved int
}

func (s *script) note(c string) {
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
}

func (s *script) Drain(name string) error   { s.note("drain " + name); return nil }
func (s *script) Undrain(name string) error { s.note("undrain " + name); return nil }
func (s *script) Moved() (int, error)       { return s.moved, nil }

func (s *script) InFlight(name string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[name] > 0 {
		s.busy[name]--
		return 1, nil
	}
	s.calls = append(s.calls, "idle "+name)
	return 0, nil
}

// engines serves n emulated engines through in.
func engines(t *testing.T, in *Injector, n int) []string {
	t.Helper()
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range n {
		url, err := in.Serve(fmt.Sprintf("engine-%d", i), emulator.Config{Preset: p, TimeScale: 1})
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, url)
	}
	t.Cleanup(in.Close)
	return urls
}

func up(url string) bool {
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestRestart restarts two engines in turn: each drained, stopped only
// once the router holds nothing on it, started again on its address and
// undrained, before the next; the result counts both restarts.
func TestRestart(t *testing.T) {
	in := New(Fault{Kind: Restart, At: time.Millisecond}, engine.Preset{})
	urls := engines(t, in, 2)
	r := &script{busy: map[string]int{"engine-0": 3, "engine-1": 1}, moved: 5}
	in.Arm(r)
	in.done.Wait() // the run lasts until the restart is over
	res := in.Result(nil, 1)
	want := []string{"drain engine-0", "idle engine-0", "undrain engine-0", "drain engine-1", "idle engine-1", "undrain engine-1"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls %q, want %q", r.calls, want)
	}
	if len(res.Restarts) != 2 || res.RestartErr != "" || res.Started <= 0 || res.Moved != 5 {
		t.Errorf("result %+v: want two restarts, an engine start, 5 moved", res)
	}
	for _, u := range urls {
		if !up(u) {
			t.Errorf("%s not serving after its restart", u)
		}
	}
	if s := Describe("kvroute restart", res); !strings.Contains(s, "rolling restart of 2 engines") {
		t.Errorf("description misses the restart:\n%s", s)
	}
}

// TestKill: the first engine's address refuses connections after the
// kill, the other serves; a fault that never came changes nothing.
func TestKill(t *testing.T) {
	in := New(Fault{Kind: Kill, At: time.Millisecond}, engine.Preset{})
	urls := engines(t, in, 2)
	in.Arm(&script{})
	in.done.Wait()
	if up(urls[0]) || !up(urls[1]) {
		t.Errorf("after the kill: engine-0 up %v, engine-1 up %v; want false, true", up(urls[0]), up(urls[1]))
	}
	if res := in.Result(nil, 1); res.Kind != Kill || res.Moved != 0 {
		t.Errorf("result %+v", res)
	}

	late := New(Fault{Kind: Kill, At: time.Hour}, engine.Preset{})
	urls = engines(t, late, 1)
	late.Arm(&script{})
	late.Result(nil, 1)
	if !up(urls[0]) {
		t.Error("a fault an hour later killed the engine at the run's end")
	}
}
