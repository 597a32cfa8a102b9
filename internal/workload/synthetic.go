package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// ContextTokens is the context length the synthetic workloads stay within:
// every request's prompt plus its output fits in it.
const ContextTokens = 32768

// builtin is one synthetic workload.
type builtin struct {
	name, desc string
	// build turns arrival times into requests, drawing from rng.
	build func(s *synth, at []time.Duration) []Request
}

var builtins = []builtin{
	{"chat", "multi-turn conversations (X-Session-ID per conversation) whose history grows turn by turn under 4 shared system prompts", chatShape.build},
	{"chat-docs", "multi-turn conversations (X-Session-ID) that each open on a long text of their own (2-8k tokens), then short questions and answers on it", docChatShape.build},
	{"agent", "4 agent apps with long shared system prompts and tool definitions (2-6k tokens), many short calls", buildAgent},
	{"agentic", "tool loops under 3 hot agent harnesses (system prompt and tools, 3-9k tokens, shared by every task): each step appends a tool result, some tasks fork 2-4 parallel sub-agents from their context, 4% heavy one-off requests (8-20k tokens)", buildAgentic},
	{"mixed", "mostly short chat requests plus 5% summarisation requests of 20-31k tokens (\"hello\" vs \"summarize 50 pages\")", buildMixed},
	{"coding-agent", "coding-agent loop sessions (each arrival a session, X-Session-ID): a shared harness (system prompt and 16 tools, 4-5k tokens), a task, then 3-8 more turns each sending back a tool result of 300-1,500 tokens once the answer is in", buildCoding(codingChat)},
	{"coding-agent-responses", "the coding-agent sessions through the Responses API: store, previous_response_id, only the new tool result each turn", buildCoding(codingResponses)},
	{"coding-agent-messages", "the coding-agent sessions through the Messages API with Claude Code's session header (x-claude-code-session-id)", buildCoding(codingMessages)},
	{"objectives", "a mix of objectives: 50% interactive chat (critical: first token in 1 s, 60 ms a token), 30% agent calls (standard: 4 s, a steady 40 ms a token), 20% batch summarisation of 6-16k-token documents (sheddable: 8 s, 200 ms)", buildObjectives},
	{"rag", "questions over a pool of 40 long documents (1.5-6k tokens) with skewed popularity, reused across questions", buildRAG},
}

// families seed a workload by another's name: the variants of one family
// draw the same requests.
var families = map[string]string{"coding-agent-responses": "coding-agent", "coding-agent-messages": "coding-agent"}

// synth holds the state shared by the synthetic generators.
type synth struct {
	rng  *rand.Rand
	seed uint64
}

// key derives a text key from the workload seed and the given coordinates.
func (s *synth) key(vs ...uint64) uint64 { return mix(append([]uint64{s.seed}, vs...)...) }

// logUniform draws an integer in [lo, hi] uniformly in log space: lengths of
// prompts and outputs are heavy-tailed, with many short ones.
func (s *synth) logUniform(lo, hi int) int {
	v := float64(lo) * math.Pow(float64(hi)/float64(lo), s.rng.Float64())
	return min(hi, max(lo, int(v)))
}

// pick draws an index with probability proportional to w.
func (s *synth) pick(w []float64) int {
	total := 0.0
	for _, x := range w {
		total += x
	}
	u := s.rng.Float64() * total
	for i, x := range w {
		if u < x {
			return i
		}
		u -= x
	}
	return len(w) - 1
}

func loadBuiltin(b builtin, opt Options) ([]Request, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	if opt.Limit == 0 && opt.Duration == 0 {
		opt.Duration = 60 * time.Second
	}
	seed, name := uint64(opt.Seed), b.name
	if f, ok := families[name]; ok {
		name = f
	}
	s := &synth{rng: rand.New(rand.NewPCG(seed, mix(seed, uint64(len(name))))), seed: mix(seed, strHash(name))}
	return b.build(s, arrivals(s.rng, opt)), nil
}

