package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// ParseEngines turns an engine spec into one preset per engine. spec is
// either a count ("8", every engine running preset) or a comma-separated
// list of COUNTxPRESET terms ("4xh100-llama3-8b,4xa100-llama3-8b"), where a
// bare preset name counts once.
func ParseEngines(spec, preset string) ([]engine.Preset, error) {
	spec = strings.TrimSpace(spec)
	if n, err := strconv.Atoi(spec); err == nil {
		if n <= 0 {
			return nil, fmt.Errorf("engines %q: need at least one engine", spec)
		}
		p, err := engine.LookupPreset(preset)
		if err != nil {
			return nil, fmt.Errorf("engines %q: %w", spec, err)
		}
		out := make([]engine.Preset, n)
		for i := range out {
			out[i] = p
		}
		return out, nil
	}
	var out []engine.Preset
	for _, term := range strings.Split(spec, ",") {
		term = strings.TrimSpace(term)
		n, name := 1, term
		if c, rest, ok := strings.Cut(term, "x"); ok {
			if k, err := strconv.Atoi(c); err == nil {
				n, name = k, rest
			}
		}
		if n <= 0 {
			return nil, fmt.Errorf("engines %q: term %q: count must be positive", spec, term)
		}
		p, err := engine.LookupPreset(name)
		if err != nil {
			return nil, fmt.Errorf("engines %q: term %q: %w", spec, term, err)
		}
		for range n {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("engines %q: no engines", spec)
	}
	return out, nil
}

// Capacity is a fleet's prefill capacity in prompt tokens per second: the
// sum of its engines' Preset.PrefillTokensPerSec, the yardstick of offered
// load.
func Capacity(engines []engine.Preset) float64 {
	var c float64
	for _, p := range engines {
		c += p.PrefillTokensPerSec()
	}
	return c
}

// Offered is the load reqs offer a fleet of the given capacity (tokens/s):
// prompt tokens per second over the arrival span, every token counted as
// uncached, as a fraction of the capacity.
func Offered(reqs []workload.Request, capacity float64) float64 {
	if capacity <= 0 {
		return 0
	}
	return workload.PromptTokensPerSec(reqs) / capacity
}

// IsBuiltin reports whether name is a built-in synthetic workload rather
// than a trace file.
func IsBuiltin(name string) bool {
	return slices.ContainsFunc(workload.Builtins(), func(b [2]string) bool { return b[0] == name })
}

// defaultRate is workload.Options' default Poisson rate, the starting
// point from which LoadAt scales a synthetic workload's rate.
const defaultRate = 10

// LoadAt loads the workload name with opt and, when load > 0, shapes its
// arrivals so that it offers load x capacity prompt tokens per second
// (capacity in tokens/s; see Capacity). A trace is sped up or slowed down;
// a synthetic workload is generated again at the Poisson rate that offers
// that load, so that it keeps its duration (or its Limit) instead of being
// squeezed, and then its times are scaled so that the offered load is
// exact. When load is 0, opt's Rate or Speedup stand. It returns the
// requests and the load they offer.
func LoadAt(name string, opt workload.Options, load, capacity float64) ([]workload.Request, float64, error) {
	if load < 0 {
		return nil, 0, fmt.Errorf("load %g is negative", load)
	}
	if load > 0 && capacity <= 0 {
		return nil, 0, fmt.Errorf("load %g: fleet has no prefill capacity", load)
	}
	reqs, err := workload.Load(name, opt)
	if err != nil {
		return nil, 0, fmt.Errorf("workload %s: %w", name, err)
	}
	if load == 0 || len(reqs) == 0 {
		return reqs, Offered(reqs, capacity), nil
	}
	target := load * capacity
	if IsBuiltin(name) {
		rate := opt.Rate
		if rate <= 0 {
			rate = defaultRate
		}
		if got := workload.PromptTokensPerSec(reqs); got > 0 {
			opt.Rate = rate * target / got
			if reqs, err = workload.Load(name, opt); err != nil {
				return nil, 0, fmt.Errorf("workload %s at rate %g: %w", name, opt.Rate, err)
			}
		}
	}
	if got := workload.PromptTokensPerSec(reqs); got > 0 {
		workload.ScaleTime(reqs, got/target)
	}
	return reqs, Offered(reqs, capacity), nil
}
