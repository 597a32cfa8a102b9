// Package costmodel learns one engine's cost coefficients online: how long
// its prefill takes for a number of uncached tokens (a step overhead, a
// linear term and an attention term that grows with the context), and how
// long one of its steps takes for the sequences it decodes and their
// context. The router reads them to turn the work it sees queued on a
// backend into seconds, whatever the hardware and model behind it.
//
// A Model is one weighted least-squares fit of those five coefficients,
// kept in information form (a 5x5 matrix and a vector), with a prior (a
// preset's coefficients, or Generic for an unknown engine) that counts as
// a few samples and that the first observations overrule. Each sample costs
// O(1): a rank-one update and a 5x5 solve; memory is fixed. It is robust:
// a sample whose relative residual is far beyond the fit's usual one is
// down-weighted (Huber), so one stalled request cannot teach a rate. It
// forgets: every sample's weight halves every HalfLife, so an estimate no
// traffic refreshes returns to its prior, and no bad reading can stay
// forever; and its evidence is capped at MaxSamples, a window in effect.
//
// Learning runs off the routing path under a mutex; the fit is published
// as an immutable Fit that readers load with one atomic read, and decay is
// applied at read time from the reader's clock. The package does no I/O,
// reads no clock and knows nothing of HTTP, policies or engines' metric
// names: package fleet feeds it samples, the simulator and the live
// router alike.
package costmodel

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Coeffs are an engine's cost coefficients, in seconds. An engine step that
// computes p prefill tokens whose attention covers the token pairs a (see
// AttnPairs), and decodes s sequences reading c context tokens takes
//
//	Step + Token*p + Attn*a + Seq*s + Ctx*c
//
// (the model of package engine; a real engine's are learned).
type Coeffs struct {
	// Step is the fixed cost of one step: reading the weights once.
	Step float64
	// Token is the cost of one prefill token: its matmul FLOPs.
	Token float64
	// Attn is the cost of one pair of tokens in prefill attention: a
	// prompt of n uncached tokens after k cached ones attends over
	// n*(k+n/2) pairs (see AttnPairs).
	Attn float64
	// Seq is the cost of one decoding sequence in a step (its new token).
	Seq float64
	// Ctx is the cost of one context token a decoding sequence reads in a
	// step (attention's K and V reads).
	Ctx float64
}

// n is the number of coefficients.
const n = 5

func (c Coeffs) vec() [n]float64 { return [n]float64{c.Step, c.Token, c.Attn, c.Seq, c.Ctx} }

func fromVec(v [n]float64) Coeffs {
	return Coeffs{Step: v[0], Token: v[1], Attn: v[2], Seq: v[3], Ctx: v[4]}
}

// Scale returns c with every coefficient multiplied by k: the same engine
// k times slower.
func (c Coeffs) Scale(k float64) Coeffs {
	return Coeffs{Step: c.Step * k, Token: c.Token * k, Attn: c.Attn * k, Seq: c.Seq * k, Ctx: c.Ctx * k}
}

// AttnPairs is the token pairs prefill attention covers for uncached
// tokens computed after cached ones already in the KV cache: each new
// token attends over every token before it.
func AttnPairs(uncached, cached int64) float64 {
	u := float64(max(uncached, 0))
	return u * (float64(max(cached, 0)) + u/2)
}

// DecodeStep is the time of one step that decodes seqs sequences reading
// ctx context tokens and computes no prefill.
func (c Coeffs) DecodeStep(seqs, ctx float64) float64 { return c.Step + c.Seq*seqs + c.Ctx*ctx }

// Prefill is the time to prefill work tokens, of which the request's own
// uncached tokens follow cached ones, in steps of at most chunk tokens,
// while seqs sequences reading ctx context tokens decode in every step.
// The attention term counts the request's own pairs only: the work queued
// ahead of it is priced per token.
func (c Coeffs) Prefill(work, uncached, cached, chunk int64, seqs, ctx float64) float64 {
	steps := Steps(work, chunk)
	return float64(steps)*c.DecodeStep(seqs, ctx) + c.Token*float64(max(work, 0)) + c.Attn*AttnPairs(uncached, cached)
}

