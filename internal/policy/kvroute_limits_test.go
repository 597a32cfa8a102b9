package policy

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
)

func TestSlotWait(t *testing.T) {
	tests := []struct {
		name                          string
		queued, limit, decoding, mean int64
		tokenTime, want               float64
	}{
		{"a free slot", 7, 8, 7, 100, 0.01, 0},
		{"no cap", 50, 0, 7, 100, 0.01, 0},
		{"the last slot just taken: the first of 8 streams to finish", 8, 8, 8, 180, 0.01, 1 * 180.0 / 9 * 0.01},
		{"two queued ahead: the third to finish", 10, 8, 8, 180, 0.01, 3 * 180.0 / 9 * 0.01},
		{"slots held by prefills: a whole output", 8, 8, 0, 180, 0.01, 180 * 0.01},
		{"more to finish than decode: the same rate carries on", 20, 8, 4, 100, 0.02, 13 * 100.0 / 5 * 0.02},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := slotWait(tt.queued, tt.limit, tt.decoding, tt.mean, tt.tokenTime)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("slotWait = %v, want %v", got, tt.want)
			}
		})
	}
}

// fxLimits gives b's engine the cap and chunk it is configured with and a
// reported time per output token (0: none).
func fxLimits(b *fleet.Backend, maxNumSeqs, chunk int, tokenTime float64) {
	b.SetMaxNumSeqs(maxNumSeqs)
	b.SetMaxBatchedTokens(chunk)
	if tokenTime > 0 {
		b.ObserveEngineDecode(1000, 1000*tokenTime)
	}
}

func TestKVRouteSlotWaitByHand(t *testing.T) {
	// 8 decoding streams of 1,000-token prompts and 100-token budgets, and
	// two prompts of 500 tokens not yet started: 10 requests at an engine
	// that runs 8, so a new one waits for the third stream to finish.
	loads := []fxLoad{{decoding: 8, ctx: 1000, pending: []int64{500, 500}}}
	const prompt = 2000
	co := costmodel.Generic().Coeffs
	step := co.DecodeStep(8, 8000)
	pairs := co.Attn * costmodel.AttnPairs(prompt, 0)
	base := step + (1000+prompt)*co.Token + pairs // one step of work
	own := step + prompt*co.Token + pairs
	tests := []struct {
		name      string
		cap       int
		tokenTime float64
		want      float64
	}{
		{"no cap known: prefill only", 0, 0.01, base},
		{"a cap above the queue: prefill only", 16, 0.01, base},
		{"the engine's inter-token latency", 8, 0.01, 3*100.0/9*0.01 + own},
		{"no latency reported: a step of the decoding batch by the cost model", 8, 0,
			3*100.0/9*step + own},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			fxLimits(cands[0], tt.cap, 0, tt.tokenTime)
			d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, prompt, ""))
			if math.Abs(d.EstTTFT-tt.want) > tt.want*1e-9 {
				t.Fatalf("EstTTFT = %v, want %v", d.EstTTFT, tt.want)
			}
		})
	}
}

func TestKVRouteSlotWaitFromEngineReport(t *testing.T) {
	// The engine reports more at it than the router sent (another
	// router's requests): its running and waiting count fill the slots.
	loads := []fxLoad{{decoding: 2, ctx: 1000, kvTokens: 1 << 20}}
	cands := fxBackends(t, loads...)
	fxLimits(cands[0], 4, 0, 0.01)
	cands[0].SetEngine(&fleet.EngineState{At: fxT0, Running: 4, Waiting: 1, KVBlocks: 1 << 16, BlockSize: 16})
	d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 100, ""))
	// 5 at the engine, cap 4: the second of 4 streams (2 ours, 2 more
	// running) to finish, at the mean budget of ours (100).
	if want := 2 * 100.0 / 5 * 0.01; d.EstTTFT < want {
		t.Fatalf("EstTTFT = %v, want at least the slot wait %v", d.EstTTFT, want)
	}
}

