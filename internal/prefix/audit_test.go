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
func feed(a *Audit, at time.Time, n int, pred, rep int64, held int) ([]Verdict, time.Time) {
	var out []Verdict
	for range n {
		at = at.Add(time.Second)
		v := a.Observe(Observation{Backend: 0, Policy: "kvroute", Prompt: 1000, Predicted: pred, Reported: rep, Held: held, Routed: at}, at)
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
	vs, at := feed(a, auditT0, 40, 800, 780, 5000)
	if len(vs) != 0 {
		t.Fatalf("predictions borne out gave verdicts %v", vs)
	}
	// The reset comes mid-window.
	_, at = feed(a, at, 3, 800, 780, 5000)
	vs, _ = feed(a, at, 2*a.cfg.Window, 800, 0, 5000)
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
	vs, at := feed(a, auditT0, 3*a.cfg.Window, 800, 0, 5000)
	want := []Verdict{Forget, Forget, Untrust}
	if len(vs) != len(want) || vs[0] != want[0] || vs[1] != want[1] || vs[2] != want[2] {
		t.Fatalf("verdicts %v, want %v", vs, want)
	}
	if !a.Untrusted(0) || !a.AnyUntrusted() || a.Untrusted(1) {
		t.Fatal("backend 0 not untrusted (or another one is)")
	}
	// Still missing: no more verdicts while untrusted.
	if vs, at = feed(a, at, 2*a.cfg.Window, 800, 0, 5000); len(vs) != 0 {
		t.Errorf("untrusted backend still missing gave %v", vs)
	}
	vs, _ = feed(a, at, a.cfg.Window, 800, 790, 5000)
	if len(vs) != 1 || vs[0] != Trust || a.Untrusted(0) || a.AnyUntrusted() {
		t.Errorf("agreeing window gave %v, untrusted %v", vs, a.Untrusted(0))
	}
}

// TestAuditShrinksToWhatTheEngineKeeps: an engine that bears out a
// quarter of the predicted hits (it evicts earlier than the index: a
// llama.cpp server keeping only its slots' prompts) has its capacity cut
// to a quarter of the blocks held once forgetting did not help; one that then reports clearly more
// than predicted grows back, never beyond its base.
func TestAuditShrinksToWhatTheEngineKeeps(t *testing.T) {
	a := NewAudit(AuditConfig{})
	if c := a.SetBase(0, 40000); c != 40000 {
		t.Fatalf("capacity %d before any verdict, want the base", c)
	}
	// The first shortfall forgets (a reset?); the second, on the
	// relearned picture, shrinks.
	vs, at := feed(a, auditT0, 2*a.cfg.Window, 800, 200, 8000)
	if len(vs) != 2 || vs[0] != Forget || vs[1] != Shrink {
		t.Fatalf("verdicts %v, want forget, shrink", vs)
	}
	if c := a.Capacity(0); c != 2000 {
		t.Errorf("capacity %d after a quarter borne out of 8000 blocks, want 2000", c)
	}
	// A new base (the engine's metrics) keeps the audited cap.
	if c := a.SetBase(0, 50000); c != 2000 {
		t.Errorf("capacity %d after a new base, want the audited 2000", c)
	}
	vs, at = feed(a, at, a.cfg.Window, 100, 700, 2000)
	if len(vs) != 1 || vs[0] != Grow || a.Capacity(0) != 4000 {
		t.Fatalf("verdicts %v, capacity %d, want grow to 4000", vs, a.Capacity(0))
	}
	for range 10 {
		_, at = feed(a, at, a.cfg.Window, 100, 700, 2000)
	}
	if c := a.Capacity(0); c != 50000 {
		t.Errorf("capacity %d after growing, want the base 50000", c)
	}
	a.Reset(0)
	if c := a.Capacity(0); c != 50000 {
		t.Errorf("capacity %d after a reset, want the base", c)
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
			v := a.Observe(Observation{Backend: 0, Prompt: 1000, Predicted: 600, Reported: 600 * f / 2, ReportedPrompt: 1000 * f / 2, Held: 1000, Routed: at}, at)
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
	vs, at := feed(a, auditT0, a.cfg.Window, 800, 0, 5000)
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