// Steps is the engine steps that prefill work tokens in chunks of chunk:
// at least one.
func Steps(work, chunk int64) int64 {
	if chunk <= 0 {
		return 1
	}
	return max((max(work, 0)+chunk-1)/chunk, 1)
}

// ChunkRate is the prefill throughput, in tokens per second, of steps that
// each compute a full chunk of fresh tokens and nothing else: the one
// figure by which engines are compared (the fleet's speed, the price of a
// recomputed token).
func (c Coeffs) ChunkRate(chunk int64) float64 {
	chunk = max(chunk, 1)
	t := c.Step/float64(chunk) + c.Token
	if t <= 0 {
		return math.Inf(1)
	}
	return 1 / t
}

// Prior is what a model starts from: coefficients and the limits that go
// with them, and how many samples they count for.
type Prior struct {
	Coeffs
	// Chunk is the engine's token budget per step (max_num_batched_tokens)
	// assumed until the engine's own is known.
	Chunk int64
	// Samples is the weight of the prior in samples: the first few
	// observations outweigh it.
	Samples float64
	// Transfer is the time, in seconds, to carry one prompt token's KV
	// cache from a prefill engine to this one (the model's KV bytes per
	// token over the network), which no observation teaches; 0 when
	// unknown (the generic prior's).
	Transfer float64
	// HostLoad and DiskLoad are the time, in seconds, to load one prompt
	// token's KV cache into GPU memory from the engine's CPU tier and its
	// disk tier (tiers.go); 0 when unknown.
	HostLoad, DiskLoad float64
}

// The generic prior: an engine nothing is known of. Its figures are round
// numbers in the middle of the engines kvroute meets (a 7-8B model on one
// data-centre GPU: 10k prefill tokens a second in full chunks, 15 ms a
// decode step alone), so that the first samples, whatever the engine, are
// at most one or two orders of magnitude away; it weighs GenericSamples.
const (
	GenericChunk   = 8192
	GenericSamples = 4
)

// Generic is the prior of an engine nothing is known of.
func Generic() Prior {
	return Prior{
		Coeffs: Coeffs{
			Step:  0.015,
			Token: 1e-4 - 0.015/GenericChunk,
			// A pair of tokens in prefill attention costs 1e-7 of a
			// prefill token: with flash attention it is a small share
			// of a prompt below tens of thousands of tokens (a 20,000-
			// token prompt's pairs cost 2% of its tokens), and the prior
			// leans low so that a long prompt is not priced away before
			// the engine shows its cost (see fleet's TTFT samples). A
			// context token a decoding sequence reads costs about a
			// thousandth of a prefill token (its K and V against the
			// matmuls of a token).
			Attn: 1e-11,
			Seq:  1e-4,
			Ctx:  1e-7,
		},
		Chunk:   GenericChunk,
		Samples: GenericSamples,
	}
}

// PresetSamples is the weight of a preset's coefficients as a prior: a
// preset is the engine's physics, worked out, but a real engine differs
// from it (its kernels, its GPU's clocks), and a few samples should tell.
const PresetSamples = 4

// Learning.
const (
	// HalfLife is the age at which a sample's weight has halved. Under
	// traffic a backend yields samples every few tens of milliseconds
	// (each first byte, each engine reading), so the fit rests on the
	// last few seconds; without traffic it returns to the prior within
	// a few half-lives: from MaxSamples of evidence to half a sample in 10
	// half-lives, 30 s, when the prior has all but 2% of the say (see
	// Model.Coeffs).
	HalfLife = 3 * time.Second
	// MaxSamples caps the evidence, in samples, so that a long-refreshed
	// fit still decays within bounded time: a window of the last 512
	// samples in effect, enough to tell five coefficients apart through
	// 5% noise.
	MaxSamples = 512
	// HuberK is how many times the fit's usual relative residual a
	// sample may miss by before it is down-weighted in proportion.
	HuberK = 3.0
	// MaxSpeedup bounds how much faster than its prior the fit may make a
	// coefficient: a server whose first byte does not wait for its
	// prefill (a cached response, a fake) fits a prefill cost of 0, and
	// a backend that looked infinitely fast would draw every request.
	MaxSpeedup = 100.0
	// MinScale is the floor of the usual relative residual: a fit that
	// has matched well is not allowed to call a 10% miss an outlier.
	MinScale = 0.05
)

