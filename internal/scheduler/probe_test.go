package scheduler

import (
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// probeSetup is two backends, a policy that always picks b0 with an
// estimate, and backend b1 avoided for one interval: routed once at t0
// (it is seen then, as a newcomer is) and passed over since.
func probeSetup(t *testing.T, cfg Config) (*Scheduler, *fixed, *fleet.Fleet) {
	t.Helper()
	f := newFleet(t, 2)
	p := &fixed{i: 0, est: 0.1}
	s := New(f, p, cfg)
	for i := range 2 {
		a, err := s.Route(probeView(i, fleet.MinRateWork+10, true), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		if a.Backend.ID != 0 {
			t.Fatalf("routing %d went to b%d before any probe", i, a.Backend.ID)
		}
		a.Done(t0)
	}
	return s, p, f
}

// probeView is a request of a fresh prompt of about tokens tokens.
func probeView(seed, tokens int, stream bool) *request.View {
	v := view("", text(1000+seed, tokens*4))
	v.Stream = stream
	return v
}

func TestProbeAvoidedBackend(t *testing.T) {
	s, _, _ := probeSetup(t, Config{})
	early := t0.Add(DefaultProbeInterval - time.Millisecond)
	a, _ := s.Route(probeView(10, fleet.MinRateWork+10, true), nil, early)
	if a.Backend.ID != 0 {
		t.Fatalf("probed b%d before the interval passed: %s", a.Backend.ID, a.Reason)
	}
	a.Done(early)

	at := t0.Add(DefaultProbeInterval)
	a, _ = s.Route(probeView(11, fleet.MinRateWork+10, true), nil, at)
	if a.Backend.ID != 1 || !strings.HasSuffix(a.Reason, " "+ProbeNote) || a.EstTTFT != 0 {
		t.Fatalf("after an interval avoided: b%d %q est %g, want a probe of b1 with no estimate", a.Backend.ID, a.Reason, a.EstTTFT)
	}
	var m dto.Metric
	if err := s.probes.total.WithLabelValues("b1").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		n := m.GetCounter().GetValue()
		t.Fatalf("kvroute_probes_total{backend=b1} = %g, want 1", n)
	}
	a.FirstByte(at.Add(30 * time.Millisecond))
	a.Done(at.Add(40 * time.Millisecond))

	// At most one probe per interval, and the probe's first byte taught
	// b1 a rate (noticed at the next routing): its estimate rests on a
	// fresh reading until an interval after that.
	noticed := at.Add(time.Second)
	for dt := time.Second; ; dt += time.Second {
		now := at.Add(dt)
		a, _ = s.Route(probeView(100+int(dt/time.Second), fleet.MinRateWork+10, true), nil, now)
		a.Done(now)
		if a.Backend.ID == 1 {
			if want := noticed.Add(DefaultProbeInterval); !now.Equal(want) {
				t.Fatalf("probed again at %v, want %v (an interval after its new rate was noticed)", now.Sub(t0), want.Sub(t0))
			}
			return
		}
		if dt > 3*DefaultProbeInterval {
			t.Fatal("no second probe")
		}
	}
}

func TestProbeUnsuitable(t *testing.T) {
	at := t0.Add(DefaultProbeInterval)
	for _, tc := range []struct {
		name string
		cfg  Config
		// prep changes the setup before the routing at at.
		prep   func(*fixed, *fleet.Fleet)
		tokens int
		stream bool
	}{
		{name: "probe suits", tokens: fleet.MinRateWork + 10, stream: true},
		{name: "not streamed", tokens: fleet.MinRateWork + 10},
		{name: "teaches no rate", tokens: fleet.MinRateWork - 20, stream: true},
		{name: "not short", tokens: ProbeMaxTokens + 20, stream: true},
		{name: "probes off", cfg: Config{ProbeInterval: -1}, tokens: fleet.MinRateWork + 10, stream: true},
		{name: "policy makes no estimate", prep: func(p *fixed, _ *fleet.Fleet) { p.est = 0 }, tokens: fleet.MinRateWork + 10, stream: true},
		{name: "request in flight there", prep: func(_ *fixed, f *fleet.Fleet) {
			f.Snapshot().All[1].Start(10, 10, 10, t0)
		}, tokens: fleet.MinRateWork + 10, stream: true},
		{name: "figures just changed", prep: func(_ *fixed, f *fleet.Fleet) {
			// An engine reading that teaches its cost model.
			f.Snapshot().All[1].Learn(fleet.Reading{State: &fleet.EngineState{At: t0}, PrefillTokens: 1000, PrefillSeconds: 0.1, ComputedTokens: -1})
		}, tokens: fleet.MinRateWork + 10, stream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, p, f := probeSetup(t, tc.cfg)
			if tc.prep != nil {
				tc.prep(p, f)
			}
			a, err := s.Route(probeView(40, tc.tokens, tc.stream), nil, at)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if tc.name == "probe suits" {
				want = 1
			}
			if a.Backend.ID != want {
				t.Fatalf("routed to b%d (%s), want b%d", a.Backend.ID, a.Reason, want)
			}
		})
	}
}

// A backend passed over fewer times than there are candidates is not
// avoided, whatever the time: a fair spread would not have reached it yet.
func TestProbeNeedsPassedOver(t *testing.T) {
	s := New(newFleet(t, 3), &fixed{i: 0, est: 0.1}, Config{})
	at := t0.Add(DefaultProbeInterval)
	for i, at := range []time.Time{t0, at, at, at} {
		a, _ := s.Route(probeView(50+i, fleet.MinRateWork+10, true), nil, at)
		got := a.Backend.ID
		a.Done(at)
		if want := []int{0, 0, 0, 1}[i]; got != want {
			t.Fatalf("routing %d: b%d, want b%d", i, got, want)
		}
	}
}