func TestKVRouteSlotWaitMovesConversation(t *testing.T) {
	// A conversation's backend holds its history (1,000 tokens) but every
	// slot is taken and two more wait; the other backend has a free slot.
	// Prefill alone keeps it home (within AffinityRatio); the slot wait,
	// once the cap is known, sends it away.
	loads := []fxLoad{{matched: 60, decoding: 8, ctx: 1000, pending: []int64{200, 200}}, {decoding: 4, ctx: 1000}}
	const prompt = 1100
	tests := []struct {
		name string
		cap  int
		want int
		note string
	}{
		{"cap unknown: sticky", 0, 0, "sticky"},
		{"cap known: spill", 8, 1, "spill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			for _, b := range cands {
				fxLimits(b, tt.cap, 0, 0.01)
			}
			p := fxNew(t, "kvroute", Options{})
			in := fxInput(cands, loads, prompt, "conv-1")
			p.(*KVRoute).LearnSession(Claim{Session: in.SessionHash}, cands[0].ID)
			if d := p.Pick(in); d.Index != tt.want || d.Note != tt.note {
				t.Fatalf("picked %d (%q, est %.4fs), want %d (%q)", d.Index, d.Note, d.EstTTFT, tt.want, tt.note)
			}
		})
	}
}

func TestKVRouteChunkFromEngine(t *testing.T) {
	// A 2,000-token prompt beside 50 decoding streams spans 4 steps of a
	// 512-token chunk, and pays the batch's share in each.
	loads := []fxLoad{{decoding: 50, ctx: 8000}}
	cands := fxBackends(t, loads...)
	fxLimits(cands[0], 0, 512, 0)
	co := costmodel.Generic().Coeffs
	want := 4*co.DecodeStep(50, 50*8000) + 2000*co.Token + co.Attn*costmodel.AttnPairs(2000, 0)
	if d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 2000, "")); math.Abs(d.EstTTFT-want) > want*1e-9 {
		t.Fatalf("EstTTFT = %v, want %v", d.EstTTFT, want)
	}
}

func TestStickyTokens(t *testing.T) {
	type lim struct{ chunk, ctx int }
	tests := []struct {
		name         string
		holder, best lim
		want         float64
	}{
		{"nothing reported: the prior's chunk", lim{}, lim{}, costmodel.GenericChunk},
		{"one chunk of the engines'", lim{2048, 0}, lim{2048, 0}, 2048},
		{"a quarter of a small context", lim{0, 4096}, lim{0, 4096}, 1024},
		{"a large context does not bind", lim{512, 131072}, lim{512, 131072}, 512},
		{"the smaller of the two engines'", lim{4096, 0}, lim{0, 8192}, 2048},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fleet.New()
			h, b := f.Add("h", nil, nil), f.Add("b", nil, nil)
			h.SetMaxBatchedTokens(tt.holder.chunk)
			h.SetContextLen(tt.holder.ctx)
			b.SetMaxBatchedTokens(tt.best.chunk)
			b.SetContextLen(tt.best.ctx)
			if got := stickyTokens(h, b); got != tt.want {
				t.Fatalf("stickyTokens = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestKVRouteCacheStickyScaled(t *testing.T) {
	// A 3,000-token prompt without a session key whose 2,400 leading tokens
	// (150 blocks) one backend holds, with a queue there: on engines of a
	// 4,096-token context the lead exceeds the scaled threshold (1,024) and
	// the prompt stays; with nothing reported (8,192) the estimate decides.
	loads := []fxLoad{{matched: 150, pending: []int64{3000}}, {}}
	for _, tt := range []struct {
		ctx  int
		want int
		note string
	}{{4096, 0, "cache"}, {0, 1, "load"}} {
		cands := fxBackends(t, loads...)
		for _, b := range cands {
			b.SetContextLen(tt.ctx)
		}
		if d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 3000, "")); d.Index != tt.want || d.Note != tt.note {
			t.Errorf("context %d: picked %d (%q), want %d (%q)", tt.ctx, d.Index, d.Note, tt.want, tt.note)
		}
	}
}
