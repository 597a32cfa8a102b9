package policy

import "testing"

func TestPrefixAffinity(t *testing.T) {
	tests := []struct {
		name  string
		loads []fxLoad
		want  int
		note  string
	}{
		{"longest match wins", []fxLoad{{matched: 3}, {matched: 40}, {matched: 12}}, 1, "cache"},
		{"longest match wins however loaded", []fxLoad{{}, {matched: 2, pending: make([]int64, 50)}}, 1, "cache"},
		{"equal matches go to the least loaded", []fxLoad{{matched: 7, pending: make([]int64, 3)}, {matched: 7, pending: make([]int64, 1)}, {matched: 2}}, 1, "cache"},
		{"no match anywhere is least-request", []fxLoad{{pending: make([]int64, 2)}, {pending: make([]int64, 1)}, {pending: make([]int64, 4)}}, 1, "least-loaded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cands := fxBackends(t, tc.loads...)
			p := fxNew(t, "prefix", Options{})
			for range len(cands) { // every rotation of the scan start
				if d := p.Pick(fxInput(cands, tc.loads, 1000, "")); d.Index != tc.want || d.Note != tc.note {
					t.Fatalf("picked %d (%q), want %d (%q)", d.Index, d.Note, tc.want, tc.note)
				}
			}
		})
	}
}
