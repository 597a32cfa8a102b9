package policy

import (
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

// TestKVRouteEngineWaitingBesideDecoding: the engine's waiting count is
// read against the router's requests that have not started (in flight less
// decoding), not against all of them. A backend where the router has two
// decoding streams and whose engine reports two waiting holds two foreign
// requests that will prefill before ours; subtracting the decoding streams
// too would cancel them out and price the backend as idle.
func TestKVRouteEngineWaitingBesideDecoding(t *testing.T) {
	const prompt = 2000
	decoding := fxLoad{decoding: 2, ctx: 4000}
	loads := []fxLoad{decoding, decoding}
	cands := fxBackends(t, loads...)
	cands[0].SetEngine(&fleet.EngineState{At: fxT0, Running: 2, Waiting: 2})
	cands[1].SetEngine(&fleet.EngineState{At: fxT0, Running: 2, Waiting: 0})
	p := fxNew(t, "kvroute", Options{})
	foreign := p.Pick(fxInput(cands[:1], loads[:1], prompt, ""))
	none := p.Pick(fxInput(cands[1:], loads[1:], prompt, ""))
	if foreign.EstTTFT <= none.EstTTFT {
		t.Errorf("est TTFT %v behind 2 foreign waiting requests, %v behind none: the waiting requests were not counted",
			foreign.EstTTFT, none.EstTTFT)
	}
	for range 4 {
		if d := p.Pick(fxInput(cands, loads, prompt, "")); d.Index != 1 {
			t.Fatalf("picked %d (est %v), want 1, whose engine has nobody waiting", d.Index, d.EstTTFT)
		}
	}

	// The router's own requests that have not started yet are the engine's
	// waiting ones, and count once, decoding streams beside them or not.
	own := []fxLoad{{decoding: 2, ctx: 4000, pending: []int64{500, 500}}, {decoding: 2, ctx: 4000, pending: []int64{500, 500}}}
	cands = fxBackends(t, own...)
	cands[0].SetEngine(&fleet.EngineState{At: fxT0, Running: 2, Waiting: 2})
	a := p.Pick(fxInput(cands[:1], own[:1], prompt, ""))
	b := p.Pick(fxInput(cands[1:], own[1:], prompt, ""))
	if a.EstTTFT != b.EstTTFT {
		t.Errorf("own waiting requests counted twice beside decoding streams: est %v with the report, %v without", a.EstTTFT, b.EstTTFT)
	}
}
