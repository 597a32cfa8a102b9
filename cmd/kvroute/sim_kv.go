package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// kvFlags are sim's KV event and fault flags.
type kvFlags struct {
	events bool
	delay  time.Duration
	fault  string
}

func (k *kvFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&k.events, "kv-events", false, "also run each policy routing on the engines' KV cache events (precise; named POLICY+precise), and with --oracle on what the engines truly hold at routing time (POLICY+truth)")
	fs.DurationVar(&k.delay, "kv-events-delay", 50*time.Millisecond, "with --kv-events: how long an engine's events take to reach the router")
	fs.StringVar(&k.fault, "fault", "", "a fault for every run: restart[=D] (engine 0's cache wiped at D, default the middle of the arrivals), bypass[=F] (a share F of requests, default 0.3, reaches a random engine without the router), capacity[=X] (engine 0 reports X times its KV capacity, default 2)")
}

func (k *kvFlags) check() error {
	if k.delay < 0 {
		return errors.New("--kv-events-delay must not be negative")
	}
	_, err := k.faults(nil)
	return err
}

// variant is one run per policy: its name and how its router sees caches.
type variant struct {
	suffix string
	kv     *sim.KVEvents
}

// variants are the runs of each policy: approximate, then precise and the
// truth bound with --kv-events.
func (k *kvFlags) variants(oracle bool) []variant {
	v := []variant{{}}
	if k.events {
		v = append(v, variant{"+precise", &sim.KVEvents{Delay: k.delay}})
		if oracle {
			v = append(v, variant{"+truth", &sim.KVEvents{Truth: true}})
		}
	}
	return v
}

// faults parses --fault for reqs (nil: only check the syntax).
func (k *kvFlags) faults(reqs []workload.Request) (sim.Faults, error) {
	var f sim.Faults
	name, val, hasVal := strings.Cut(strings.TrimSpace(k.fault), "=")
	switch name {
	case "":
		return f, nil
	case "restart":
		if hasVal {
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return f, fmt.Errorf("--fault restart=%s: want a positive duration", val)
			}
			f.RestartAt = d
		} else if len(reqs) > 0 {
			lo, hi := reqs[0].At, reqs[0].At
			for _, r := range reqs {
				lo, hi = min(lo, r.At), max(hi, r.At)
			}
			f.RestartAt = max(lo+(hi-lo)/2, 1)
		} else {
			f.RestartAt = 1
		}
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
		return f, fmt.Errorf("--fault %q: want restart, bypass or capacity", k.fault)
	}
	return f, nil
}