// Sample is one observation: y seconds were taken by work described by x
// (its step count, prefill tokens, attention pairs, decoding sequences x
// steps, context tokens x steps), so that y = x . coefficients.
type Sample struct {
	Steps, Tokens, Pairs, Seqs, Ctx float64
	Seconds                         float64
}

func (s Sample) vec() [n]float64 { return [n]float64{s.Steps, s.Tokens, s.Pairs, s.Seqs, s.Ctx} }

// Fit is a published estimate: the coefficients the samples alone give
// (a least-squares fit, barely regularised toward the prior so that a
// coefficient no sample exercises keeps its prior value), the samples
// behind it at At (decayed and capped: see HalfLife, MaxSamples), and
// the samples folded in since the model began.
type Fit struct {
	Coeffs  Coeffs
	Weight  float64
	At      time.Time
	Samples int64
	// now is what Model.Coeffs answers at At (and shortly after), and
	// lr the log2 of each coefficient over the prior's (at least
	// -log2(MaxSpeedup)), so that a read decays it without a logarithm.
	now Coeffs
	lr  [n]float64
	// weights is, per coefficient, the weight of the samples that
	// exercised it (a non-zero feature) at At: its share of the estimate
	// (Coeffs) rests on those alone, so that many samples of decode steps
	// do not give one prefill's TTFT the say on the per-token cost.
	weights [n]float64
}

// Model is one engine's learned cost model. The zero value is not usable;
// use New.
type Model struct {
	prior Prior
	// p0 is the prior's coefficients as a vector. The fit is solved in
	// units of them (z_k = c_k / p0_k, the prior at z = 1), which keeps
	// coefficients of 1e-2 and 1e-12 seconds in one well-conditioned
	// system; the prior's information on each z_k is ridge.
	p0 [n]float64

	mu    sync.Mutex
	a     [n][n]float64 // the samples' information on z, decayed
	b     [n]float64
	w     float64    // the samples' weight, decayed (the evidence in samples)
	wk    [n]float64 // per coefficient, the weight of the samples that exercised it
	last  time.Time
	scale float64 // the usual relative residual (a moving mean of |r|)
	count int64

	fit atomic.Pointer[Fit]
	// anchor is what an unrefreshed fit decays toward (SetAnchor); nil:
	// the prior.
	anchor atomic.Pointer[anchor]
	// decayed caches the last decayed read (Coeffs).
	decayed atomic.Pointer[decayed]
	// frozen models publish their prior and learn nothing (a router told
	// the true coefficients).
	frozen bool
	// load is the learned load time per token of each lower tier
	// (tiers.go), as float64 bits; 0 until the engine reports one.
	load [2]atomic.Uint64
}

// New returns a model that starts from p.
func New(p Prior) *Model {
	m := &Model{prior: p, scale: 0.5}
	m.p0 = p.vec()
	for k := range n {
		m.p0[k] = max(m.p0[k], minCoeff)
	}
	m.prior.Coeffs = fromVec(m.p0)
	m.fit.Store(&Fit{Coeffs: m.prior.Coeffs})
	return m
}

// Frozen returns a model that always answers p's coefficients.
func Frozen(p Prior) *Model {
	m := New(p)
	m.frozen = true
	return m
}

// ridge is the fit's pull toward the prior on each coefficient z_k (in
// units of the prior's value), as information (a sample in which a
// coefficient explains all of the time taken gives 1). A coefficient no
// sample exercises keeps its prior; where the samples cannot tell two
// apart (prefills of one size: a step or a token?), the one that explains
// more of the time at the prior takes the difference; and one that the
// samples do exercise is barely biased, however far its truth lies from
// the prior (an engine's attention term may be 10^4 times the generic
// prior's, and the samples' information on it in these units 10^8 times
// smaller).
const ridge = 1e-12

// minCoeff is the least a prior coefficient may be (seconds): the fit is
// solved in units of the prior's. maxCoeff is the most an anchor's may be.
const (
	minCoeff = 1e-18
	maxCoeff = 1e6
)

