package policy

import (
	"sync"
	"testing"
)

func TestRandomDeterministic(t *testing.T) {
	cands := fxBackends(t, make([]fxLoad, 16)...)
	in := fxInput(cands, nil, 100, "")
	seq := func(seed int64) []int {
		p := fxNew(t, "random", Options{Seed: seed})
		out := make([]int, 64)
		for i := range out {
			out[i] = p.Pick(in).Index
		}
		return out
	}
	a, b, c := seq(7), seq(7), seq(8)
	same := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, pick %d: %d vs %d", i, a[i], b[i])
		}
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("seeds 7 and 8 gave the same sequence")
	}
}

func TestRandomUniform(t *testing.T) {
	const n, picks = 5, 50000
	cands := fxBackends(t, make([]fxLoad, n)...)
	in := fxInput(cands, nil, 100, "")
	p := fxNew(t, "random", Options{Seed: 1})
	var count [n]int
	for range picks {
		count[p.Pick(in).Index]++
	}
	// Each count is Binomial(50000, 0.2): sd ~ 89; 6 sd is 540.
	for i, c := range count {
		if c < picks/n-540 || c > picks/n+540 {
			t.Errorf("backend %d got %d of %d picks", i, c, picks)
		}
	}
}

func TestRandomConcurrent(t *testing.T) {
	cands := fxBackends(t, make([]fxLoad, 3)...)
	in := fxInput(cands, nil, 100, "")
	for _, name := range []string{"random", "power-of-two"} {
		p := fxNew(t, name, Options{Seed: 3})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 1000 {
					if d := p.Pick(in); d.Index < 0 || d.Index >= 3 {
						t.Errorf("%s: index %d out of range", name, d.Index)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}
