package sim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/workload"
)

// Variant is one run of each policy at each load: its name's suffix and
// what it changes in the run's Config.
type Variant struct {
	Suffix string
	Hold   *Hold
	KV     *KVEvents
	// Roles and Split make a disaggregated fleet (Config.Roles, Split).
	Roles []string
	Split string
}

// FleetVariants are the fleet's shapes of a run with roles (XPYD): the
// aggregated fleet of as many engines (named POLICY), then the
// disaggregated one with each split mode (POLICY+xPyD, POLICY+xPyD+always
// for SplitAlways). Without roles, one: the aggregated fleet.
func FleetVariants(roles []string, splits []string) []Variant {
	if roles == nil {
		return []Variant{{}}
	}
	p, d := 0, 0
	for _, r := range roles {
		switch r {
		case config.RolePrefill:
			p++
		case config.RoleDecode:
			d++
		}
	}
	name := fmt.Sprintf("+%dp%dd", p, d)
	v := []Variant{{}}
	for _, sp := range splits {
		x := Variant{Suffix: name, Roles: roles, Split: sp}
		if sp == SplitAlways {
			x.Suffix += "+always"
		}
		v = append(v, x)
	}
	return v
}

// Runs reports whether policy pol runs on fleet variant f: a pair policy
// (policy.PairDecider) only on a disaggregated fleet, and only under its
// own decider (not SplitAlways).
func (f Variant) Runs(pol string) bool {
	p, err := policy.New(pol, policy.Options{})
	if err != nil {
		return true // reported by the run itself
	}
	if _, pair := p.(policy.PairDecider); pair {
		return f.Roles != nil && f.Split != SplitAlways
	}
	return true
}

// LateBinding is `kvroute sim --late-binding`: off, on, or both (each
// policy run without and with it, side by side).
type LateBinding string

// The values of LateBinding.
const (
	LateOff  LateBinding = "off"
	LateOn   LateBinding = "on"
	LateBoth LateBinding = "both"
)

// HoldVariants are the runs of each policy that mode asks for, holding
// with h (named POLICY+late); h is checked when it is used.
func HoldVariants(mode LateBinding, h Hold) ([]Variant, error) {
	if mode != LateOn && mode != LateBoth {
		return []Variant{{}}, nil
	}
	if h.Tokens <= 0 {
		return nil, errors.New("--hold-tokens must be positive")
	}
	if !(h.Slack > 0) {
		return nil, errors.New("--hold-slack must be positive")
	}
	if h.Cap <= 0 {
		return nil, errors.New("--hold-cap must be positive")
	}
	on := Variant{Suffix: "+late", Hold: &h}
	if mode == LateOn {
		return []Variant{on}, nil
	}
	return []Variant{{}, on}, nil
}

// ParseHoldOrder is admission.ParseOrder for --hold-order.
func ParseHoldOrder(s string) (admission.Order, error) {
	o, err := admission.ParseOrder(s)
	if err != nil {
		return o, fmt.Errorf("--hold-order: %w", err)
	}
	return o, nil
}

// KVVariants are the runs of each policy by how their router sees the
// engines' caches: approximately, then with events on (each delayed by
// delay) precisely (POLICY+precise), and with oracle as well on what the
// engines truly hold at routing time (POLICY+truth).
func KVVariants(events bool, delay time.Duration, oracle bool) []Variant {
	v := []Variant{{}}
	if events {
		v = append(v, Variant{Suffix: "+precise", KV: &KVEvents{Delay: delay}})
		if oracle {
			v = append(v, Variant{Suffix: "+truth", KV: &KVEvents{Truth: true}})
		}
	}
	return v
}

// ParseFault parses a --fault spec for reqs (nil: only check the syntax):
// restart[=D] (engine 0's cache wiped at D, default the middle of the
// arrivals), bypass[=F] (a share F of requests, default 0.3, reaches a
// random engine without the router), capacity[=X] (engine 0 reports X
// times its KV capacity, default 2), and the engines' failures, each at
// D, default the middle of the arrivals (faults.go): kill[=D] (engine 0
// dies), hang[=D] (engine 0 stops sending), rolling[=D] (every engine
// restarted in turn).
func ParseFault(spec string, reqs []workload.Request) (Faults, error) {
	var f Faults
	name, val, hasVal := strings.Cut(strings.TrimSpace(spec), "=")
	at := func(d *time.Duration) error {
		if hasVal {
			v, err := time.ParseDuration(val)
			if err != nil || v <= 0 {
				return fmt.Errorf("--fault %s=%s: want a positive duration", name, val)
			}
			*d = v
		} else if len(reqs) > 0 {
			lo, hi := reqs[0].At, reqs[0].At
			for _, r := range reqs {
				lo, hi = min(lo, r.At), max(hi, r.At)
			}
			*d = max(lo+(hi-lo)/2, 1)
		} else {
			*d = 1
		}
		return nil
	}
	switch name {
	case "":
		return f, nil
	case "restart":
		return f, at(&f.RestartAt)
	case FaultKill:
		return f, at(&f.KillAt)
	case FaultHang:
		return f, at(&f.HangAt)
	case FaultRolling:
		return f, at(&f.RollingAt)
	case "bypass":
		f.Bypass = 0.3
		if hasVal {
			x, err := strconv.ParseFloat(val, 64)
			if err != nil || x <= 0 || x >= 1 {
				return f, fmt.Errorf("--fault bypass=%s: want a share in (0, 1)", val)
			}
			f.Bypass = x
		}
	case "capacity":
		f.CapacityFactor = 2
		if hasVal {
			x, err := strconv.ParseFloat(val, 64)
			if err != nil || x <= 0 {
				return f, fmt.Errorf("--fault capacity=%s: want a positive factor", val)
			}
			f.CapacityFactor = x
		}
	default:
		return f, fmt.Errorf("--fault %q: want restart, bypass, capacity, kill, hang or rolling", spec)
	}
	return f, nil
}

