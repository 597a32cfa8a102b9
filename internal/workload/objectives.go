package workload

import (
	"time"

	"github.com/kvroute/kvroute/internal/slo"
)

// The objectives of the "objectives" workload's three kinds of request.
var (
	// InteractiveObjective: a chat user waiting for the first word, and
	// reading the stream as it comes.
	InteractiveObjective = slo.Objective{TTFT: 1000 * time.Millisecond, ITL: 60 * time.Millisecond, Class: slo.Critical}
	// AgentObjective: an agent's tool call can wait for its start, but its
	// stream feeds the next step and must keep up.
	AgentObjective = slo.Objective{TTFT: 4 * time.Second, ITL: 40 * time.Millisecond, Class: slo.Standard}
	// BatchObjective: a summarisation a client would rather resend later
	// than get late.
	BatchObjective = slo.Objective{TTFT: 8 * time.Second, ITL: 200 * time.Millisecond, Class: slo.Sheddable}
)

// buildObjectives: the mixed-objective workload. 50% interactive chat
// (short prompts under a shared system prompt, critical, tight TTFT), 30%
// agent calls (4 apps' long system prompts and tools, loose TTFT, a
// steady stream: a tight ITL), 20% batch summarisation of a document of
// its own (6-16k tokens, sheddable, loose objectives).
func buildObjectives(s *synth, ats []time.Duration) []Request {
	agents := buildAgent(s, ats)
	system := msg{"system", []seg{lit("you are a helpful assistant "), text(s.key(7), 400)}}
	reqs := make([]Request, 0, len(ats))
	for n, at := range ats {
		var r Request
		switch u := s.rng.Float64(); {
		case u < 0.5:
			spec := &chatSpec{msgs: []msg{system, {"user", []seg{text(s.key(8, uint64(n)), s.logUniform(10, 300))}}}, out: s.logUniform(20, 300)}
			r = chatRequest(at, "", spec)
			r.Objective = InteractiveObjective
		case u < 0.8:
			r = agents[n]
			r.Objective = AgentObjective
		default:
			doc := text(s.key(9, uint64(n)), 6000+s.rng.IntN(10001))
			spec := &chatSpec{msgs: []msg{system, {"user", []seg{lit("summarize the following document "), doc}}}, out: 200 + s.rng.IntN(301)}
			r = chatRequest(at, "", spec)
			r.Objective = BatchObjective
		}
		reqs = append(reqs, r)
	}
	return reqs
}
