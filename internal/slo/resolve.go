package slo

import (
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
)

// Defaults are the configured objectives a request gets when its headers
// set none (config's objectives section), built once per config.
type Defaults struct {
	// Models are per-model objectives (their Class unused).
	Models map[string]Objective
	// Objectives are InferenceObjectives' priorities by name.
	Objectives map[string]int
}

// Empty reports whether nothing is configured: a request then has
// objectives only from its own headers.
func (d *Defaults) Empty() bool {
	return d == nil || len(d.Models) == 0 && len(d.Objectives) == 0
}

// Source is what the router knows of a request beside its headers: its
// model, its tenant's defaults (the API key's; the zero Objective for
// none) and whether its TCP peer is a trusted front, whose headers may
// raise its standing (the priority rule's trust, admission's
// trusted_priority_cidrs).
type Source struct {
	Model     string
	Tenant    Objective
	FromFront bool
}

// Resolve reads a request's objectives: its headers' durations over its
// tenant's over its model's, and its class. The class is the tenant's,
// or the class of the InferenceObjective x-llm-d-inference-objective names
// (where configured), or X-Kvroute-Criticality's, the later winning; a
// header's class is taken from a trusted front, and from anyone when it
// only lowers the request's standing below what it had without it. A
// malformed header is a 400.
func (d *Defaults) Resolve(h http.Header, src Source) (Objective, *openai.Error) {
	o, e := ParseHeaders(h)
	if e != nil {
		return Objective{}, e
	}
	o = o.Over(src.Tenant)
	if d != nil {
		o = o.Over(d.Models[src.Model])
	}
	base := src.Tenant.Class
	class := base
	if d != nil && len(d.Objectives) > 0 {
		if p, ok := d.Objectives[h.Get(HeaderObjective)]; ok {
			class = FromPriority(p)
		}
	}
	c, ok, e := ParseClassHeader(h)
	if e != nil {
		return Objective{}, e
	}
	if ok {
		class = c
	}
	if src.FromFront || class.Lowers(base) {
		o.Class = class
	} else {
		o.Class = base
	}
	return o, nil
}