// Matrix is `kvroute sim`'s set of runs: at each load, each policy with
// each hold variant and each KV variant, every run of a load on the same
// requests.
type Matrix struct {
	// Base is every run's Config but for its policy, name, variants,
	// offered load, faults and oracle TTFTs, which the matrix sets.
	Base     Config
	Workload string
	Options  workload.Options
	// Loads are the offered loads (a fraction of the fleet's prefill
	// capacity; 0: the workload's own pace).
	Loads    []float64
	Policies []string
	Holds    []Variant // HoldVariants; nil: one, without a hold
	KV       []Variant // KVVariants; nil: one, approximate
	// Oracle also computes each load's bounds (OracleTTFTs) on the
	// fleet's fastest preset.
	Oracle bool
	// Fault is the --fault spec for every run (ParseFault).
	Fault string
	// Fleets are the fleet's shapes each policy runs on (FleetVariants);
	// nil: one, Base's.
	Fleets []Variant
}

// Plan is a Matrix's jobs, grouped by load, PerLoad runs each.
type Plan struct {
	Jobs    []Job
	PerLoad int
	// Oracles[k] bounds the k-th load's requests (nil without Oracle): a
	// synthetic workload is regenerated at each load's rate, so each load
	// has its own bound. OraclePreset is the preset they assume.
	Oracles      []*report.Oracle
	OraclePreset engine.Preset
	// Routed counts every run's requests routed so far, for progress.
	Routed atomic.Int64
}

// Plan builds the matrix's jobs.
func (m Matrix) Plan() (*Plan, error) {
	holds, kv := m.Holds, m.KV
	if len(holds) == 0 {
		holds = []Variant{{}}
	}
	if len(kv) == 0 {
		kv = []Variant{{}}
	}
	engines := m.Base.Engines
	if len(engines) == 0 {
		return nil, errors.New("sim: no engines")
	}
	capacity := Capacity(engines)
	fleets := m.Fleets
	if len(fleets) == 0 {
		fleets = []Variant{{}}
	}
	p := &Plan{OraclePreset: FastestPreset(engines)}
	for _, load := range m.Loads {
		reqs, offered, err := LoadAt(m.Workload, m.Options, load, capacity)
		if err != nil {
			return nil, err
		}
		var own []time.Duration
		if m.Oracle {
			o, ttfts, err := OracleTTFTs(reqs, p.OraclePreset, request.Options{})
			if err != nil {
				return nil, err
			}
			p.Oracles = append(p.Oracles, &o)
			own = ttfts
		}
		faults, err := ParseFault(m.Fault, reqs)
		if err != nil {
			return nil, err
		}
		// The fault's settings (the router's timeouts and grace, the
		// engines' start) are Base's; the spec says which and when.
		faults.StreamIdle, faults.DrainGrace, faults.EngineStart = m.Base.Faults.StreamIdle, m.Base.Faults.DrainGrace, m.Base.Faults.EngineStart
		first := len(p.Jobs)
		for _, pol := range m.Policies {
			for _, fl := range fleets {
				if !fl.Runs(pol) {
					continue
				}
				for _, h := range holds {
					for _, v := range kv {
						c := m.Base
						c.Policy, c.Name, c.OfferedLoad = pol, pol+fl.Suffix+h.Suffix+v.Suffix, offered
						c.Hold, c.KVEvents, c.Faults, c.OracleTTFT, c.Routed = h.Hold, v.KV, faults, own, &p.Routed
						c.Roles, c.Split = fl.Roles, fl.Split
						p.Jobs = append(p.Jobs, Job{Reqs: reqs, Config: c})
					}
				}
			}
		}
		p.PerLoad = len(p.Jobs) - first
	}
	return p, nil
}

// Requests is the number of requests of every job.
func (p *Plan) Requests() int {
	n := 0
	for _, j := range p.Jobs {
		n += len(j.Reqs)
	}
	return n
}

// Run runs the plan's jobs, parallel at a time (RunAll), and with an
// oracle sets each run's hit rate as a share of its load's oracle's.
func (p *Plan) Run(parallel int) ([]report.Run, error) {
	runs, err := RunAll(p.Jobs, parallel)
	if err != nil {
		return nil, err
	}
	if len(p.Oracles) > 0 {
		for i := 0; i < len(runs); i += p.PerLoad {
			ApplyOracle(runs[i:i+p.PerLoad], p.Oracles[i/p.PerLoad])
		}
	}
	return runs, nil
}

// ApplyOracle sets each run's hit rate as a share of the oracle's.
func ApplyOracle(runs []report.Run, o *report.Oracle) {
	if o.HitRate <= 0 {
		return
	}
	for i := range runs {
		runs[i].OfOracle = runs[i].PrefixHitRate / o.HitRate
	}
}

// FastestPreset is the preset of engines with the highest prefill
// capacity, which bounds every engine of a mixed fleet: the fleet-level
// TTFT bound assumes it.
func FastestPreset(engines []engine.Preset) engine.Preset {
	best := engines[0]
	for _, p := range engines[1:] {
		if p.PrefillTokensPerSec() > best.PrefillTokensPerSec() {
			best = p
		}
	}
	return best
}
