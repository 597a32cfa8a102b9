package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/workload"
)

// holdTrace writes a trace of four cold 32k-token prompts at 0-3 ms, then
// three cold 1k-token prompts at 10-12 ms, every block of its own.
func holdTrace(t *testing.T) []workload.Request {
	t.Helper()
	return coldTrace(t, func(line func(ms, in int)) {
		for i := range 4 {
			line(i, 32768)
		}
		for i := range 3 {
			line(10+i, 1024)
		}
	})
}

// coldTrace loads the trace that write writes with line(ms, tokens), each
// request a cold prompt of its own blocks with 4 output tokens.
func coldTrace(t *testing.T, write func(line func(ms, in int))) []workload.Request {
	t.Helper()
	var b strings.Builder
	id := 0
	write(func(ms, in int) {
		var ids []string
		for range (in + 511) / 512 {
			ids = append(ids, fmt.Sprint(id))
			id++
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 4, "hash_ids": [%s]}`+"\n", ms, in, strings.Join(ids, ", "))
	})
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := workload.Load(path, workload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestHeldRequestsBindWhenCapacityFrees runs the trace above on two engines
// with late binding at a bound of 16,384 tokens: the first two long
// prompts go one to each engine,
// which puts both at the bound, so the other five are held; they bind only
// when a first token frees an engine, and every request completes with the
// accounting back to zero. In deadline order the short prompts bind before
// the two held long ones (and reach their first token before them); first
// come, first served binds the long ones first.
func TestHeldRequestsBindWhenCapacityFrees(t *testing.T) {
	reqs := holdTrace(t)
	engines, err := ParseEngines("2", testPreset)
	if err != nil {
		t.Fatal(err)
	}
	for _, order := range []admission.Order{admission.Deadline, admission.FCFS} {
		t.Run(order.String(), func(t *testing.T) {
			s, err := newSim(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1,
				Hold: &Hold{Tokens: 16384, Order: order, Slack: 1}})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range s.order {
				s.until(s.reqs[k].At)
				s.arrive(k)
			}
			if got := s.held.Len(); got != 5 {
				t.Fatalf("%d requests held after the arrivals, want 5", got)
			}
			for i := range s.nodes {
				if s.nodes[i].routed != 1 {
					t.Fatalf("engine %d has %d requests before any first token, want 1", i, s.nodes[i].routed)
				}
			}
			s.until(-1)
			s.finish()
			run := s.result()
			if run.Completed != len(reqs) || run.Errors != 0 {
				t.Fatalf("completed %d, errors %d, want %d and 0", run.Completed, run.Errors, len(reqs))
			}
			for i, n := range s.nodes {
				if l := n.b.Load(); l != (fleet.Load{}) {
					t.Errorf("backend %d accounting not back to zero: %+v", i, l)
				}
			}
			// The first token of the first two long prompts, the earliest
			// moment anything held could bind.
			var freed time.Duration
			var shortFirst, heldLongFirst time.Duration = 1 << 62, 1 << 62
			var shortLast time.Duration
			for _, smp := range run.Samples {
				switch {
				case smp.PromptTokens < 2048:
					shortFirst = min(shortFirst, smp.Start+smp.TTFT)
					shortLast = max(shortLast, smp.Start+smp.TTFT)
				case smp.Start < 2*time.Millisecond:
					if freed == 0 || smp.Start+smp.TTFT < freed {
						freed = smp.Start + smp.TTFT
					}
				default:
					heldLongFirst = min(heldLongFirst, smp.Start+smp.TTFT)
				}
			}
			if shortFirst < freed {
				t.Errorf("a held short prompt had its first token at %v, before any engine freed up at %v", shortFirst, freed)
			}
			if order == admission.Deadline && shortLast > heldLongFirst {
				t.Errorf("deadline order: the last short prompt's first token at %v, after a held long one's at %v", shortLast, heldLongFirst)
			}
			if order == admission.FCFS && shortFirst < heldLongFirst {
				t.Errorf("fcfs: a short prompt's first token at %v, before the held long ones' at %v", shortFirst, heldLongFirst)
			}
		})
	}
}

// TestHoldOffChangesNothing: a run without Hold holds nothing, and one
// whose bound is never reached gives the same result as no hold at all.
func TestHoldOffChangesNothing(t *testing.T) {
	engines, reqs := fixture(t, "chat", 3, 200, 0.5)
	run := func(h *Hold) string {
		t.Helper()
		s, err := newSim(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1, Hold: h})
		if err != nil {
			t.Fatal(err)
		}
		s.loop()
		r := s.result()
		return fmt.Sprintf("%d %d %.3f %.3f %.4f", r.Completed, r.Errors, r.TTFT.Mean, r.TTFT.P99, r.PrefixHitRate)
	}
	if a, b := run(nil), run(&Hold{Tokens: 1 << 40, Order: admission.Deadline}); a != b {
		t.Errorf("unreachable bound changed the run: %s against %s", b, a)
	}
}

// TestHoldWithReplicasRefused: late binding with several router replicas
// is not modelled, and says so rather than running something else.
func TestHoldWithReplicasRefused(t *testing.T) {
	engines, reqs := fixture(t, "chat", 2, 10, 0.5)
	if _, err := newSim(reqs, Config{Engines: engines, Policy: "kvroute", Replicas: 2, Hold: &Hold{Tokens: 1}}); err == nil {
		t.Error("late binding with 2 replicas accepted")
	}
}

// TestHoldTransit gives each grant a transit of 30 ms before its request
// is routed (a router that tokenizes while holding the grant, say), on two
// engines held at a bound of 16,384 tokens, with 1k-token prompts arriving
// every 50 ms for 20 s behind four long ones: held while the long ones
// prefill, then draining, the queue empty at times with a grant in
// transit. The gate grants one request at a time, so held requests are
// routed at least a transit apart (the queue drains at one request per
// transit), and no arrival passes a granted request that is not routed
// yet, though the capacity it will take still reads as free (FCFS: every
// request is routed in its order of arrival).
func TestHoldTransit(t *testing.T) {
	const transit = 30 * time.Millisecond
	reqs := coldTrace(t, func(line func(ms, in int)) {
		for i := range 4 {
			line(i, 32768)
		}
		for ms := 10; ms < 20000; ms += 50 {
			line(ms, 1024)
		}
	})
	engines, err := ParseEngines("2", testPreset)
	if err != nil {
		t.Fatal(err)
	}
	run, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1,
		Hold: &Hold{Tokens: 16384, Order: admission.FCFS, Transit: transit}})
	if err != nil {
		t.Fatal(err)
	}
	if run.Completed != len(reqs) || run.Errors != 0 {
		t.Fatalf("completed %d, errors %d, want %d and 0", run.Completed, run.Errors, len(reqs))
	}
	routed := make([]time.Duration, len(reqs)) // when each request reached its engine
	var binds []time.Duration                  // when each held request did
	for _, smp := range run.Samples {
		routed[smp.Request] = smp.Start + smp.Held
		if smp.Held > 0 {
			binds = append(binds, smp.Start+smp.Held)
		}
	}
	if len(binds) < 3 {
		t.Fatalf("%d requests held: the run tests nothing", len(binds))
	}
	slices.Sort(binds)
	for i := 1; i < len(binds); i++ {
		if gap := binds[i] - binds[i-1]; gap < transit {
			t.Errorf("held requests routed %v apart, at %v and %v: two grants in transit at once", gap, binds[i-1], binds[i])
		}
	}
	inTransit := 0 // arrivals while a grant was in transit
	for k, r := range reqs {
		for _, b := range binds {
			if r.At >= b-transit && r.At < b {
				inTransit++
				break
			}
		}
		if k > 0 && routed[k] < routed[k-1] {
			t.Errorf("request %d (arrived at %v) routed at %v, before request %d (arrived at %v) at %v",
				k, r.At, routed[k], k-1, reqs[k-1].At, routed[k-1])
		}
	}
	if inTransit == 0 {
		t.Fatal("no request arrived while a grant was in transit: the run tests nothing")
	}
	t.Logf("%d of %d requests held, %d arrived while a grant was in transit", len(binds), len(reqs), inTransit)
}