// maxRatio bounds a sample's features, in units of the prior's time, over
// its seconds: a sample that says its work would take 10^9 times what it
// took at the prior is not a measurement (and its square would overflow
// the fit).
const maxRatio = 1e9

// anchor is the coefficients a fit decays toward, with the log2 of each.
type anchor struct {
	c  Coeffs
	lg [n]float64
}

// SetAnchor makes c what the model's estimate decays toward as its
// evidence ages, in place of its prior: the fleet's coefficients (package
// fleet sets them), so that an engine no traffic refreshes returns to what
// its peers show rather than to a guess. A nil c restores the prior.
func (m *Model) SetAnchor(c *Coeffs) {
	if m.frozen {
		return
	}
	if c == nil {
		m.anchor.Store(nil)
		return
	}
	v := c.vec()
	for k := range n {
		if !(v[k] >= 0) || math.IsInf(v[k], 0) {
			v[k] = m.p0[k] // not a coefficient: the prior's
		}
		v[k] = min(max(v[k], minCoeff), maxCoeff)
	}
	a := &anchor{c: fromVec(v)}
	for k := range n {
		a.lg[k] = math.Log2(v[k])
	}
	m.anchor.Store(a)
}

// Evidence is the weight, in samples, of the fit's samples at now: decayed
// by their age (see HalfLife).
func (m *Model) Evidence(now time.Time) float64 {
	f := m.fit.Load()
	if f.Weight <= 0 {
		return 0
	}
	if age := now.Sub(f.At); age > 0 {
		return f.Weight * math.Exp2(-age.Seconds()/HalfLife.Seconds())
	}
	return f.Weight
}

// Anchor returns what the model decays toward: its anchor, else its
// prior's coefficients.
func (m *Model) Anchor() Coeffs {
	if a := m.anchor.Load(); a != nil {
		return a.c
	}
	return m.prior.Coeffs
}

// Chunk is the prior's token budget per step, at least 1.
func (m *Model) Chunk() int64 { return max(m.prior.Chunk, 1) }

// Prior returns the model's prior.
func (m *Model) Prior() Prior { return m.prior }

// Fit returns the last published fit.
func (m *Model) Fit() *Fit { return m.fit.Load() }

// Learned is the last fit's coefficients as the samples alone give them,
// and whether they are within the bounds the estimate keeps (each at
// least its prior's over MaxSpeedup): only then may a fleet-wide figure
// be built from them. A raw fit pins a coefficient the samples drive
// negative at 0 (a backend whose TTFT does not grow with its prompt fits
// a token cost of 0), which no engine has; clamped, it would still pull
// a mean a hundredfold toward a speed no engine showed.
func (m *Model) Learned() (Coeffs, bool) {
	f := m.fit.Load()
	v := f.Coeffs.vec()
	for k := range n {
		if !(v[k] >= m.p0[k]/MaxSpeedup) || v[k] > maxCoeff {
			return f.Coeffs, false
		}
	}
	return f.Coeffs, true
}

// Coeffs returns the coefficients at now: per coefficient, a weighted
// geometric mean of the prior's (or the anchor's, see SetAnchor) and the
// fit's, the fit's share being
// w^2/(w^2+S^2), w the weight of the samples that exercised that
// coefficient decayed by its age (see HalfLife) and S the prior's
// Samples. Geometric, because engines differ
// by orders of magnitude: a sample of an engine 200 times slower than
// the prior moves the estimate 200^share times, not 200*share. Squared,
// so that the prior holds against the first sample or two (a share of
// 1/17 for one sample against 4) and has lost its say once the fit rests
// on tens of samples (2% of it at 28, which a linear share of
// w/(w+S) would leave at 13%: a CPU engine 20x slower than the prior
// would stay 6% faster than it is, however long it was watched). It
// never blocks.
func (m *Model) Coeffs(now time.Time) Coeffs {
	f := m.fit.Load()
	if f.Weight <= 0 {
		return m.Anchor()
	}
	age := now.Sub(f.At)
	if age < fresh {
		return f.now
	}
	// Decayed: computed once per fresh-long step of age and kept, so
	// that a pick over many idle backends reads each with one load.
	step := int64(age / fresh)
	if d := m.decayed.Load(); d != nil && d.fit == f && d.step == step && d.anchor == m.anchor.Load() {
		return d.c
	}
	c := m.blend(f, math.Exp2(-float64(step)*fresh.Seconds()/HalfLife.Seconds()))
	m.decayed.Store(&decayed{fit: f, anchor: m.anchor.Load(), step: step, c: c})
	return c
}

