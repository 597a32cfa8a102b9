package costmodel

import (
	"math"
	"testing"
)

// A lower tier's load time per token: the engine's reports once there are
// any, else the prior's figure, else the default; a frozen model keeps its
// prior's.
func TestLoadPerToken(t *testing.T) {
	p := Generic()
	m := New(p)
	if got := m.LoadPerToken(TierHost); got != DefaultHostLoad {
		t.Errorf("no figure: host load %g, want the default %g", got, DefaultHostLoad)
	}
	p.HostLoad, p.DiskLoad = 2e-6, 30e-6
	m, f := New(p), Frozen(p)
	if m.LoadPerToken(TierHost) != 2e-6 || m.LoadPerToken(TierDisk) != 30e-6 {
		t.Errorf("prior: %g %g", m.LoadPerToken(TierHost), m.LoadPerToken(TierDisk))
	}
	for _, x := range []*Model{m, f} {
		x.ObserveLoad(TierHost, 1000, 5e-3)
		x.ObserveLoad(TierHost, 0, 1)           // no tokens: ignored
		x.ObserveLoad(TierHost, 10, math.NaN()) // ignored
	}
	if got := m.LoadPerToken(TierHost); math.Abs(got-5e-6) > 1e-12 {
		t.Errorf("learned host load %g, want 5e-6", got)
	}
	if got := f.LoadPerToken(TierHost); got != 2e-6 {
		t.Errorf("frozen model learned: %g", got)
	}
	if m.LoadPerToken(TierDisk) != 30e-6 || m.LoadPerToken(5) != 0 {
		t.Error("disk figure changed, or an unknown tier priced")
	}
}
