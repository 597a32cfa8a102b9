package policy

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
)

// TestKVRouteLockOutDecays replays the lock-out in virtual time: three
// engines under a 20-second overload, during which one of them (queueing
// far behind the others) answers every prompt as if it prefilled 622
// tokens a second while the others show 12,000. At the end of it the
// router avoids that engine even when the fleet is idle: it costs a cold
// prompt there at more than twice what it costs elsewhere. With no traffic to it
// afterwards, within 30 s of virtual time its estimate is the others'
// again and a cold prompt goes to it (it has the emptiest cache).
func TestKVRouteLockOutDecays(t *testing.T) {
	f := fleet.New()
	cands := []*fleet.Backend{f.Add("b0", nil, nil), f.Add("b1", nil, nil), f.Add("b2", nil, nil)}
	now := fxT0
	const work = 4000
	for i := 0; now.Before(fxT0.Add(20 * time.Second)); i++ {
		k := 1 + i%2
		if i%5 == 0 {
			k = 0 // the slow engine gets a fifth of the requests
		}
		rate := 12000.0
		if k == 0 {
			rate = 622
		}
		tk := cands[k].Start(work, work, 64, now)
		tk.FirstByte(now.Add(time.Duration(work / rate * float64(time.Second))))
		tk.Done(now.Add(time.Second))
		now = now.Add(50 * time.Millisecond)
	}
	p := NewKVRoute(Options{})
	pick := func(at time.Time) (Decision, []candidate) {
		in := fxInput(cands, make([]fxLoad, 3), 2000, "")
		in.Now = at
		r := p.request(in)
		c := make([]candidate, 3)
		p.estimateAll(in, &r, false, 0, c)
		return p.Pick(in), c
	}
	d, c := pick(now)
	if d.Index == 0 || c[0].est < 2*c[1].est {
		t.Fatalf("after the overload: picked %d, estimates %.3f / %.3f / %.3f s: want the slow engine avoided (the lock-out)", d.Index, c[0].est, c[1].est, c[2].est)
	}
	d, c = pick(now.Add(30 * time.Second))
	if d.Index != 0 || c[0].est != c[1].est {
		t.Fatalf("30 s later, no traffic: picked %d, estimates %.3f / %.3f / %.3f s: want engine 0 back at the fleet's estimate", d.Index, c[0].est, c[1].est, c[2].est)
	}
}

// TestKVRouteAttentionTermCounts: the attention term of the cost model
// changes the pick on a long prompt. Backend 0 holds 8,000 tokens of a
// 60,000-token prompt (less than a chunk ahead, so the cache rule does
// not decide) behind a queue of 8,300 tokens; backend 1 is idle and holds
// nothing. Per token alone, backend 1 computes 300 tokens less; but a
// prompt computed after its cached prefix attends over fewer new pairs
// (K^2/2 fewer for K cached), which at 2e-9 s a pair (an engine whose
// attention is compute-bound: 2e-5 of a prefill token) is worth about
// 650 tokens: backend 0 wins. With the attention term zeroed, backend 1
// does.
func TestKVRouteAttentionTermCounts(t *testing.T) {
	loads := []fxLoad{{matched: 500, pending: []int64{8300}}, {}}
	for _, tc := range []struct {
		name string
		attn float64
		want int
	}{
		{"with attention", 2e-9, 0},
		{"attention zeroed", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			p := costmodel.Generic()
			p.Attn = tc.attn
			for _, b := range cands {
				b.SetCostModel(costmodel.Frozen(p))
			}
			if d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 60000, "")); d.Index != tc.want {
				t.Fatalf("picked %d (%q, est %.3f s), want %d", d.Index, d.Note, d.EstTTFT, tc.want)
			}
		})
	}
}
