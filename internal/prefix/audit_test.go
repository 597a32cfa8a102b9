package prefix

import (
	"testing"
	"time"
)

var auditT0 = time.Unix(1_700_000_000, 0)

// feed observes n requests on backend 0, each routed and ended at its own
// instant after at, predicting pred of 1000 prompt tokens and reported
// rep; it returns the verdicts that changed something, in order, and the
// instant after the last.
func feed(a *Audit, at time.Time, n int, pred, rep int64) ([]Verdict, time.Time) {
	var out []Verdict
	for range n {
		at = at.Add(time.Second)
		v := a.Observe(Observation{Backend: 0, Policy: "kvroute", Prompt: 1000, Predicted: pred, Reported: rep, Fresh: true, Routed: at}, at)
		if v != Keep {
			out = append(out, v)
		}
	}
	return out, at
}

// TestAuditForgetsAClearedCache: predictions borne out say nothing; once
// the engine reports nothing of what the index predicts (its cache was
// reset behind the router's back), the backend's blocks are forgotten
// within two windows of requests.
func TestAuditForgetsAClearedCache(t *testing.T) {
	a := NewAudit(AuditConfig{})
	vs, at := feed(a, auditT0, 40, 800, 780)
	if len(vs) != 0 {
		t.Fatalf("predictions borne out gave verdicts %v", vs)
	}
	// The reset comes mid-window.
	_, at = feed(a, at, 3, 800, 780)
	vs, _ = feed(a, at, 2*a.cfg.Window, 800, 0)
	if len(vs) == 0 || vs[0] != Forget {
		t.Fatalf("a cleared cache gave verdicts %v, want forget", vs)
	}
	if b := a.Backend(0); b.Actions["forget"] == 0 || b.Untrusted {
		t.Errorf("after the reset: %+v", b)
	}
}

// TestAuditUntrustsAndRecovers: an engine that never reports what the
// index relearns after being forgotten (block hashes that do not match)
// is untrusted after MissesToUntrust windows, its matches then count as
// 0, and it is trusted again once a window agrees.
func TestAuditUntrustsAndRecovers(t *testing.T) {
	a := NewAudit(AuditConfig{})
	vs, at := feed(a, auditT0, 3*a.cfg.Window, 800, 0)
	want := []Verdict{Forget, Forget, Untrust}
	if len(vs) != len(want) || vs[0] != want[0] || vs[1] != want[1] || vs[2] != want[2] {
		t.Fatalf("verdicts %v, want %v", vs, want)
	}
	if !a.Untrusted(0) || !a.AnyUntrusted() || a.Untrusted(1) {
		t.Fatal("backend 0 not untrusted (or another one is)")
	}
	// Still missing: no more verdicts while untrusted.
	if vs, at = feed(a, at, 2*a.cfg.Window, 800, 0); len(vs) != 0 {
		t.Errorf("untrusted backend still missing gave %v", vs)
	}
	vs, _ = feed(a, at, a.cfg.Window, 800, 790)
	if len(vs) != 1 || vs[0] != Trust || a.Untrusted(0) || a.AnyUntrusted() {
		t.Errorf("agreeing window gave %v, untrusted %v", vs, a.Untrusted(0))
	}
}

