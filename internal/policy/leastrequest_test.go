package policy

import "testing"

// fxInFlight builds loads with the given numbers of requests in flight.
func fxInFlight(n ...int) []fxLoad {
	loads := make([]fxLoad, len(n))
	for i, k := range n {
		loads[i].pending = make([]int64, k)
		for j := range loads[i].pending {
			loads[i].pending[j] = 100
		}
	}
	return loads
}

func TestLeastRequest(t *testing.T) {
	tests := []struct {
		name     string
		inflight []int
		want     map[int]bool // acceptable picks over consecutive picks
		spread   int          // distinct picks expected over len(inflight) picks
	}{
		{"single minimum", []int{3, 1, 2}, map[int]bool{1: true}, 1},
		{"single candidate", []int{9}, map[int]bool{0: true}, 1},
		{"ties rotate among the minima", []int{1, 0, 0, 2, 0}, map[int]bool{1: true, 2: true, 4: true}, 3},
		{"all idle spreads over all", []int{0, 0, 0, 0}, map[int]bool{0: true, 1: true, 2: true, 3: true}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loads := fxInFlight(tc.inflight...)
			cands := fxBackends(t, loads...)
			p := fxNew(t, "least-request", Options{})
			seen := map[int]bool{}
			for range len(cands) {
				d := p.Pick(fxInput(cands, loads, 100, ""))
				if !tc.want[d.Index] {
					t.Fatalf("picked %d (in flight %v)", d.Index, tc.inflight)
				}
				seen[d.Index] = true
			}
			if len(seen) != tc.spread {
				t.Fatalf("picked %v over %d picks, want %d distinct", seen, len(cands), tc.spread)
			}
		})
	}
}
