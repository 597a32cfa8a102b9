package sim

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/migrate"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// onEngine counts, from a run without the fault, the requests engine-0
// had at at: streams (their first token in by then, their last not) and
// requests still waiting for their first token. The run with the fault is
// the same up to at, so these are what the fault finds there.
func onEngine(t *testing.T, base report.Run, at time.Duration) (streams, waiting int) {
	t.Helper()
	for _, s := range base.Samples {
		if s.Err != "" {
			t.Fatalf("the run without a fault failed request %d: %s", s.Request, s.Err)
		}
		if s.Backend != "engine-0" || s.Start > at || s.Start+s.E2E <= at {
			continue
		}
		if s.Start+s.TTFT <= at {
			streams++
		} else {
			waiting++
		}
	}
	return streams, waiting
}

// TestKillMovesStreams kills engine 0 in the middle of a chat run on 3
// engines: with migration on, every stream it was serving is moved and
// every request it had not started is sent again, so no client sees an
// error; with migration off (max_attempts 0) or a context bound no
// continuation meets, each of those streams is a client's error.
func TestKillMovesStreams(t *testing.T) {
	engines, reqs := fixture(t, "chat", 3, 150, 0.7)
	base, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	at := reqs[len(reqs)/2].At + time.Millisecond
	streams, waiting := onEngine(t, base, at)
	if streams == 0 {
		t.Fatalf("no stream on engine-0 at %v: the test tests nothing", at)
	}
	for _, c := range []struct {
		name      string
		lim       migrate.Limits
		errors    int
		moved     int
		refused   int
		extraSome bool
	}{
		{"migration on", migrate.Limits{MaxAttempts: 2, MaxContextTokens: 32768}, 0, streams, 0, true},
		{"migration off", migrate.Limits{}, streams, 0, streams, false},
		{"context over max_context_tokens", migrate.Limits{MaxAttempts: 2, MaxContextTokens: 1}, streams, 0, streams, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1, Faults: Faults{KillAt: at}, Migration: c.lim})
			if err != nil {
				t.Fatal(err)
			}
			f := run.Fault
			if f == nil {
				t.Fatal("no fault in the run's result")
			}
			if f.Errors != c.errors || run.Errors != c.errors || f.Moved != c.moved || f.Streams != c.moved || f.Refused != c.refused {
				t.Fatalf("errors %d (run %d), moved %d of %d streams, refused %d; want errors %d, moved %d, refused %d (%d streams on the engine)",
					f.Errors, run.Errors, f.Moved, f.Streams, f.Refused, c.errors, c.moved, c.refused, streams)
			}
			if f.Resent != waiting {
				t.Fatalf("%d requests sent again, want the %d waiting on the engine", f.Resent, waiting)
			}
			if run.Completed+run.Errors != len(reqs) {
				t.Fatalf("%d completed and %d failed of %d", run.Completed, run.Errors, len(reqs))
			}
			if (f.ExtraPrefillTokens > 0) != c.extraSome {
				t.Fatalf("extra prefill %d tokens", f.ExtraPrefillTokens)
			}
			if c.moved > 0 && (f.Hit == 0 || f.Hit > streams || f.Added99 <= 0) {
				t.Fatalf("%d streams hit (of %d), added p99 %.1f ms", f.Hit, streams, f.Added99)
			}
			for _, s := range run.Samples {
				if s.Err == "" && s.Backend == "engine-0" && s.Start+s.TTFT > at {
					t.Fatalf("request %d's first token came from engine-0 after its death", s.Request)
				}
			}
		})
	}
}