// decayed is a fit's coefficients decayed to a step of age (Coeffs).
type decayed struct {
	fit    *Fit
	anchor *anchor
	step   int64
	c      Coeffs
}

// fresh is how young a fit is read as published: within it the weight
// decays by under 2.2%, and a read costs one atomic load. An older fit is
// decayed in steps of fresh, each computed once.
const fresh = HalfLife / 32

// blend is f's coefficients with their weights decayed by the factor d
// (see Coeffs), against the anchor, else the prior: each coefficient's
// share rests on the weight of the samples that exercised it.
func (m *Model) blend(f *Fit, d float64) Coeffs {
	s2 := m.prior.Samples * m.prior.Samples
	a := m.anchor.Load()
	var v [n]float64
	for k := range n {
		w := f.weights[k] * d
		share := w * w / (w*w + s2)
		switch {
		case share < 1e-3 && a == nil:
			v[k] = m.p0[k]
		case share < 1e-3:
			v[k] = math.Exp2(a.lg[k])
		case a == nil:
			v[k] = m.p0[k] * math.Exp2(share*f.lr[k])
		default:
			fit := f.lr[k] + math.Log2(m.p0[k])
			v[k] = math.Exp2(a.lg[k] + share*(fit-a.lg[k]))
		}
	}
	return fromVec(v)
}

// Observe folds one sample taken at now into the fit and publishes it. A
// sample of no time or with no work is ignored.
func (m *Model) Observe(s Sample, now time.Time) {
	x := s.vec()
	if m.frozen || !(s.Seconds > 0) || math.IsInf(s.Seconds, 0) {
		return
	}
	var norm float64
	for k := range n {
		if !(x[k] >= 0) || math.IsInf(x[k], 0) {
			return
		}
		norm += x[k]
	}
	if norm == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.last.IsZero() && now.After(m.last) {
		d := math.Exp2(-now.Sub(m.last).Seconds() / HalfLife.Seconds())
		m.scaleBy(d)
	}
	if now.After(m.last) {
		m.last = now
	}
	// Relative residual against the current fit: samples are weighed by
	// 1/y^2 so that a 10 ms and a 10 s observation count alike.
	cur := m.fit.Load().Coeffs.vec()
	var pred float64
	for k := range n {
		pred += cur[k] * x[k]
		x[k] *= m.p0[k] // in units of the prior (see p0)
		if x[k] > maxRatio*s.Seconds {
			return
		}
	}
	r := math.Abs(s.Seconds-pred) / s.Seconds
	w := 1.0
	if lim := HuberK * max(m.scale, MinScale); m.count >= 4 && r > lim {
		w = lim / r
	}
	m.scale += 0.1 * (min(r, 4*max(m.scale, MinScale)) - m.scale)
	m.w += w
	for k := range n {
		if x[k] > 0 {
			m.wk[k] += w
		}
	}
	w /= s.Seconds * s.Seconds
	for i := range n {
		if x[i] == 0 {
			continue
		}
		for j := range n {
			m.a[i][j] += w * x[i] * x[j]
		}
		m.b[i] += w * x[i] * s.Seconds
	}
	m.count++
	// Cap the evidence (see MaxSamples).
	if m.w > MaxSamples {
		m.scaleBy(MaxSamples / m.w)
	}
	m.publish(now)
}

// scaleBy multiplies the samples' information by d.
func (m *Model) scaleBy(d float64) {
	for i := range n {
		for j := range n {
			m.a[i][j] *= d
		}
		m.b[i] *= d
	}
	m.w *= d
	for k := range n {
		m.wk[k] *= d
	}
}

