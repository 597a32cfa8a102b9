package scheduler

import (
	"testing"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// benchScheduler returns a scheduler over 64 backends, each holding a
// shared system prompt and twenty conversations of its own, with backend k
// also holding the benchmark prompt's first 7k blocks, and that
// 32,000-character (500-block) prompt.
func benchScheduler(b *testing.B) (*Scheduler, string) {
	b.Helper()
	const backends = 64
	s := New(newFleet(b, backends), longestPrefix{}, Config{})
	system := text(0, 2048)
	prompt := system + text(1, 32000-2048)
	query := prefix.Hash(nil, prompt, prefix.DefaultBlockChars)
	for k := range backends {
		for c := range 20 {
			s.Index().Insert(k, prefix.Hash(nil, system+text(1000+k*100+c, 16000), prefix.DefaultBlockChars))
		}
		s.Index().Insert(k, query[:min(len(query), 7*k)])
	}
	return s, prompt
}

// BenchmarkRoute measures one whole routing decision, from the request view
// to the open ticket and back to done: hash, match, pick (a trivial
// longest-prefix policy), insert, account, reason.
func BenchmarkRoute(b *testing.B) {
	s, prompt := benchScheduler(b)
	routeLoop(b, s, view("", prompt))
}

// BenchmarkRouteKVRoute is BenchmarkRoute with the kvroute policy: the
// whole decision as kvroute serve makes it by default.
func BenchmarkRouteKVRoute(b *testing.B) {
	s, prompt := benchScheduler(b)
	s.SetPolicy(policy.NewKVRoute(policy.Options{}))
	routeLoop(b, s, view("", prompt))
}

// routeLoop routes v, takes its first byte and ends it, once per iteration.
func routeLoop(b *testing.B, s *Scheduler, v *request.View) {
	b.ReportAllocs()
	for b.Loop() {
		a, err := s.Route(v, nil, t0)
		if err != nil {
			b.Fatal(err)
		}
		a.FirstByte(t0)
		a.Done(t0)
	}
}

// BenchmarkRouteParallel is BenchmarkRoute from GOMAXPROCS goroutines at
// once: the cost of sharing the index lock and the load counters.
func BenchmarkRouteParallel(b *testing.B) {
	s, prompt := benchScheduler(b)
	v := view("", prompt)
	b.ReportAllocs()
	b.ResetTimer() // RunParallel, unlike b.Loop, counts the setup otherwise
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a, err := s.Route(v, nil, t0)
			if err != nil {
				b.Error(err)
				return
			}
			a.FirstByte(t0)
			a.Done(t0)
		}
	})
}

// BenchmarkRouteLong is BenchmarkRoute for a 200 KB prompt (3,125
// blocks, an agent's context of about 50,000 tokens) that no backend holds
// beyond the shared system prompt.
func BenchmarkRouteLong(b *testing.B) {
	s, _ := benchScheduler(b)
	routeLoop(b, s, view("", text(0, 2048)+text(7, 200_000-2048)))
}
