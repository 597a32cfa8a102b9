package fleet

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// TestLearnFromReadings: an engine's readings alone (its inter-token
// latency over the running sequences, the KV cache they hold and the
// prompt tokens computed meanwhile, with 3% noise) teach its step,
// token, sequence and context coefficients, each within 15%, from the
// generic prior, for an engine unlike it.
func TestLearnFromReadings(t *testing.T) {
	truth := costmodel.Coeffs{Step: 0.030, Token: 5e-4, Seq: 5e-4, Ctx: 2.7e-7}
	b := New().Add("b", nil, nil)
	rng := rand.New(rand.NewPCG(1, 1))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const kvBlocks, blockSize = 2361, 16
	for range 3000 {
		at = at.Add(50 * time.Millisecond)
		running := 1 + rng.IntN(64)
		usage := rng.Float64()
		computed := float64(rng.IntN(256))
		ctx := usage * kvBlocks * blockSize
		step := truth.Step + truth.Token*computed + truth.Seq*float64(running) + truth.Ctx*ctx
		step *= 1 + 0.03*rng.NormFloat64()
		b.Learn(Reading{
			State:          &EngineState{At: at, Running: running, KVUsage: usage, KVBlocks: kvBlocks, BlockSize: blockSize},
			DecodeTokens:   float64(running),
			DecodeSeconds:  step * float64(running),
			ComputedTokens: computed,
		})
	}
	checkStepCoeffs(t, b.Cost().Coeffs(at), truth)
}

// TestLearnFromTTFTs: the TTFTs of requests alone on an engine (prompts
// of 300-6,000 tokens after cached prefixes, in chunks of 2,048, with no
// decoding batch) teach its step, token and attention coefficients.
func TestLearnFromTTFTs(t *testing.T) {
	truth := costmodel.Coeffs{Step: 0.010, Token: 1.3e-4, Attn: 4e-9}
	b := New().Add("b", nil, nil)
	b.SetMaxBatchedTokens(2048)
	rng := rand.New(rand.NewPCG(2, 2))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 2000 {
		at = at.Add(100 * time.Millisecond)
		uncached := int64(300 + rng.IntN(5700))
		cached := int64(rng.IntN(8000))
		ttft := float64(costmodel.Steps(uncached, 2048))*truth.Step + truth.Token*float64(uncached) + truth.Attn*costmodel.AttnPairs(uncached, cached)
		tk := b.Start(uncached+cached, uncached, 16, at)
		tk.FirstByte(at.Add(time.Duration(ttft * (1 + 0.03*rng.NormFloat64()) * float64(time.Second))))
		tk.Done(at)
	}
	got := b.Cost().Coeffs(at)
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"Step", got.Step, truth.Step}, {"Token", got.Token, truth.Token}, {"Attn", got.Attn, truth.Attn}} {
		if math.Abs(c.got/c.want-1) > 0.15 {
			t.Errorf("%s = %.3g, want %.3g", c.name, c.got, c.want)
		}
	}
}

// TestNoStepTimeWithoutComputed: a reading of an engine that does not
// tell the prompt tokens it computed teaches the cost model no step time
// (the prefill chunks run in the timed steps would read as decode), and
// one that tells them does.
func TestNoStepTimeWithoutComputed(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		computed float64
		learns   bool
	}{{-1, false}, {0, true}, {512, true}} {
		b := New().Add("b", nil, nil)
		b.Learn(Reading{State: &EngineState{At: at, Running: 4}, DecodeTokens: 40, DecodeSeconds: 1, ComputedTokens: tt.computed})
		if got := b.Cost().Evidence(at) > 0; got != tt.learns {
			t.Errorf("computed %v: learned %v, want %v", tt.computed, got, tt.learns)
		}
	}
}

