package policy

import "testing"

func TestPowerOfTwo(t *testing.T) {
	tests := []struct {
		name     string
		inflight []int
		never    int // a backend that must never be picked; -1 for none
		always   int // a backend that must always be picked; -1 for none
	}{
		{"single candidate", []int{4}, -1, 0},
		// With two candidates both are always drawn (distinct draws), so
		// the less loaded always wins.
		{"two candidates take the lighter", []int{3, 1}, -1, 1},
		// The unique maximum loses whichever partner it is drawn with.
		{"never the most loaded", []int{9, 0, 1, 2}, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loads := fxInFlight(tc.inflight...)
			cands := fxBackends(t, loads...)
			p := fxNew(t, "power-of-two", Options{Seed: 5})
			for range 200 {
				d := p.Pick(fxInput(cands, loads, 100, ""))
				if d.Index == tc.never || (tc.always >= 0 && d.Index != tc.always) {
					t.Fatalf("picked %d (in flight %v)", d.Index, tc.inflight)
				}
			}
		})
	}
	// The lightest of four is drawn into the pair with probability 1/2, and
	// then wins; over 2000 picks it must win about half of them.
	loads := fxInFlight(5, 0, 5, 5)
	cands := fxBackends(t, loads...)
	p := fxNew(t, "power-of-two", Options{Seed: 9})
	wins := 0
	for range 2000 {
		if p.Pick(fxInput(cands, loads, 100, "")).Index == 1 {
			wins++
		}
	}
	if wins < 850 || wins > 1150 { // 1000 +- 7 sd
		t.Fatalf("lightest backend won %d of 2000 picks, want about 1000", wins)
	}
}
