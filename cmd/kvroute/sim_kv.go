package main

import (
	"errors"
	"flag"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
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
	_, err := sim.ParseFault(k.fault, nil)
	return err
}

// variants are the runs of each policy: approximate, then precise and the
// truth bound with --kv-events.
func (k *kvFlags) variants(oracle bool) []sim.Variant {
	return sim.KVVariants(k.events, k.delay, oracle)
}
