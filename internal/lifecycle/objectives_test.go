package lifecycle

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/slo"
)

// TestAttainment: what a settled request attained of its objectives, the
// one judgement every front's records read: met or missed from its TTFT
// and its stream's inter-token latency, its output tokens goodput only
// within both, the prediction's error observed over predicted; a shed
// request is counted shed, one not served whole is counted and met
// nothing; a request without objectives, or whose answer went
// unreported, is not recorded.
func TestAttainment(t *testing.T) {
	obj := slo.Objective{TTFT: 200 * time.Millisecond, ITL: 50 * time.Millisecond}
	served := BodyEnd{Complete: true, Counted: true, Out: 11, Decoding: 300 * time.Millisecond} // 30 ms a token
	for _, c := range []struct {
		name       string
		obj        slo.Objective
		status     int
		code       string
		ttft       time.Duration
		end        BodyEnd
		unreported bool
		want       Attainment
		recorded   bool
	}{
		{name: "met", obj: obj, status: 200, ttft: 100 * time.Millisecond, end: served, recorded: true,
			want: Attainment{Judged: true, Met: slo.Attained{TTFT: true, ITL: true}, Goodput: 11, TTFTRatio: 0.5, ITLRatio: 1.5}},
		{name: "ttft missed", obj: obj, status: 200, ttft: 300 * time.Millisecond, end: served, recorded: true,
			want: Attainment{Judged: true, Met: slo.Attained{ITL: true}, TTFTRatio: 1.5, ITLRatio: 1.5}},
		{name: "itl missed", obj: slo.Objective{ITL: 10 * time.Millisecond}, status: 200, ttft: 100 * time.Millisecond, end: served, recorded: true,
			want: Attainment{Judged: true, Met: slo.Attained{TTFT: true}, TTFTRatio: 0.5, ITLRatio: 1.5}},
		{name: "cut", obj: obj, status: 200, ttft: 100 * time.Millisecond, end: BodyEnd{Counted: true, Out: 3}, recorded: true},
		{name: "failed", obj: obj, status: 502, end: BodyEnd{Complete: true}, recorded: true},
		{name: "shed", obj: obj, status: 429, code: scheduler.CodeShed, recorded: true, want: Attainment{Shed: true}},
		{name: "client gone", obj: obj, status: StatusClientGone, recorded: true},
		{name: "unreported", obj: obj, status: StatusClientGone, unreported: true},
		{name: "no objectives", status: 200, ttft: 100 * time.Millisecond, end: served},
	} {
		r := &Request{View: &request.View{Objective: c.obj}, Model: "m", Status: c.status, Code: c.code, TTFT: c.ttft, unreported: c.unreported}
		r.Legs = []Leg{{A: &scheduler.Assignment{Backend: &fleet.Backend{Name: "b"}, Pred: slo.Prediction{TTFT: 0.2, ITL: 0.02}}}}
		got, ok := r.attainment(c.end)
		if ok != c.recorded {
			t.Errorf("%s: recorded %v, want %v", c.name, ok, c.recorded)
			continue
		}
		if !ok {
			continue
		}
		c.want.Model, c.want.Class = "m", c.obj.Class
		if c.want.TTFTRatio > 0 || c.want.ITLRatio > 0 {
			c.want.Backend = "b"
		}
		round := func(x float64) float64 { return math.Round(x*1e9) / 1e9 }
		got.TTFTRatio, got.ITLRatio = round(got.TTFTRatio), round(got.ITLRatio)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
