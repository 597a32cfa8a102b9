package workload

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// The coding-agent loop: each arrival starts a session of an agent
// harness (one long system prompt and 16 tool definitions, about 4-5k
// tokens, shared by every session) working on a task of its own. Each
// turn after the first sends back the tool result of the last one
// (300-1,500 tokens), so a session's context grows turn by turn, and the
// next turn is sent once the answer is in (Request.After), as an agent
// loop does. The same sessions come in three APIs:
//
//   - coding-agent: chat completions with X-Session-ID, the whole history
//     each turn (the assistant's answers as the workload's text);
//   - coding-agent-responses: OpenAI's Responses API with store and
//     previous_response_id: the first turn sends the instructions and the
//     task, each later one only the tool result, the engine inserting the
//     stored conversation (its own answers among it);
//   - coding-agent-messages: Anthropic's Messages API with Claude Code's
//     session header (x-claude-code-session-id), the whole history each
//     turn, tool results as tool_result blocks.
//
// Arrivals are sessions: --limit N gives N sessions. The outputs are the
// engine's choice within max_tokens (the agents' APIs have no min_tokens),
// so the three are alike.

// Coding-agent APIs.
const (
	codingChat = iota
	codingResponses
	codingMessages
)

// ClaudeSessionHeader is Claude Code's session header.
const ClaudeSessionHeader = "x-claude-code-session-id"

// codingHarness is the shared part of every session.
type codingHarness struct {
	system []seg
	// tools in each API's format: chat's, Responses', Anthropic's.
	chat, responses, messages []string
}