// publish solves (ridge I + A) z = ridge 1 + b and stores the fit
// c = z p0. A coefficient
// that comes out negative is pinned at 0 and the rest solved again: no
// engine gets faster for more work.
func (m *Model) publish(now time.Time) {
	var free [n]bool
	for k := range n {
		free[k] = true
	}
	var c [n]float64
	for range n {
		var h [n][n]float64
		var g [n]float64
		for i := range n {
			g[i] = ridge + m.b[i]
			for j := range n {
				h[i][j] = m.a[i][j]
			}
			h[i][i] += ridge
		}
		// Pinned coefficients: fixed at 0, their rows replaced.
		for k := range n {
			if !free[k] {
				for j := range n {
					h[k][j], h[j][k] = 0, 0
				}
				h[k][k], g[k] = 1, 0
			}
		}
		if !solve(&h, &g) {
			return
		}
		c = g
		again := false
		for k := range n {
			if free[k] && c[k] < 0 {
				free[k], again = false, true
			}
		}
		if !again {
			break
		}
	}
	f := &Fit{At: now, Samples: m.count, Weight: m.w, weights: m.wk}
	for k := range n {
		f.lr[k] = math.Log2(max(c[k], 1/MaxSpeedup))
		c[k] = max(c[k], 0) * m.p0[k]
	}
	f.Coeffs = fromVec(c)
	f.now = m.blend(f, 1)
	m.fit.Store(f)
}

// solve solves h x = g in place (x in g) by Cholesky; h is symmetric
// positive definite (the prior makes it so). It reports false if the
// factorisation fails.
func solve(h *[n][n]float64, g *[n]float64) bool {
	var l [n][n]float64
	for i := range n {
		for j := 0; j <= i; j++ {
			s := h[i][j]
			for k := range j {
				s -= l[i][k] * l[j][k]
			}
			if i == j {
				if !(s > 0) {
					return false
				}
				l[i][i] = math.Sqrt(s)
			} else {
				l[i][j] = s / l[j][j]
			}
		}
	}
	var y [n]float64
	for i := range n {
		s := g[i]
		for k := range i {
			s -= l[i][k] * y[k]
		}
		y[i] = s / l[i][i]
	}
	for i := n - 1; i >= 0; i-- {
		s := y[i]
		for k := i + 1; k < n; k++ {
			s -= l[k][i] * g[k]
		}
		g[i] = s / l[i][i]
	}
	return true
}

// Mean accumulates the geometric mean of coefficients, coefficient by
// coefficient: the fleet's coefficients, by which backends that differ
// only by noise are all costed alike. It takes no logarithm per term (a
// running product kept as a mantissa and an exponent), so that a pick
// over many backends pays a few multiplications for each. The zero value
// is an empty mean.
type Mean struct {
	m     [n]float64
	e     [n]int
	count int
}

// Add adds c to the mean and reports whether it did: coefficients that
// are not all positive, finite and at most maxCoeff (a raw fit's pinned
// zero, a NaN) are refused, since one zero would make the whole mean
// zero. Feed it bounded coefficients (Model.Learned). Eight of them
// multiply within a float64's range before the running product is
// normalised.
func (g *Mean) Add(c Coeffs) bool {
	for _, v := range c.vec() {
		if !(v > 0) || v > maxCoeff {
			return false
		}
	}
	if g.count == 0 {
		g.m = [n]float64{1, 1, 1, 1, 1}
	}
	g.m[0] *= c.Step
	g.m[1] *= c.Token
	g.m[2] *= c.Attn
	g.m[3] *= c.Seq
	g.m[4] *= c.Ctx
	g.count++
	if g.count%8 == 0 {
		g.normalise()
	}
	return true
}

// normalise moves the running products' exponents into e.
func (g *Mean) normalise() {
	for k := range n {
		fr, ex := math.Frexp(g.m[k])
		g.m[k], g.e[k] = fr, g.e[k]+ex
	}
}

// Coeffs returns the mean; the zero Coeffs when nothing was added.
func (g *Mean) Coeffs() Coeffs {
	if g.count == 0 {
		return Coeffs{}
	}
	g.normalise()
	var v [n]float64
	for k := range n {
		v[k] = math.Exp2((math.Log2(g.m[k]) + float64(g.e[k])) / float64(g.count))
	}
	return fromVec(v)
}