// TestAuditShrinksToWhatTheEngineKeeps: an engine that bears out a
// quarter of the predicted hits, fresh ones included (it keeps less than
// half of what the index thinks: a llama.cpp server keeping only its
// slots' prompts), is forgotten once (as a loss would be: one window
// cannot tell them apart), then, as its fresh predictions keep falling
// short, its capacity is cut from what it was by what the engine bore out
// over windows (at most half a time), never to what the index held at an
// instant; one that then reports clearly more than predicted grows back,
// never beyond its base.
func TestAuditShrinksToWhatTheEngineKeeps(t *testing.T) {
	a := NewAudit(AuditConfig{})
	if c := a.SetBase(0, 40000); c != 40000 {
		t.Fatalf("capacity %d before any verdict, want the base", c)
	}
	vs, at := feed(a, auditT0, (1+ShrinkWindows)*a.cfg.Window, 800, 200)
	if len(vs) != 2 || vs[0] != Forget || vs[1] != Shrink {
		t.Fatalf("verdicts %v, want forget, shrink", vs)
	}
	if c := a.Capacity(0); c < 20000 || c > 24000 {
		t.Errorf("capacity %d after a quarter borne out of 40000 blocks, want 20000 to 24000", c)
	}
	// The shortfall goes on: a shrink every ShrinkWindows windows, by
	// half now that the bearing is under it.
	c := a.Capacity(0)
	vs, at = feed(a, at, 2*ShrinkWindows*a.cfg.Window, 800, 200)
	if len(vs) != 2 || vs[0] != Shrink || vs[1] != Shrink || a.Capacity(0) != c/4 {
		t.Fatalf("verdicts %v, capacity %d, want shrink twice to %d", vs, a.Capacity(0), c/4)
	}
	c = a.Capacity(0)
	// A new base (the engine's metrics) keeps the audited cap.
	if got := a.SetBase(0, 50000); got != c {
		t.Errorf("capacity %d after a new base, want the audited %d", got, c)
	}
	vs, at = feed(a, at, a.cfg.Window, 100, 700)
	if len(vs) != 1 || vs[0] != Grow || a.Capacity(0) != 2*c {
		t.Fatalf("verdicts %v, capacity %d, want grow to %d", vs, a.Capacity(0), 2*c)
	}
	for range 10 {
		_, at = feed(a, at, a.cfg.Window, 100, 700)
	}
	if c := a.Capacity(0); c != 50000 {
		t.Errorf("capacity %d after growing, want the base 50000", c)
	}
	a.Reset(0)
	if c := a.Capacity(0); c != 50000 {
		t.Errorf("capacity %d after a reset, want the base", c)
	}
}

// TestAuditHealthyEvictingEngine: an engine under eviction pressure
// that keeps what the index predicts fresh and now and then has evicted
// an old conversation the index still holds (requests, up to four in a
// row, reporting nothing of a stale prediction: the two LRU orders
// differ), gets no verdict: it is neither a loss nor a cache smaller
// than the index's.
func TestAuditHealthyEvictingEngine(t *testing.T) {
	a := NewAudit(AuditConfig{})
	a.SetBase(0, 65536)
	at := auditT0
	for i := range 400 {
		at = at.Add(time.Second)
		rep, fresh := int64(300), true
		switch i % 24 {
		case 5, 17, 18, 19: // old blocks evicted in the engine, not in the index
			rep, fresh = 0, false
		case 9:
			rep, fresh = 150, false // partly evicted
		case 12:
			rep = 250 // a block short of a fresh prediction
		}
		if v := a.Observe(Observation{Backend: 0, Policy: "kvroute", Prompt: 1000, Predicted: 300, Reported: rep, Fresh: fresh, Routed: at}, at); v != Keep {
			t.Fatalf("request %d: verdict %v on a healthy evicting engine", i, v)
		}
	}
	if c := a.Capacity(0); c != 65536 {
		t.Errorf("capacity %d, want the base", c)
	}
}

// TestAuditFreshShortfall: a loss in the middle of a window is detected
// at the window's end when a quarter of its fresh predictions (two at
// least) fell short (the bound is inclusive); one short, even entirely,
// is not enough.
func TestAuditFreshShortfall(t *testing.T) {
	for _, tc := range []struct {
		name       string
		short, rep int64
		want       []Verdict
	}{
		{"a quarter partly short", 2, 400, []Verdict{Forget}},
		{"one partly short", 1, 400, nil},
		{"one lost", 1, 0, nil},
	} {
		a := NewAudit(AuditConfig{})
		_, at := feed(a, auditT0, 3*a.cfg.Window, 800, 780)
		_, at = feed(a, at, a.cfg.Window-int(tc.short), 800, 780)
		vs, _ := feed(a, at, int(tc.short), 800, tc.rep)
		if len(vs) != len(tc.want) || (len(vs) > 0 && vs[0] != tc.want[0]) {
			t.Errorf("%s: verdicts %v, want %v", tc.name, vs, tc.want)
		}
	}
}

