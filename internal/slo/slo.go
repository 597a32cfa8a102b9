// Package slo holds per-request latency objectives: what a request is
// promised (a time to first token, an inter-token latency) and how much it
// matters (its criticality), read from its headers and the configured
// defaults; the rule that picks among candidates by their predicted
// headroom and refuses a sheddable request no candidate can serve in time
// (Choose); and the attainment a served request reached (Judge).
//
// It is pure code: no I/O, no clock (times are given), no knowledge of
// backends. The prediction itself is the cost model's (package costmodel,
// predict.go), made by the policies.
package slo

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// Class is a request's criticality. The zero value is Standard.
type Class uint8

const (
	// Standard requests are served best effort when no engine is predicted
	// to meet their objectives.
	Standard Class = iota
	// Critical requests are served best effort too, and are the ones the
	// shedding of sheddable requests protects.
	Critical
	// Sheddable requests are refused at once (429) when no engine is
	// predicted to meet their objectives, instead of being queued to miss
	// them.
	Sheddable
)

// Classes lists the classes in label order (metrics, reports).
var Classes = [...]Class{Critical, Standard, Sheddable}

// String is the class's name, as the header and the config spell it.
func (c Class) String() string {
	switch c {
	case Critical:
		return "critical"
	case Sheddable:
		return "sheddable"
	}
	return "standard"
}

// rank orders the classes by standing: higher is served first.
func (c Class) rank() int {
	switch c {
	case Critical:
		return 2
	case Sheddable:
		return 0
	}
	return 1
}

// Lowers reports whether c's standing is at most d's: a class any client
// may ask for in place of d.
func (c Class) Lowers(d Class) bool { return c.rank() <= d.rank() }

// ParseClass reads a class's name ("" is Standard).
func ParseClass(s string) (Class, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "standard":
		return Standard, nil
	case "critical":
		return Critical, nil
	case "sheddable":
		return Sheddable, nil
	}
	return Standard, fmt.Errorf("%q is not a criticality (critical, standard or sheddable)", s)
}

// FromPriority is the class of an InferenceObjective's priority: negative
// is sheddable (as the Gateway API inference extension sheds it), positive
// critical, 0 standard.
func FromPriority(p int) Class {
	switch {
	case p < 0:
		return Sheddable
	case p > 0:
		return Critical
	}
	return Standard
}

// Objective is what a request is promised. A zero duration sets no
// objective of that kind; the zero Objective sets none at all (None).
type Objective struct {
	// TTFT is the time to first token, from the router's arrival.
	TTFT time.Duration
	// ITL is the mean time between two output tokens of the stream
	// (llm-d's TPOT).
	ITL   time.Duration
	Class Class
}

// None reports whether o sets no latency objective: the request is routed
// as it would be without objectives (its class alone changes nothing).
func (o Objective) None() bool { return o.TTFT <= 0 && o.ITL <= 0 }

// Over fills o's unset durations from d.
func (o Objective) Over(d Objective) Objective {
	if o.TTFT <= 0 {
		o.TTFT = d.TTFT
	}
	if o.ITL <= 0 {
		o.ITL = d.ITL
	}
	return o
}

// The headers a request's objectives come in. llm-d's pair is read as
// its router reads it; kvroute's own pair wins when both are sent.
const (
	HeaderTTFT      = "X-Kvroute-Slo-Ttft-Ms"
	HeaderITL       = "X-Kvroute-Slo-Tpot-Ms"
	HeaderLLMDTTFT  = "X-Llm-D-Slo-Ttft-Ms"
	HeaderLLMDITL   = "X-Llm-D-Slo-Tpot-Ms"
	HeaderClass     = "X-Kvroute-Criticality"
	HeaderObjective = "X-Llm-D-Inference-Objective"
)

// MaxMillis bounds an objective header's value: a day.
const MaxMillis = 24 * 3600 * 1000

// ParseHeaders reads the objectives a request's headers set (its class is
// left to Resolve, which knows whom to trust). A malformed value is a 400
// in the OpenAI error shape.
func ParseHeaders(h http.Header) (Objective, *openai.Error) {
	var o Objective
	var err *openai.Error
	if o.TTFT, err = millis(h, HeaderTTFT, HeaderLLMDTTFT); err != nil {
		return Objective{}, err
	}
	if o.ITL, err = millis(h, HeaderITL, HeaderLLMDITL); err != nil {
		return Objective{}, err
	}
	return o, nil
}

// millis reads the first of names that is set, a positive number of
// milliseconds (fractions allowed).
func millis(h http.Header, names ...string) (time.Duration, *openai.Error) {
	for _, n := range names {
		v, ok := h[n]
		if !ok || len(v) == 0 {
			continue
		}
		s := strings.TrimSpace(v[0])
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || !(f > 0) || f > MaxMillis {
			return 0, openai.BadRequest("invalid_slo",
				fmt.Sprintf("header %s: %q is not a number of milliseconds in (0, %d]", n, s, MaxMillis))
		}
		return time.Duration(f * float64(time.Millisecond)), nil
	}
	return 0, nil
}

// ParseClassHeader reads X-Kvroute-Criticality; ok is false when the
// request sent none. A malformed value is a 400.
func ParseClassHeader(h http.Header) (c Class, ok bool, e *openai.Error) {
	v := h.Get(HeaderClass)
	if v == "" {
		return Standard, false, nil
	}
	c, err := ParseClass(v)
	if err != nil {
		return Standard, false, openai.BadRequest("invalid_criticality", "header "+HeaderClass+": "+err.Error())
	}
	return c, true, nil
}

// SetHeaders writes o as kvroute's headers (a load generator's request):
// its durations in milliseconds, and its class unless standard.
func (o Objective) SetHeaders(h http.Header) {
	if o.TTFT > 0 {
		h.Set(HeaderTTFT, strconv.FormatFloat(float64(o.TTFT)/float64(time.Millisecond), 'f', -1, 64))
	}
	if o.ITL > 0 {
		h.Set(HeaderITL, strconv.FormatFloat(float64(o.ITL)/float64(time.Millisecond), 'f', -1, 64))
	}
	if o.Class != Standard {
		h.Set(HeaderClass, o.Class.String())
	}
}