func newCodingHarness(s *synth) *codingHarness {
	h := &codingHarness{system: []seg{lit("you are a coding agent: read the task, call one tool at a time, and report when done "), text(s.key(31), s.logUniform(2500, 3500))}}
	for j := range 16 {
		t := toolJSON(s, 300, uint64(j))
		var v struct {
			Function struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		_ = json.Unmarshal([]byte(t), &v) // toolJSON writes valid JSON
		f := v.Function
		resp, _ := json.Marshal(map[string]any{"type": "function", "name": f.Name, "description": f.Description, "parameters": f.Parameters})
		msg, _ := json.Marshal(map[string]any{"name": f.Name, "description": f.Description, "input_schema": f.Parameters})
		h.chat, h.responses, h.messages = append(h.chat, t), append(h.responses, string(resp)), append(h.messages, string(msg))
	}
	return h
}

// codingTurn is one turn of a session: its history so far.
type codingTurn struct {
	h       *codingHarness
	api     int
	task    seg
	answers []seg // the assistant's answers of the turns before (chat, messages)
	results []seg // the tool results of the turns before
	out     int
}

func buildCoding(api int) func(s *synth, ats []time.Duration) []Request {
	return func(s *synth, ats []time.Duration) []Request {
		h := newCodingHarness(s)
		type keyed struct {
			r             Request
			session, turn int
		}
		var all []keyed
		for sid, at := range ats {
			turns := 4 + s.rng.IntN(6)
			task := text(s.key(32, uint64(sid)), s.logUniform(100, 400))
			var answers, results []seg
			for k := range turns {
				out := s.logUniform(40, 200)
				t := &codingTurn{h: h, api: api, task: task, answers: slices.Clip(answers), results: slices.Clip(results), out: out}
				r := Request{At: at + time.Duration(k)*3*time.Second, Kind: request.Chat, Session: fmt.Sprintf("agent-%d", sid),
					OutputTokens: out, withPrev: t.body}
				switch api {
				case codingResponses:
					r.Kind, r.Session = request.Responses, ""
				case codingMessages:
					r.Kind, r.SessionHeader = request.Messages, ClaudeSessionHeader
				}
				r.InputTokens = t.inputTokens(r.Kind)
				all = append(all, keyed{r, sid, k})
				answers = append(answers, text(s.key(33, uint64(sid), uint64(k)), out))
				results = append(results, text(s.key(34, uint64(sid), uint64(k)), s.logUniform(300, 1500)))
			}
		}
		slices.SortStableFunc(all, func(a, b keyed) int { return cmp.Compare(a.r.At, b.r.At) })
		index := map[[2]int]int{}
		for i, k := range all {
			index[[2]int{k.session, k.turn}] = i
		}
		reqs := make([]Request, len(all))
		for i, k := range all {
			reqs[i] = k.r
			if k.turn > 0 {
				reqs[i].After = index[[2]int{k.session, k.turn - 1}] + 1
				if api == codingResponses {
					reqs[i].Prev = reqs[i].After
				}
			}
		}
		return reqs
	}
}

// inputTokens is the router's estimate of the prompt it sees: the whole
// history's (chat, Messages), the new input's of a Responses turn that
// continues a stored response (the engine adds the rest).
func (t *codingTurn) inputTokens(kind request.Kind) int {
	v, err := request.Parse(kind, t.body("m", PendingResponse), request.Options{})
	if err != nil {
		panic("workload: a coding-agent body does not parse: " + err.Message)
	}
	return v.PromptTokens
}

// body renders the turn in its API, prev being the id of the response it
// continues (Responses).
func (t *codingTurn) body(model, prev string) []byte {
	b := append(make([]byte, 0, 1<<14), `{"model":`...)
	b = appendJSONString(b, model)
	b = append(b, `,"stream":true`...)
	tools := t.h.chat
	switch t.api {
	case codingResponses:
		tools = t.h.responses
	case codingMessages:
		tools = t.h.messages
	}
	b = append(b, `,"tools":[`...)
	for i, tool := range tools {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, tool...)
	}
	b = append(b, ']')
	switch t.api {
	case codingChat:
		b = append(b, `,"max_tokens":`...)
		b = strconv.AppendInt(b, int64(t.out), 10)
		b = append(b, `,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"`...)
		b = appendSegs(b, t.h.system)
		b = append(b, `"},{"role":"user","content":"`...)
		b = t.task.appendTo(b)
		b = append(b, `"}`...)
		for i := range t.results {
			b = append(b, `,{"role":"assistant","content":"`...)
			b = t.answers[i].appendTo(b)
			b = append(b, `"},{"role":"tool","tool_call_id":"t`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `","content":"`...)
			b = t.results[i].appendTo(b)
			b = append(b, `"}`...)
		}
		return append(b, "]}"...)
	case codingMessages:
		b = append(b, `,"max_tokens":`...)
		b = strconv.AppendInt(b, int64(t.out), 10)
		b = append(b, `,"system":"`...)
		b = appendSegs(b, t.h.system)
		b = append(b, `","messages":[{"role":"user","content":"`...)
		b = t.task.appendTo(b)
		b = append(b, `"}`...)
		for i := range t.results {
			b = append(b, `,{"role":"assistant","content":"`...)
			b = t.answers[i].appendTo(b)
			b = append(b, `"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `","content":"`...)
			b = t.results[i].appendTo(b)
			b = append(b, `"}]}`...)
		}
		return append(b, "]}"...)
	}
	b = append(b, `,"store":true,"max_output_tokens":`...)
	b = strconv.AppendInt(b, int64(t.out), 10)
	if len(t.results) == 0 {
		// The first turn: the instructions and the task.
		b = append(b, `,"instructions":"`...)
		b = appendSegs(b, t.h.system)
		b = append(b, `","input":[{"role":"user","content":"`...)
		b = t.task.appendTo(b)
		return append(b, `"}]}`...)
	}
	k := len(t.results) - 1
	b = append(b, `,"previous_response_id":`...)
	b = appendJSONString(b, prev)
	b = append(b, `,"input":[{"type":"function_call_output","call_id":"t`...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `","output":"`...)
	b = t.results[k].appendTo(b)
	return append(b, `"}]}`...)
}

func appendSegs(b []byte, segs []seg) []byte {
	for _, s := range segs {
		b = s.appendTo(b)
	}
	return b
}