// TestAuditStaleShortfallIsEviction: stale predictions that fall short,
// even most of a window's, are eviction, not a loss: no verdict.
func TestAuditStaleShortfallIsEviction(t *testing.T) {
	a := NewAudit(AuditConfig{})
	a.SetBase(0, 40000)
	at := auditT0
	for i := range 12 * a.cfg.Window {
		at = at.Add(time.Second)
		o := Observation{Backend: 0, Policy: "kvroute", Prompt: 1000, Predicted: 800, Reported: 800, Fresh: true, Routed: at}
		if i%a.cfg.Window >= 3 {
			o.Reported, o.Fresh = 300, false
		}
		if v := a.Observe(o, at); v != Keep {
			t.Fatalf("request %d: verdict %v", i, v)
		}
	}
}

// TestAuditScalesToTheEnginesTokens: an engine whose tokenizer counts
// twice the router's estimate reports twice the cached tokens; that is
// agreement, not an excess (nor, halved, a shortfall).
func TestAuditScalesToTheEnginesTokens(t *testing.T) {
	for _, f := range []int64{2, 1} {
		a := NewAudit(AuditConfig{})
		a.SetBase(0, 1000)
		at := auditT0
		for range 4 * a.cfg.Window {
			at = at.Add(time.Second)
			v := a.Observe(Observation{Backend: 0, Prompt: 1000, Predicted: 600, Reported: 600 * f / 2, ReportedPrompt: 1000 * f / 2, Routed: at}, at)
			if v != Keep {
				t.Fatalf("factor %d/2: verdict %v", f, v)
			}
		}
	}
}

// TestAuditSkipsRequestsRoutedBeforeAVerdict: requests routed on the
// picture a verdict replaced are not judged again: a forget is not
// followed by a second one for the requests already in flight.
func TestAuditSkipsRequestsRoutedBeforeAVerdict(t *testing.T) {
	a := NewAudit(AuditConfig{})
	vs, at := feed(a, auditT0, a.cfg.Window, 800, 0)
	if len(vs) != 1 || vs[0] != Forget {
		t.Fatalf("verdicts %v, want forget", vs)
	}
	// A window's worth routed before the forget ends after it.
	routed := at.Add(-time.Millisecond)
	for range 2 * a.cfg.Window {
		at = at.Add(time.Second)
		if v := a.Observe(Observation{Backend: 0, Prompt: 1000, Predicted: 800, Routed: routed}, at); v != Keep {
			t.Fatalf("request routed before the forget gave %v", v)
		}
	}
	var sum Totals
	for _, t := range a.Backend(0).Totals {
		sum.Sum(t)
	}
	if got := sum.Requests; got != int64(3*a.cfg.Window) {
		t.Errorf("totals count %d requests, want all %d", got, 3*a.cfg.Window)
	}
}

// TestAuditTotals: the regret counters add up per policy.
func TestAuditTotals(t *testing.T) {
	a := NewAudit(AuditConfig{})
	a.Observe(Observation{Backend: 2, Policy: "kvroute", Prompt: 100, Predicted: 60, Best: 80, Reported: 50, EstTTFT: 0.1, TTFT: 0.2, Routed: auditT0}, auditT0)
	a.Observe(Observation{Backend: 2, Policy: "round-robin", Prompt: 100, Best: 70, Reported: 10, Routed: auditT0}, auditT0)
	b := a.Backend(2)
	k, rr := b.Totals["kvroute"], b.Totals["round-robin"]
	if k != (Totals{Requests: 1, Prompt: 100, Predicted: 60, Best: 80, Reported: 50, TTFTRequests: 1, EstTTFTSeconds: 0.1, TTFTSeconds: 0.2}) {
		t.Errorf("kvroute totals %+v", k)
	}
	if rr.Reported != 10 || rr.Best != 70 || rr.TTFTRequests != 0 {
		t.Errorf("round-robin totals %+v", rr)
	}
	var sum Totals
	sum.Sum(k)
	sum.Sum(rr)
	if sum.Requests != 2 || sum.Reported != 60 {
		t.Errorf("sum %+v", sum)
	}
}

// TestAuditBackendUnseen: a backend the audit never heard of has empty,
// writable maps (a scrape before any request must not panic).
func TestAuditBackendUnseen(t *testing.T) {
	a := NewAudit(AuditConfig{})
	for _, id := range []int{-1, 0, 5} {
		b := a.Backend(id)
		b.Totals["kvroute"] = Totals{}
		if b.Untrusted || b.Capacity != DefaultCapacity || b.Actions["forget"] != 0 || len(b.Actions) != len(Verdicts) {
			t.Errorf("backend %d: %+v", id, b)
		}
	}
}
