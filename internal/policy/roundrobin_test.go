package policy

import "testing"

func TestRoundRobin(t *testing.T) {
	loads := []fxLoad{{}, {pending: []int64{5000}}, {}}
	cands := fxBackends(t, loads...)
	p := fxNew(t, "round-robin", Options{})
	in := fxInput(cands, loads, 100, "")
	for k := range 7 {
		if d := p.Pick(in); d.Index != k%3 {
			t.Fatalf("pick %d went to %d, want %d", k, d.Index, k%3)
		}
	}
	// A smaller candidate set (a retry) stays in range.
	small := fxInput(cands[:2], loads[:2], 100, "")
	for range 5 {
		if d := p.Pick(small); d.Index < 0 || d.Index >= 2 {
			t.Fatalf("index %d out of range for 2 candidates", d.Index)
		}
	}
}
