package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// decodeLeg turns in into a split request's decode leg.
func decodeLeg(in *Input) *Input {
	v := *in.View
	v.Role = RoleDecodeLeg
	in.View = &v
	return in
}

func TestKVRouteDecodeLeg(t *testing.T) {
	tests := []struct {
		name  string
		loads []fxLoad
		want  int
	}{
		// The prefill leg's pick would send a prompt to the engine that
		// holds it; a decode leg's transfer of 4,000 tokens costs 13 ms,
		// less than a batch of 40 streams more.
		{"fewer decoding streams beat the holder", []fxLoad{{decoding: 40, ctx: 4000, matched: 250}, {decoding: 2, ctx: 4000}}, 1},
		{"the holder receives less on a tie of streams", []fxLoad{{decoding: 4, ctx: 2000}, {decoding: 4, ctx: 2000, matched: 250}}, 1},
		{"queued prefill work (a whole request) counts", []fxLoad{{decoding: 2, ctx: 2000, pending: []int64{30000}}, {decoding: 3, ctx: 2000}}, 1},
		{"room in the KV cache for what it receives", []fxLoad{{decoding: 1, ctx: 1000, kvTokens: 100000, kvUsage: 0.99}, {decoding: 3, ctx: 1000, kvTokens: 100000, kvUsage: 0.2}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := fxBackends(t, tt.loads...)
			p := fxNew(t, "kvroute", Options{})
			in := decodeLeg(fxInput(bs, tt.loads, 4000, ""))
			d := p.Pick(in)
			if d.Index != tt.want || d.Note != "decode" {
				t.Errorf("picked %d (%q, est %.4fs); want %d", d.Index, d.Note, d.EstTTFT, tt.want)
			}
			// The same candidates for a prefill leg or a whole request go
			// by today's estimate, where the holder's cache weighs.
			in.View.Role = "prefill"
			if d := p.Pick(in); d.Note == "decode" {
				t.Errorf("a prefill leg picked with the decode estimate")
			}
		})
	}
}

func TestLLMDPDDecider(t *testing.T) {
	p := NewLLMDPD(Options{})
	tests := []struct {
		prompt, uncached int64
		want             bool
	}{
		{4000, 4000, true},
		{4000, 16, true},
		{4000, 15, false}, // a decode endpoint that holds all but 15 tokens: decode only
		{10, 10, false},
	}
	for _, tt := range tests {
		if got := p.Disaggregate(tt.prompt, tt.uncached); got != tt.want {
			t.Errorf("Disaggregate(%d, %d) = %v, want %v", tt.prompt, tt.uncached, got, tt.want)
		}
	}
}

// TestLLMDPDProfiles checks the P/D profiles' weights: prefix 2, queue 1,
// no KV-utilisation scorer, and the index learning both legs' endpoints.
func TestLLMDPDProfiles(t *testing.T) {
	prompt := strings.Repeat("y", 6400)
	bs := peerFleet(t, 2)
	p := NewLLMDPD(Options{Seed: 1})
	// Teach the index that peer-0 holds the prompt (a prefill leg there).
	in := peerInput(t, prompt, bs, nil)
	in.Candidates = bs[:1]
	in.Matched, in.Cached, in.Uncached = in.Matched[:1], in.Cached[:1], in.Uncached[:1]
	peerRoute(p, in)
	// peer-0 now also has the longer queue: with weights 2 and 1 the
	// prefix (2 x 1) beats the queue (1 x 1) still.
	peerLoad(t, bs[0], 3, 100, 10, false)
	if d := p.Pick(peerInput(t, prompt, bs, nil)); d.Index != 0 {
		t.Errorf("picked %d; want the holder (prefix weight 2 over queue weight 1)", d.Index)
	}
}

func TestDynamoPDDecodeLeg(t *testing.T) {
	prompt := strings.Repeat("x", 6400) // 1,600 tokens, 100 blocks
	bs := peerFleet(t, 2)
	// peer-0 holds 90 blocks and decodes 640 tokens: the prefill leg's
	// cost there is (0 + 160)/16 + 640/16 + 100 = 150 < peer-1's 200, the
	// decode leg's (overlap weight 0) 140 > 100.
	peerLoad(t, bs[0], 1, 640, 10, true)
	p := fxNew(t, "dynamo-pd", Options{})
	in := peerInput(t, prompt, bs, []int32{90, 0})
	if d := p.Pick(in); d.Index != 0 {
		t.Errorf("prefill leg on %d; want the holder", d.Index)
	}
	if d := p.Pick(decodeLeg(in)); d.Index != 1 {
		t.Errorf("decode leg on %d; want the fewer active blocks", d.Index)
	}
}

// TestKVRouteDecodeLegTransfer: the decode leg's pick weighs the KV
// transfer at the decode engine's own figure (its cost model prior's, a
// preset's: KV bytes per token are the model's), else the policy's
// (Options.TransferPerToken, the disaggregation config's), never an
// H100/Llama-3-8B constant: over a link slow enough, the engine that
// already holds the prompt (nothing to receive) beats one with fewer
// decoding streams that must receive all 4,000 tokens.
func TestKVRouteDecodeLegTransfer(t *testing.T) {
	loads := []fxLoad{{decoding: 40, ctx: 4000, matched: 250}, {decoding: 2, ctx: 4000}}
	slow := costmodel.Generic()
	slow.Transfer = time.Millisecond.Seconds()
	tests := []struct {
		name  string
		opt   Options
		prior *costmodel.Prior
		want  int
	}{
		{"default figure: fewer streams win", Options{}, nil, 1},
		{"the policy's slow link: the holder wins", Options{TransferPerToken: time.Millisecond}, nil, 0},
		{"the engines' prior's slow link: the holder wins", Options{}, &slow, 0},
		{"the engines' prior's figure over the policy's", Options{TransferPerToken: time.Nanosecond}, &slow, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := fxBackends(t, loads...)
			if tt.prior != nil {
				for _, b := range bs {
					b.SetCostModel(costmodel.New(*tt.prior))
				}
			}
			p := fxNew(t, "kvroute", tt.opt)
			if d := p.Pick(decodeLeg(fxInput(bs, loads, 4000, ""))); d.Index != tt.want {
				t.Errorf("picked %d (est %.4fs); want %d", d.Index, d.EstTTFT, tt.want)
			}
		})
	}
}