func strHash(s string) uint64 {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// arrivals draws Poisson arrival times at opt.Rate: the first at 0, then
// exponential gaps, until Limit requests or Duration.
func arrivals(rng *rand.Rand, opt Options) []time.Duration {
	var out []time.Duration
	t := 0.0
	for i := 0; opt.Limit == 0 || i < opt.Limit; i++ {
		if i > 0 {
			t += rng.ExpFloat64() / opt.Rate
		}
		at := time.Duration(t * float64(time.Second))
		if opt.Duration > 0 && at >= opt.Duration {
			break
		}
		out = append(out, at)
	}
	return out
}

func chatRequest(at time.Duration, session string, spec *chatSpec) Request {
	return Request{
		At:           at,
		Kind:         request.Chat,
		Session:      session,
		InputTokens:  (spec.promptBytes() + 3) / 4,
		OutputTokens: spec.out,
		body:         spec.body,
	}
}

// conv is one conversation of the chat workloads.
type conv struct {
	id       int
	history  []msg // all messages so far, ending with the assistant's reply
	turn     int
	maxTurns int
	readyAt  time.Duration
}

// convShape is the shape of a multi-turn workload: token ranges are
// [lo, hi] drawn log-uniformly.
type convShape struct {
	// systems is the number of shared system prompts, of sysTok tokens.
	systems int
	sysTok  [2]int
	// firstTok is a conversation's first user message, nextTok the later ones.
	firstTok, nextTok [2]int
	outTok            [2]int
	// minTurns and maxTurns bound a conversation's length.
	minTurns, maxTurns int
	// cont is the chance that an arrival continues a conversation whose
	// user is ready rather than starting a new one.
	cont float64
}

// chatShape: everyday chat, whose prompts are mostly the shared system
// prompt and the growing history of short turns.
var chatShape = convShape{
	systems: 4, sysTok: [2]int{300, 1200},
	firstTok: [2]int{40, 800}, nextTok: [2]int{15, 300}, outTok: [2]int{30, 600},
	minTurns: 2, maxTurns: 12, cont: 0.75,
}

// docChatShape: each conversation opens on a long text of its own (a
// contract, a paper, a log) that the following questions are about, with
// short answers. Its prompts are mostly private history: only the engine
// that served the previous turn holds it, so where a turn lands decides
// whether the text is prefilled again, and short answers keep decoding
// (and a live replay's CPU) light.
var docChatShape = convShape{
	systems: 2, sysTok: [2]int{100, 300},
	firstTok: [2]int{2000, 8000}, nextTok: [2]int{15, 120}, outTok: [2]int{20, 150},
	minTurns: 4, maxTurns: 10, cont: 0.85,
}

// build: conversations of minTurns-maxTurns turns. Each arrival continues a
// conversation whose user has read the last reply (estimated generation
// time plus a think time), or starts a new one. Turn n+1's messages are turn
// n's messages, the assistant reply (rendered as text of the requested
// output length), and a new user message, so turn n's prompt is a prefix of
// turn n+1's.
func (sh convShape) build(s *synth, ats []time.Duration) []Request {
	sysTok := make([]int, sh.systems)
	for i := range sysTok {
		sysTok[i] = s.logUniform(sh.sysTok[0], sh.sysTok[1])
	}
	var active []*conv
	nextID := 0
	reqs := make([]Request, 0, len(ats))
	for _, at := range ats {
		// Conversations whose user is ready for the next turn.
		var ready []int
		for i, c := range active {
			if c.readyAt <= at {
				ready = append(ready, i)
			}
		}
		var c *conv
		if len(ready) > 0 && s.rng.Float64() < sh.cont {
			c = active[ready[s.rng.IntN(len(ready))]]
		} else {
			sys := s.rng.IntN(sh.systems)
			c = &conv{id: nextID, maxTurns: sh.minTurns + s.rng.IntN(sh.maxTurns-sh.minTurns+1)}
			c.history = []msg{{"system", []seg{lit("you are a helpful assistant "), text(s.key(1, uint64(sys)), sysTok[sys])}}}
			nextID++
			active = append(active, c)
		}
		userTok := s.logUniform(sh.nextTok[0], sh.nextTok[1])
		if c.turn == 0 {
			userTok = s.logUniform(sh.firstTok[0], sh.firstTok[1])
		}
		out := s.logUniform(sh.outTok[0], sh.outTok[1])
		msgs := append(slices.Clip(c.history), msg{"user", []seg{text(s.key(2, uint64(c.id), uint64(c.turn)), userTok)}})
		spec := &chatSpec{msgs: msgs, out: out}
		r := chatRequest(at, fmt.Sprintf("chat-%d", c.id), spec)
		reqs = append(reqs, r)

		c.turn++
		c.history = append(slices.Clip(msgs), msg{"assistant", []seg{text(s.key(3, uint64(c.id), uint64(c.turn)), out)}})
		// Generation at ~25 ms a token, then 2 s plus an exponential think time.
		c.readyAt = at + time.Duration(out)*25*time.Millisecond + 2*time.Second + time.Duration(s.rng.ExpFloat64()*6*float64(time.Second))
		// Retire a conversation at its last turn, or when another turn of
		// the longest kind could overflow the context.
		if c.turn >= c.maxTurns || r.InputTokens+out+sh.nextTok[1]+sh.outTok[1]+64 > ContextTokens {
			active = slices.DeleteFunc(active, func(x *conv) bool { return x == c })
		}
	}
	return reqs
}

// buildAgent: a few agent apps, each with a long system prompt and its own
// tool definitions, called with short tasks (half of them one tool step in).
func buildAgent(s *synth, ats []time.Duration) []Request {
	type app struct {
		system []seg
		tools  []string
	}
	weights := []float64{0.4, 0.3, 0.2, 0.1}
	apps := make([]app, len(weights))
	for i := range apps {
		apps[i].system = []seg{lit("you are an autonomous assistant that completes tasks with the tools below "), text(s.key(1, uint64(i)), s.logUniform(1200, 3000))}
		nt := 6 + s.rng.IntN(11)
		for j := 0; j < nt; j++ {
			apps[i].tools = append(apps[i].tools, toolJSON(s, uint64(i), uint64(j)))
		}
	}
	reqs := make([]Request, 0, len(ats))
	for n, at := range ats {
		a := apps[s.pick(weights)]
		msgs := []msg{{"system", a.system}, {"user", []seg{text(s.key(2, uint64(n)), s.logUniform(20, 300))}}}
		if s.rng.IntN(2) == 0 {
			msgs = append(msgs,
				msg{"assistant", []seg{lit("calling a tool "), text(s.key(3, uint64(n)), s.logUniform(10, 60))}},
				msg{"tool", []seg{text(s.key(4, uint64(n)), s.logUniform(50, 800))}})
		}
		reqs = append(reqs, chatRequest(at, "", &chatSpec{tools: a.tools, msgs: msgs, out: s.logUniform(10, 200)}))
	}
	return reqs
}

// toolJSON is a compact OpenAI function-tool definition with generated
// descriptions.
func toolJSON(s *synth, app, i uint64) string {
	var b strings.Builder
	word := func(key uint64, n int) string { return string(appendText(nil, key, n)) }
	fmt.Fprintf(&b, `{"type":"function","function":{"name":"tool_%d_%d","description":"%s","parameters":{"type":"object","properties":{`,
		app, i, word(s.key(5, app, i), 4*s.logUniform(40, 150)))
	np := 1 + s.rng.IntN(4)
	for p := 0; p < np; p++ {
		if p > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"arg_%d":{"type":"string","description":"%s"}`, p, word(s.key(6, app, i, uint64(p)), 4*s.logUniform(8, 40)))
	}
	b.WriteString(`},"required":["arg_0"]}}}`)
	return b.String()
}

// buildMixed: 95% short chat requests, 5% summarisation of a long document
// of its own (20,000-31,000 tokens, so that prompt and output fit the
// context).
func buildMixed(s *synth, ats []time.Duration) []Request {
	system := msg{"system", []seg{lit("you are a helpful assistant")}}
	reqs := make([]Request, 0, len(ats))
	for n, at := range ats {
		var spec *chatSpec
		if s.rng.Float64() < 0.05 {
			doc := text(s.key(2, uint64(n)), 20000+s.rng.IntN(11001))
			spec = &chatSpec{msgs: []msg{system, {"user", []seg{lit("summarize the following document "), doc}}}, out: 200 + s.rng.IntN(301)}
		} else {
			spec = &chatSpec{msgs: []msg{system, {"user", []seg{text(s.key(1, uint64(n)), s.logUniform(5, 200))}}}, out: s.logUniform(10, 300)}
		}
		reqs = append(reqs, chatRequest(at, "", spec))
	}
	return reqs
}

// buildRAG: each question retrieves one document (sometimes two) from a
// pool with Zipf-like popularity and puts it at the start of the user
// message, so questions about the same document share its prefix.
func buildRAG(s *synth, ats []time.Duration) []Request {
	const docs = 40
	docTok := make([]int, docs)
	weights := make([]float64, docs)
	for i := range docTok {
		docTok[i] = s.logUniform(1500, 6000)
		weights[i] = 1 / float64(i+1)
	}
	system := msg{"system", []seg{lit("answer the question using only the context "), text(s.key(1), 150)}}
	reqs := make([]Request, 0, len(ats))
	for n, at := range ats {
		d := s.pick(weights)
		user := []seg{lit("context "), text(s.key(2, uint64(d)), docTok[d])}
		if s.rng.Float64() < 0.3 {
			d2 := s.pick(weights)
			user = append(user, lit(" "), text(s.key(2, uint64(d2)), docTok[d2]))
		}
		user = append(user, lit(" question "), text(s.key(3, uint64(n)), s.logUniform(15, 80)))
		reqs = append(reqs, chatRequest(at, "", &chatSpec{msgs: []msg{system, {"user", user}}, out: s.logUniform(30, 300)}))
	}
	return reqs
}

// agentTask is one tool loop of the agentic workload: a task's main agent,
// or a sub-agent forked from one.
type agentTask struct {
	id       string
	app      int
	history  []msg // ends with a user task or a tool result
	steps    int
	maxSteps int
	readyAt  time.Duration
	forked   bool       // a main agent forks at most once
	parent   *agentTask // nil for a main agent
	// pending is the number of sub-agents a main agent waits for, results
	// their answers, appended as tool messages when the last one finishes.
	pending int
	results []msg
}

// agentic's shape, from what public agent traces show: requests come from
// a handful of harnesses, each sending the same long system prompt and tool
// definitions with every call; a task is a loop of calls whose prompt is
// the previous call's prompt plus the model's tool call and the tool's
// result, so contexts grow step by step and most of each prompt was seen
// one step before; an orchestrator may hand parts of its task to parallel
// sub-agents that start from its context; and the odd heavy request (a
// whole file or log pasted once) passes through.
const (
	agenticHeavyShare = 0.04 // heavy one-off requests among arrivals
	agenticForkChance = 0.2  // a main agent forks at a step from its second on
	agenticNever      = time.Duration(math.MaxInt64)
)

// buildAgentic: each arrival is a heavy one-off request (agenticHeavyShare),
// the next step of a loop whose tool has returned (the model's reply at
// ~25 ms a token plus the tool's run time; 97% of the time when one has,
// so that loops run without waiting for a free turn), or a new task. A step's output
// is a tool call (20-250 tokens), its tool result 50-3,000 tokens; a task
// runs 3-30 steps, a sub-agent 2-8, and its last step's output is its
// answer. Sessions: a task's id for its own steps, the id with "/sub-k"
// for its sub-agents, so a sub-agent shares its parent's prefix under
// another key; heavy requests have none.
func buildAgentic(s *synth, ats []time.Duration) []Request {
	weights := []float64{0.5, 0.3, 0.2}
	type app struct {
		system []seg
		tools  []string
	}
	apps := make([]app, len(weights))
	for i := range apps {
		apps[i].system = []seg{lit("you are an agent that completes the task with the tools below, one call at a time "), text(s.key(11, uint64(i)), s.logUniform(2000, 4000))}
		for j := range 8 + s.rng.IntN(9) {
			apps[i].tools = append(apps[i].tools, toolJSON(s, 100+uint64(i), uint64(j)))
		}
	}
	var active []*agentTask
	tasks := 0
	reqs := make([]Request, 0, len(ats))
	for n, at := range ats {
		if s.rng.Float64() < agenticHeavyShare {
			a := apps[s.pick(weights)]
			doc := text(s.key(12, uint64(n)), s.logUniform(8000, 20000))
			msgs := []msg{{"system", a.system}, {"user", []seg{lit("read this and report what matters "), doc}}}
			reqs = append(reqs, chatRequest(at, "", &chatSpec{tools: a.tools, msgs: msgs, out: s.logUniform(100, 500)}))
			continue
		}
		var ready []*agentTask
		for _, t := range active {
			if t.readyAt <= at {
				ready = append(ready, t)
			}
		}
		var t *agentTask
		if len(ready) > 0 && s.rng.Float64() < 0.97 {
			t = ready[s.rng.IntN(len(ready))]
		} else {
			ai := s.pick(weights)
			t = &agentTask{id: fmt.Sprintf("task-%d", tasks), app: ai, maxSteps: s.logUniform(3, 30)}
			t.history = []msg{{"system", apps[ai].system}, {"user", []seg{text(s.key(13, uint64(tasks)), s.logUniform(50, 500))}}}
			tasks++
			active = append(active, t)
		}
		t.steps++
		spec := &chatSpec{tools: apps[t.app].tools, msgs: t.history}
		// The longest growth of a step: a tool call and its result, or the
		// fork's call and four sub-agents' answers.
		last := t.steps >= t.maxSteps || (spec.promptBytes()+3)/4+250+3000+4*600+64 > ContextTokens
		spec.out = s.logUniform(20, 250)
		if last {
			spec.out = s.logUniform(100, 600)
		}
		out := spec.out
		reqs = append(reqs, chatRequest(at, t.id, spec))
		reply := msg{"assistant", []seg{lit("call "), text(s.key(14, strHash(t.id), uint64(t.steps)), out)}}
		done := at + time.Duration(out)*25*time.Millisecond
		switch {
		case last:
			active = slices.DeleteFunc(active, func(x *agentTask) bool { return x == t })
			if p := t.parent; p != nil {
				p.results = append(p.results, msg{"tool", []seg{lit("sub-agent answer "), text(s.key(15, strHash(t.id)), out)}})
				if p.pending--; p.pending == 0 {
					p.history = append(slices.Clip(p.history), p.results...)
					p.readyAt = done
				}
			}
		case t.parent == nil && !t.forked && t.steps >= 2 && s.rng.Float64() < agenticForkChance:
			// The call hands parts of the task to sub-agents, which start
			// from the context and the call, each with its own part.
			t.forked = true
			t.history = append(slices.Clip(t.history), reply)
			t.pending, t.readyAt = 2+s.rng.IntN(3), agenticNever
			for k := range t.pending {
				sub := &agentTask{id: fmt.Sprintf("%s/sub-%d", t.id, k), app: t.app, parent: t, maxSteps: s.logUniform(2, 8), readyAt: done}
				sub.history = append(slices.Clip(t.history), msg{"user", []seg{lit("your part "), text(s.key(16, strHash(sub.id)), s.logUniform(30, 200))}})
				active = append(active, sub)
			}
		default:
			result := msg{"tool", []seg{text(s.key(17, strHash(t.id), uint64(t.steps)), s.logUniform(50, 3000))}}
			t.history = append(slices.Clip(t.history), reply, result)
			// The tool runs 0.1 s plus an exponential second.
			t.readyAt = done + 100*time.Millisecond + time.Duration(s.rng.ExpFloat64()*float64(time.Second))
		}
	}
	return reqs
}