// TestMovePrefersPrefixHolder: a stream on engine-0 whose prompt's prefix
// engine-1 also holds (and engine-2 does not) is moved, when engine-0
// dies, to engine-1 by the scheduler's prefix match: the continuation
// computes the part engine-1 does not hold, not the whole prompt.
func TestMovePrefersPrefixHolder(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 4096, "output_length": 4, "hash_ids": [0,1,2,3,4,5,6,7]}
{"timestamp": 0, "input_length": 4096, "output_length": 4, "hash_ids": [0,1,2,3,4,5,6,7]}
{"timestamp": 1000, "input_length": 4608, "output_length": 400, "hash_ids": [0,1,2,3,4,5,6,7,100]}
`
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := workload.Load(path, workload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	engines, _ := fixture(t, "chat", 3, 1, 0.5)
	cfg := Config{Engines: engines, Policy: "kvroute", Seed: 1}
	base, err := Run(reqs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	where := map[int]string{}
	for _, s := range base.Samples {
		where[s.Request] = s.Backend
	}
	if where[0] == where[1] || where[2] != "engine-0" || where[0] != "engine-0" && where[1] != "engine-0" {
		t.Fatalf("placement %v: want the two prefixes on two engines and the stream on engine-0", where)
	}
	cfg.Faults.KillAt = 2 * time.Second
	cfg.Migration = migrate.Limits{MaxAttempts: 2}
	run, err := Run(reqs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := run.Fault
	if f.Errors != 0 || f.Moved != 1 {
		t.Fatalf("errors %d, moved %d; want the stream moved", f.Errors, f.Moved)
	}
	// The continuation's prompt is 4,608 tokens and the tokens sent;
	// engine-1 holds the first 4,096 of them.
	if f.ExtraPrefillTokens <= 0 || f.ExtraPrefillTokens >= 4096 {
		t.Fatalf("the continuation computed %d prompt tokens: not moved to the engine holding its prefix", f.ExtraPrefillTokens)
	}
}

// TestHangFoundAfterIdle hangs engine 0: its streams are found the idle
// timeout after their last token and moved, so their added latency is at
// least the timeout, and no client sees an error.
func TestHangFoundAfterIdle(t *testing.T) {
	engines, reqs := fixture(t, "chat", 3, 150, 0.5)
	at := reqs[len(reqs)/2].At + time.Millisecond
	idle := 700 * time.Millisecond
	run, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1,
		Faults: Faults{HangAt: at, StreamIdle: idle}, Migration: migrate.Limits{MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	f := run.Fault
	if f.Errors != 0 || f.Moved == 0 || run.Completed != len(reqs) {
		t.Fatalf("errors %d, moved %d, completed %d of %d", f.Errors, f.Moved, run.Completed, len(reqs))
	}
	if f.Added50 < 0.9*float64(idle.Milliseconds()) {
		t.Fatalf("added latency p50 %.1f ms: less than the idle timeout %v", f.Added50, idle)
	}
}

// TestRollingRestart restarts each of 4 engines in turn under load: no
// client sees an error, streams still running at the end of the grace are
// moved, and each engine's restart takes at most the grace and its start.
func TestRollingRestart(t *testing.T) {
	engines, reqs := fixture(t, "chat", 4, 200, 0.6)
	grace, start := 300*time.Millisecond, time.Second
	run, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 1,
		Faults:    Faults{RollingAt: reqs[len(reqs)/4].At, DrainGrace: grace, EngineStart: start},
		Migration: migrate.Limits{MaxAttempts: 2, MaxContextTokens: 32768}})
	if err != nil {
		t.Fatal(err)
	}
	f := run.Fault
	if f.Errors != 0 || run.Errors != 0 || run.Completed != len(reqs) || f.Moved == 0 {
		t.Fatalf("errors %d (run %d), completed %d of %d, moved %d", f.Errors, run.Errors, run.Completed, len(reqs), f.Moved)
	}
	if len(f.RestartsMs) != len(engines) {
		t.Fatalf("%d restarts, want %d", len(f.RestartsMs), len(engines))
	}
	for i, d := range f.RestartsMs {
		if d < float64(start.Milliseconds()) || d > float64((grace+start).Milliseconds()) {
			t.Fatalf("engine %d's restart took %.0f ms, want between %v and %v", i, d, start, grace+start)
		}
	}
}

// TestFaultDeterminism: a run with each engine fault gives the same
// result twice.
func TestFaultDeterminism(t *testing.T) {
	engines, reqs := fixture(t, "chat", 3, 80, 0.7)
	at := reqs[len(reqs)/2].At
	for _, f := range []Faults{{KillAt: at}, {HangAt: at}, {RollingAt: at, DrainGrace: 200 * time.Millisecond, EngineStart: 100 * time.Millisecond}} {
		var out [2][]byte
		for i := range out {
			run, err := Run(reqs, Config{Engines: engines, Policy: "kvroute", Seed: 5, Faults: f, Migration: migrate.Limits{MaxAttempts: 2}})
			if err != nil {
				t.Fatal(err)
			}
			if out[i], err = json.Marshal(run); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(out[0], out[1]) {
			t.Fatalf("%+v: two runs differ:\n%s\n%s", f, out[0], out[1])
		}
	}
}

// TestCut: a leg cut at 100 ms keeps the tokens its client had by then;
// the one stamped with the end of the step under way (120 ms) never
// reached it.
func TestCut(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name        string
		generated   int
		first, last time.Duration
		itl         []time.Duration
		sent        int
		cFirst      time.Duration
		cLast       time.Duration
		gaps        int
	}{
		{"mid-stream, a token under way", 3, 50 * ms, 120 * ms, []time.Duration{30 * ms, 40 * ms}, 2, 50 * ms, 80 * ms, 1},
		{"its first token under way", 1, 120 * ms, 120 * ms, nil, 0, 0, 0, 0},
		{"no step under way", 2, 50 * ms, 90 * ms, []time.Duration{40 * ms}, 2, 50 * ms, 90 * ms, 1},
		{"no token yet", 0, 0, 0, nil, 0, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &sim{now: 100 * ms}
			f := &flight{first: c.first, last: c.last, itl: append(make([]time.Duration, 0, 8), c.itl...)}
			f.Generated = c.generated
			s.cut(f)
			got := f.c
			if got.sent != c.sent || got.first != c.cFirst || got.last != c.cLast || len(got.itl) != c.gaps || !f.gone {
				t.Fatalf("sent %d, first %v, last %v, %d gaps, gone %v; want %d, %v, %v, %d, true",
					got.sent, got.first, got.last, len(got.itl), f.gone, c.sent, c.cFirst, c.cLast, c.gaps)
			}
		})
	}
}
