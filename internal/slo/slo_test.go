package slo

import (
	"net/http"
	"testing"
	"time"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		want Objective
		bad  bool
	}{
		{"none", hdr(), Objective{}, false},
		{"llm-d's", hdr("x-llm-d-slo-ttft-ms", "500", "x-llm-d-slo-tpot-ms", "20"), Objective{TTFT: 500 * time.Millisecond, ITL: 20 * time.Millisecond}, false},
		{"kvroute's win", hdr(HeaderTTFT, "250", "x-llm-d-slo-ttft-ms", "500"), Objective{TTFT: 250 * time.Millisecond}, false},
		{"fraction", hdr(HeaderITL, " 12.5 "), Objective{ITL: 12500 * time.Microsecond}, false},
		{"zero", hdr(HeaderTTFT, "0"), Objective{}, true},
		{"negative", hdr(HeaderITL, "-5"), Objective{}, true},
		{"not a number", hdr("x-llm-d-slo-ttft-ms", "fast"), Objective{}, true},
		{"NaN", hdr(HeaderTTFT, "NaN"), Objective{}, true},
		{"over a day", hdr(HeaderTTFT, "86400001"), Objective{}, true},
		{"bad llm-d beside a good kvroute", hdr(HeaderTTFT, "100", "x-llm-d-slo-ttft-ms", "x"), Objective{TTFT: 100 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, e := ParseHeaders(tc.h)
			if (e != nil) != tc.bad {
				t.Fatalf("error %v, want bad=%v", e, tc.bad)
			}
			if e != nil {
				if e.Status != http.StatusBadRequest || e.Code != "invalid_slo" {
					t.Errorf("error %d %s, want 400 invalid_slo", e.Status, e.Code)
				}
				return
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	d := &Defaults{
		Models:     map[string]Objective{"m": {TTFT: time.Second, ITL: 50 * time.Millisecond}},
		Objectives: map[string]int{"batch": -10, "vip": 5, "plain": 0},
	}
	critTenant := Objective{TTFT: 300 * time.Millisecond, Class: Critical}
	for _, tc := range []struct {
		name string
		h    http.Header
		src  Source
		want Objective
		bad  bool
	}{
		{"model default", hdr(), Source{Model: "m"}, Objective{TTFT: time.Second, ITL: 50 * time.Millisecond}, false},
		{"header over tenant over model", hdr(HeaderITL, "10"), Source{Model: "m", Tenant: critTenant},
			Objective{TTFT: 300 * time.Millisecond, ITL: 10 * time.Millisecond, Class: Critical}, false},
		{"anyone may lower", hdr(HeaderClass, "sheddable"), Source{Model: "x"}, Objective{Class: Sheddable}, false},
		{"a critical tenant may lower to standard", hdr(HeaderClass, "standard"), Source{Tenant: critTenant},
			Objective{TTFT: 300 * time.Millisecond}, false},
		{"no one else may raise", hdr(HeaderClass, "critical"), Source{}, Objective{}, false},
		{"a trusted front may raise", hdr(HeaderClass, "Critical"), Source{FromFront: true}, Objective{Class: Critical}, false},
		{"objective priority below 0 is sheddable", hdr(HeaderObjective, "batch"), Source{}, Objective{Class: Sheddable}, false},
		{"objective priority above 0 only from a front", hdr(HeaderObjective, "vip"), Source{}, Objective{}, false},
		{"objective priority above 0 from a front", hdr(HeaderObjective, "vip"), Source{FromFront: true}, Objective{Class: Critical}, false},
		{"unknown objective", hdr(HeaderObjective, "nope"), Source{Tenant: Objective{Class: Sheddable}}, Objective{Class: Sheddable}, false},
		{"criticality header wins over the objective's", hdr(HeaderObjective, "plain", HeaderClass, "sheddable"), Source{}, Objective{Class: Sheddable}, false},
		{"bad criticality", hdr(HeaderClass, "urgent"), Source{FromFront: true}, Objective{}, true},
		{"bad duration", hdr(HeaderTTFT, "soon"), Source{}, Objective{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, e := d.Resolve(tc.h, tc.src)
			if (e != nil) != tc.bad {
				t.Fatalf("error %v, want bad=%v", e, tc.bad)
			}
			if e == nil && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if e != nil && e.Status != http.StatusBadRequest {
				t.Errorf("status %d, want 400", e.Status)
			}
		})
	}
	var none *Defaults
	if o, e := none.Resolve(hdr(HeaderTTFT, "5"), Source{}); e != nil || o.TTFT != 5*time.Millisecond {
		t.Errorf("nil defaults: %+v %v", o, e)
	}
}

func TestChoose(t *testing.T) {
	tight := Objective{TTFT: time.Second, ITL: 50 * time.Millisecond}
	shed := Objective{TTFT: 4 * time.Second, ITL: 200 * time.Millisecond, Class: Sheddable}
	for _, tc := range []struct {
		name  string
		o     Objective
		preds []Prediction
		pick  int
		want  Choice
	}{
		// Candidate 1 meets with the margin and has the most headroom.
		{"most headroom for a request that may not be shed", tight,
			[]Prediction{{0.6, 0.03}, {0.1, 0.01}, {0.5, 0.02}}, 0, Choice{Index: 1, Met: true}},
		{"a sheddable one packs onto the least headroom", shed,
			[]Prediction{{0.5, 0.02}, {2.5, 0.1}, {3.9, 0.1}}, 0, Choice{Index: 1, Met: true}},
		{"meets only without the margin", tight,
			[]Prediction{{0.9, 0.04}, {2, 0.01}}, 1, Choice{Index: 0, Met: true}},
		{"best effort on the pick", tight,
			[]Prediction{{2, 0.01}, {0.5, 0.09}}, 1, Choice{Index: 1}},
		{"critical best effort too", Objective{TTFT: time.Second, Class: Critical},
			[]Prediction{{3, 0}, {2, 0}}, 0, Choice{Index: 0}},
		{"sheddable refused without the margin", shed,
			[]Prediction{{3, 0.01}, {5, 0.01}}, 0, Choice{Index: -1}},
		{"an unset objective is always met", Objective{ITL: 50 * time.Millisecond},
			[]Prediction{{100, 0.02}, {1, 0.03}}, 1, Choice{Index: 0, Met: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Choose(tc.o, tc.preds, tc.pick); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestJudgeAndRetryAfter(t *testing.T) {
	o := Objective{TTFT: time.Second, ITL: 40 * time.Millisecond}
	if a := o.Judge(time.Second, 40*time.Millisecond); !a.Both() {
		t.Errorf("on the objectives: %+v", a)
	}
	if a := o.Judge(1001*time.Millisecond, 0); a.TTFT || !a.ITL {
		t.Errorf("late, one token: %+v", a)
	}
	if a := (Objective{TTFT: time.Second}).Judge(0, time.Hour); !a.ITL {
		t.Errorf("no ITL objective: %+v", a)
	}
	if ra := RetryAfter(o, Prediction{TTFT: 4.5}); ra != 4 {
		t.Errorf("Retry-After %d, want 4 (3.5 s over, rounded up)", ra)
	}
	if ra := RetryAfter(o, Prediction{TTFT: 1.2}); ra != 1 {
		t.Errorf("Retry-After %d, want 1", ra)
	}
}

func TestReserve(t *testing.T) {
	var r Reserve
	t0 := time.Unix(1000, 0)
	batch := Objective{TTFT: 8 * time.Second, ITL: 200 * time.Millisecond, Class: Sheddable}
	if got := r.Hold(batch, t0); got != batch {
		t.Fatalf("nothing noted: %+v", got)
	}
	r.Note(Objective{TTFT: time.Second, ITL: 60 * time.Millisecond, Class: Critical}, t0)
	r.Note(Objective{TTFT: 4 * time.Second, ITL: 40 * time.Millisecond}, t0.Add(time.Second))
	r.Note(batch, t0.Add(time.Second)) // a sheddable one holds nobody
	want := Objective{TTFT: time.Second, ITL: 40 * time.Millisecond, Class: Sheddable}
	if got := r.Hold(batch, t0.Add(2*time.Second)); got != want {
		t.Errorf("held to %+v, want %+v", got, want)
	}
	std := Objective{TTFT: 9 * time.Second}
	if got := r.Hold(std, t0.Add(2*time.Second)); got != std {
		t.Errorf("a standard request held: %+v", got)
	}
	// The critical TTFT lapses after the window; the looser one noted
	// later then holds.
	r.Note(Objective{TTFT: 4 * time.Second}, t0.Add(ReserveWindow+time.Second))
	if got := r.Hold(batch, t0.Add(ReserveWindow+2*time.Second)); got.TTFT != 4*time.Second {
		t.Errorf("after the window: %+v", got)
	}
	if got := r.Hold(batch, t0.Add(3*ReserveWindow)); got != batch {
		t.Errorf("after every window: %+v", got)
	}
}

func TestClass(t *testing.T) {
	for _, c := range Classes {
		back, err := ParseClass(c.String())
		if err != nil || back != c {
			t.Errorf("%v round trip: %v %v", c, back, err)
		}
	}
	if !Sheddable.Lowers(Standard) || !Standard.Lowers(Critical) || Critical.Lowers(Standard) || !Standard.Lowers(Standard) {
		t.Error("Lowers is not the standing order")
	}
	if FromPriority(-1) != Sheddable || FromPriority(0) != Standard || FromPriority(3) != Critical {
		t.Error("FromPriority")
	}
}

// FuzzParseHeaders: whatever a client sends in the objectives' headers is
// a clean 400 or a valid objective, never a panic or a negative duration.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{"500", "0.5", "-1", "NaN", "1e300", "", " 20 ", "critical", "sheddable"} {
		f.Add(s, s, s)
	}
	f.Fuzz(func(t *testing.T, ttft, itl, class string) {
		h := http.Header{}
		h[HeaderLLMDTTFT] = []string{ttft}
		h[HeaderITL] = []string{itl}
		h[HeaderClass] = []string{class}
		d := &Defaults{Objectives: map[string]int{class: -1}}
		o, e := d.Resolve(h, Source{FromFront: len(class)%2 == 0})
		if e != nil {
			if e.Status != http.StatusBadRequest {
				t.Fatalf("status %d", e.Status)
			}
			return
		}
		if o.TTFT < 0 || o.ITL < 0 || o.TTFT > MaxMillis*time.Millisecond || o.ITL > MaxMillis*time.Millisecond {
			t.Fatalf("objective %+v", o)
		}
	})
}

func TestSetHeadersRoundTrip(t *testing.T) {
	o := Objective{TTFT: 1500 * time.Microsecond, ITL: 40 * time.Millisecond, Class: Sheddable}
	h := http.Header{}
	o.SetHeaders(h)
	got, e := (*Defaults)(nil).Resolve(h, Source{})
	if e != nil || got != o {
		t.Errorf("round trip %+v %v, want %+v", got, e, o)
	}
}
