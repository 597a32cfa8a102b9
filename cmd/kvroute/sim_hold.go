package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/sim"
)

// lateFlags are sim's late-binding flags.
type lateFlags struct {
	mode   lateMode
	tokens int64
	order  string
	slack  float64
	cap    time.Duration
}

// lateMode is --late-binding: off, on (the flag alone), or both (each
// policy run without and with it, side by side).
type lateMode string

func (m *lateMode) String() string { return string(*m) }

func (m *lateMode) Set(s string) error {
	switch s {
	case "true", "on":
		*m = "on"
	case "false", "off":
		*m = "off"
	case "both":
		*m = "both"
	default:
		return fmt.Errorf("want on, off or both")
	}
	return nil
}

// IsBoolFlag lets --late-binding stand alone for on.
func (m *lateMode) IsBoolFlag() bool { return true }

func (l *lateFlags) register(fs *flag.FlagSet) {
	l.mode = "off"
	fs.Var(&l.mode, "late-binding", "hold requests in the router while every engine has --hold-tokens of queued prefill, and bind them as engines free up (runs named POLICY+late); =both runs each policy without and with it")
	fs.Int64Var(&l.tokens, "hold-tokens", admission.DefaultHoldTokens, "with --late-binding: the per-engine bound of queued prefill tokens (admission.max_pending_prefill_tokens_per_backend)")
	fs.StringVar(&l.order, "hold-order", admission.DefaultHoldOrder.String(), "with --late-binding: the order of held requests, fcfs or deadline (arrival + slack x own prefill cost)")
	fs.Float64Var(&l.slack, "hold-slack", admission.DefaultSlack, "with --late-binding and --hold-order deadline: the slack")
	fs.DurationVar(&l.cap, "hold-cap", admission.DefaultCap, "with --late-binding and --hold-order deadline: the most a deadline lies after its arrival")
}

// holds are the runs of each policy that --late-binding asks for.
func (l *lateFlags) holds() ([]sim.Variant, error) {
	if l.mode != "on" && l.mode != "both" {
		return sim.HoldVariants(sim.LateOff, sim.Hold{})
	}
	o, err := sim.ParseHoldOrder(l.order)
	if err != nil {
		return nil, err
	}
	return sim.HoldVariants(sim.LateBinding(l.mode), sim.Hold{Tokens: l.tokens, Order: o, Slack: l.slack, Cap: l.cap})
}
