package workload

import (
	"fmt"
	"math"
	"strconv"
)

// LoRA adapters over a workload: one base model and many fine-tunes of it,
// each request asking for one by name in its "model" field. Popularity is
// Zipf: the adapter of rank k (from 0) is chosen with probability
// proportional to 1/(k+1)^s, as a few adapters take most of the traffic
// and a long tail the rest. A conversation keeps its adapter (the turns of
// one chat go to one fine-tune); a request without a session draws its own.

// AdapterName is the name of the adapter of popularity rank k.
func AdapterName(k int) string { return "lora-" + strconv.Itoa(k) }

// DefaultAdapterZipf is the Zipf exponent when Options.Adapters is set
// and Options.AdapterZipf is not.
const DefaultAdapterZipf = 1.0

// MaxAdapters bounds Options.Adapters.
const MaxAdapters = 1 << 16

// validAdapters checks the adapter options.
func (o Options) validAdapters() error {
	switch {
	case o.Adapters < 0 || o.Adapters > MaxAdapters:
		return fmt.Errorf("adapters %d must be in [0, %d]", o.Adapters, MaxAdapters)
	case o.AdapterZipf < 0 || math.IsNaN(o.AdapterZipf) || math.IsInf(o.AdapterZipf, 0):
		return fmt.Errorf("adapter zipf exponent %v must be a non-negative number", o.AdapterZipf)
	}
	return nil
}

// assignAdapters gives each request of reqs an adapter under opt (nothing
// when opt.Adapters is 0), deterministically from opt.Seed and the
// request's session (or its place, without one).
func assignAdapters(reqs []Request, opt Options) {
	if opt.Adapters == 0 {
		return
	}
	s := opt.AdapterZipf
	if s == 0 {
		s = DefaultAdapterZipf
	}
	cdf := make([]float64, opt.Adapters)
	total := 0.0
	for k := range cdf {
		total += math.Pow(float64(k+1), -s)
		cdf[k] = total
	}
	names := make([]string, opt.Adapters)
	for k := range names {
		names[k] = AdapterName(k)
	}
	seed := mix(uint64(opt.Seed), strHash("adapters"))
	for i := range reqs {
		key := mix(seed, uint64(i))
		if reqs[i].Session != "" {
			key = mix(seed, strHash(reqs[i].Session))
		}
		u := float64(key>>11) / (1 << 53) * total
		k := 0
		for k < len(cdf)-1 && cdf[k] <= u {
			k++
		}
		reqs[i].Adapter = names[k]
	}
}