// TestLearnFromRelayedStreams: the relay's timings of streams (each
// decoding among a steady set of others whose prompts vary, with another
// request's prefill finished on the backend meanwhile, 3% noise), with
// the TTFTs of those prefills, teach the backend's step, token, sequence
// and context coefficients, each within 15% of the truth, from the
// generic prior, for an engine unlike it (Ticket.Decoded): the streams
// teach the decode costs, the prefills the token cost, and the prefill
// finished within a stream is taken out of its span at that cost.
func TestLearnFromRelayedStreams(t *testing.T) {
	truth := costmodel.Coeffs{Step: 0.030, Token: 5e-4, Seq: 5e-4, Ctx: 2.7e-7}
	b := New().Add("b", nil, nil)
	rng := rand.New(rand.NewPCG(2, 2))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 2000 {
		at = at.Add(50 * time.Millisecond)
		others := make([]*Ticket, rng.IntN(48))
		var ctx int64
		for i := range others {
			prompt := int64(rng.IntN(4000))
			ctx += prompt
			others[i] = b.Start(prompt, 0, 256, at)
			others[i].FirstByte(at)
		}
		prompt := int64(rng.IntN(4000))
		ctx += prompt
		tk := b.Start(prompt, 0, 256, at)
		tk.FirstByte(at)
		// Another request's prefill finishes while it decodes.
		computed := int64(rng.IntN(2048))
		p := b.Start(computed, computed, 1, at)
		step := truth.Step + truth.Seq*float64(len(others)+1) + truth.Ctx*float64(ctx)
		ttft := (step + truth.Token*float64(computed)) * (1 + 0.03*rng.NormFloat64())
		p.FirstByte(at.Add(time.Duration(ttft * float64(time.Second))))
		p.Done(at)
		tokens := int64(1 + rng.IntN(256))
		seqs := float64(len(others) + 1)
		span := float64(tokens)*(truth.Step+truth.Seq*seqs+truth.Ctx*float64(ctx)) + truth.Token*float64(computed)
		span *= 1 + 0.03*rng.NormFloat64()
		tk.Decoded(tokens, time.Duration(span*float64(time.Second)), at)
		tk.Done(at)
		for _, o := range others {
			o.Done(at)
		}
	}
	checkStepCoeffs(t, b.Cost().Coeffs(at), truth)
}

// checkStepCoeffs fails t unless got's step, token, sequence and context
// coefficients are each within 15% of truth's.
func checkStepCoeffs(t *testing.T, got, truth costmodel.Coeffs) {
	t.Helper()
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"Step", got.Step, truth.Step}, {"Token", got.Token, truth.Token}, {"Seq", got.Seq, truth.Seq}, {"Ctx", got.Ctx, truth.Ctx}} {
		if math.Abs(c.got/c.want-1) > 0.15 {
			t.Errorf("%s = %.3g, want %.3g", c.name, c.got, c.want)
		}
	}
}

// TestAnchorRefusesZeroCoefficient: a backend whose TTFT does not grow
// with its prompt (a server that answers before its prefill, a cached
// response) fits a token cost of 0; the fleet's coefficients, toward
// which an unobserved backend decays, must not become 0 for it (they did:
// every other backend was then costed at 1e-18 s a token, 10^13 below the
// prior, although the estimate promises at most MaxSpeedup).
func TestAnchorRefusesZeroCoefficient(t *testing.T) {
	f := New()
	flat := f.Add("flat", nil, nil)
	idle := f.Add("idle", nil, nil)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 200 {
		at = at.Add(100 * time.Millisecond)
		work := int64(MinRateWork + 100*(i%40))
		tk := flat.Start(work, work, 1, at)
		tk.FirstByte(at.Add(20 * time.Millisecond)) // the same TTFT whatever the prompt
		tk.Done(at)
	}
	if c, _ := flat.Cost().Learned(); c.Token != 0 {
		t.Fatalf("the flat backend fit a token cost of %g, want 0 (the case under test)", c.Token)
	}
	prior := idle.Cost().Prior()
	if got := idle.Cost().Coeffs(at.Add(time.Minute)); !(got.Token >= prior.Token/costmodel.MaxSpeedup) {
		t.Errorf("an unobserved backend is costed at %g s a token, under the prior's %g over %v", got.Token, prior.Token, costmodel.MaxSpeedup)
	}
}

// An engine's report of its CPU tier's loads teaches the backend's load
// time per token, once it spans MinLoadTokens tokens.
func TestLearnHostLoad(t *testing.T) {
	f := New()
	b := f.Add("a", nil, nil)
	at := time.Unix(100, 0)
	def := b.Cost().LoadPerToken(costmodel.TierHost)
	b.Learn(Reading{State: &EngineState{At: at}, HostLoadTokens: MinLoadTokens - 1, HostLoadSeconds: 1})
	if got := b.Cost().LoadPerToken(costmodel.TierHost); got != def {
		t.Errorf("a load of fewer than MinLoadTokens taught %g (was %g)", got, def)
	}
	b.Learn(Reading{State: &EngineState{At: at}, HostLoadTokens: 1000, HostLoadSeconds: 3e-3})
	if got := b.Cost().LoadPerToken(costmodel.TierHost); math.Abs(got-3e-6) > 1e-12 {
		t.Errorf("learned %g s a token, want 3e-6", got)
	}
}
