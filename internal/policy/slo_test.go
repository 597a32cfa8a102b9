package policy

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/slo"
)

// TestKVRouteObjectives: a request with objectives is routed by headroom
// and admitted by promise (slo.Choose), over predictions from the
// candidates' cost models; one without is routed exactly as before.
func TestKVRouteObjectives(t *testing.T) {
	const prompt = 2000
	// Backend 0 holds the prompt but has 60,000 tokens of prefill queued
	// (seconds of it at the generic prior); backend 1 is idle; backend 2
	// decodes a batch of 200 long streams (a slow inter-token latency).
	loads := []fxLoad{
		{matched: 125, pending: []int64{30000, 30000}},
		{},
		{decoding: 200, ctx: 30000},
	}
	for _, tc := range []struct {
		name string
		o    slo.Objective
		want int
		note string
		shed bool
	}{
		{"no objectives: the plain pick", slo.Objective{}, 1, "load", false},
		{"a tight TTFT goes where it fits with the most headroom", slo.Objective{TTFT: 2 * time.Second}, 1, "load", false},
		{"a tight ITL avoids the big batch", slo.Objective{ITL: 30 * time.Millisecond}, 1, "load", false},
		{"a sheddable request packs onto the busiest engine that meets it", slo.Objective{TTFT: time.Hour, ITL: time.Hour, Class: slo.Sheddable}, 0, "headroom", false},
		{"a sheddable request no engine can serve in time is shed", slo.Objective{TTFT: time.Microsecond, Class: slo.Sheddable}, 1, "shed", true},
		{"a critical one is served best effort", slo.Objective{TTFT: time.Microsecond, Class: slo.Critical}, 1, "load", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			p := fxNew(t, "kvroute", Options{})
			in := fxInput(cands, loads, prompt, "")
			in.Objective = tc.o
			d := p.Pick(in)
			if d.Index != tc.want || d.Note != tc.note || d.Shed != tc.shed {
				t.Fatalf("picked %d (%q, shed %v, pred %+v), want %d (%q, shed %v)", d.Index, d.Note, d.Shed, d.Pred, tc.want, tc.note, tc.shed)
			}
			if !tc.o.None() && (d.Pred.TTFT <= 0 || d.Pred.ITL <= 0) {
				t.Errorf("no prediction: %+v", d.Pred)
			}
			if !tc.o.None() && !tc.shed && d.Met != tc.o.Meets(d.Pred) {
				t.Errorf("Met %v for %+v against %+v", d.Met, d.Pred, tc.o)
			}
		})
	}
}

// TestKVRouteReserve: a sheddable request is held to the tighter
// objectives of the others noted within slo.ReserveWindow, and shed where
// it alone would have been served.
func TestKVRouteReserve(t *testing.T) {
	loads := []fxLoad{{pending: []int64{20000}}, {pending: []int64{20000}}}
	cands := fxBackends(t, loads...)
	p := fxNew(t, "kvroute", Options{})
	batch := slo.Objective{TTFT: time.Hour, Class: slo.Sheddable}
	in := fxInput(cands, loads, 1000, "")
	in.Objective = batch
	if d := p.Pick(in); d.Shed {
		t.Fatalf("shed with nobody to protect: %+v", d)
	}
	in.Objective = slo.Objective{TTFT: time.Millisecond, Class: slo.Critical}
	p.Pick(in)
	in.Objective = batch
	if d := p.Pick(in); !d.Shed {
		t.Fatalf("served while a critical request's 1 ms holds: %+v", d)
	}
	in.Now = in.Now.Add(slo.ReserveWindow)
	if d := p.Pick(in); d.Shed {
		t.Fatalf("shed after the window: %+v", d)
	}
}

// TestSLOBlind: kvroute-slo-blind routes a request with objectives as
// kvroute routes it without.
func TestSLOBlind(t *testing.T) {
	loads := []fxLoad{{matched: 125, pending: []int64{30000}}, {}}
	cands := fxBackends(t, loads...)
	in := fxInput(cands, loads, 2000, "")
	want := fxNew(t, "kvroute", Options{}).Pick(in)
	in.Objective = slo.Objective{TTFT: time.Microsecond, Class: slo.Sheddable}
	if got := fxNew(t, "kvroute-slo-blind", Options{}).Pick(in); got != want {
		t.Errorf("blind %+v, want %+v", got, want)
	}
}

// TestLLMDPredicted: llm-d's rules over the same predictions.
func TestLLMDPredicted(t *testing.T) {
	// Backend 0 queues 20,000 tokens, backend 1 60,000: both busy, neither
	// idle.
	loads := []fxLoad{{pending: []int64{20000}}, {pending: []int64{30000, 30000}}}
	for _, tc := range []struct {
		name string
		o    slo.Objective
		want int
		shed bool
	}{
		{"no objectives: the lowest predicted latency", slo.Objective{}, 0, false},
		{"least headroom among those meeting both", slo.Objective{TTFT: time.Hour, ITL: time.Hour}, 1, false},
		{"the admitter rejects a sheddable request nobody meets", slo.Objective{TTFT: time.Microsecond, ITL: time.Hour, Class: slo.Sheddable}, 0, true},
		{"a standard one goes to the smallest deficit", slo.Objective{TTFT: time.Microsecond, ITL: time.Hour}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			p := fxNew(t, "llmd-predicted-latency", Options{Seed: 1})
			in := fxInput(cands, loads, 1000, "")
			in.Objective = tc.o
			// The exploration of the negative tier (1 in 100) is drawn
			// from the seed: take the majority of 20 picks.
			votes := map[int]int{}
			for range 20 {
				d := p.Pick(in)
				if d.Shed != tc.shed {
					t.Fatalf("shed %v, want %v", d.Shed, tc.shed)
				}
				votes[d.Index]++
			}
			if votes[tc.want] < 15 {
				t.Errorf("picks %v, want mostly %d", votes, tc.want)
			}
		})
	}
	// An idle endpoint admits a sheddable request.
	idle := []fxLoad{{pending: []int64{20000}}, {}}
	cands := fxBackends(t, idle...)
	in := fxInput(cands, idle, 1000, "")
	in.Objective = slo.Objective{TTFT: time.Microsecond, Class: slo.Sheddable}
	if d := fxNew(t, "llmd-predicted-latency", Options{}).Pick(in); d.Shed || d.Index != 1 {
		t.Errorf("with an idle endpoint: %+v", d)
	}
}
