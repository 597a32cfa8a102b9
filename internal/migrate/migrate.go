// Package migrate continues a streamed answer on another engine when the
// engine that was streaming it fails: the request the new engine gets
// (Body: the original request with the answer so far appended, the way
// the engines continue it) and the client's one stream made of both
// engines' (Stream: the new stream's chunks rewritten to the first's id
// and creation time, no second role chunk, usage summed as the client
// would have seen it, one [DONE]).
//
// A chat completion is continued as vLLM and SGLang continue one: the
// answer so far becomes a final assistant message, with
// continue_final_message true and add_generation_prompt false (vLLM
// renders the final message open, without its end of turn; SGLang takes
// the final assistant message out of the template and appends its text
// to the rendered prompt; vLLM refuses both flags true). A completion is
// continued as its prompt followed by the text. Both have max_tokens (and
// max_completion_tokens, min_tokens) reduced by the tokens sent.
//
// What the protocol cannot continue exactly is refused (Check): more than
// one choice (n, best_of), prompt logprobs and echo (the prompt would be
// the continuation's), guided decoding and structured outputs (the
// grammar's state is not in the text), tools (a tool call's arguments are
// not content), a client's own continue_final_message, a completion
// prompt of token ids or of several prompts, per-chunk usage, and the
// Responses and Messages APIs (neither engine continues a final
// assistant turn there).
//
// The package is pure: no I/O, no clock. The proxy's relay drives it.
package migrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/internal/request"
)

// Refusal is why a request cannot be continued; it names the member or
// the condition.
type Refusal string

func (r Refusal) Error() string { return "cannot be continued: " + string(r) }

// Refusals.
const (
	RefuseKind       Refusal = "only chat completions and completions are continued"
	RefuseNotStream  Refusal = "only streams are continued"
	RefuseChoices    Refusal = "more than one choice (n, best_of)"
	RefuseEcho       Refusal = "echo"
	RefuseLogprobs   Refusal = "prompt logprobs"
	RefuseGuided     Refusal = "guided decoding or structured output"
	RefuseTools      Refusal = "tools"
	RefuseContinued  Refusal = "the request continues a final message itself"
	RefusePrompt     Refusal = "a completion prompt other than one string"
	RefuseUsage      Refusal = "per-chunk usage (continuous_usage_stats)"
	RefuseBudget     Refusal = "the output budget is spent"
	RefuseMalformed  Refusal = "a body that is not a JSON object"
	RefuseNotContent Refusal = "the answer so far holds more than text (tool calls, reasoning)"
)

// guided are the members that constrain decoding by a grammar whose
// state the text does not carry (vLLM's guided_* and structured_outputs,
// SGLang's regex, json_schema and ebnf).
var guided = map[string]bool{
	"guided_json": true, "guided_regex": true, "guided_choice": true, "guided_grammar": true,
	"structured_outputs": true, "regex": true, "json_schema": true, "ebnf": true,
}

// member is one top-level member of a body: its key and the offsets of
// its start and of its value.
type member struct {
	key               string
	start, value, end int
}

// members is body's top-level members, the last of a repeated key
// winning (as json.loads reads it).
func members(body []byte) (map[string]member, []member, error) {
	var all []member
	if err := request.Members(body, func(key []byte, start, value, end int) {
		all = append(all, member{string(key), start, value, end})
	}); err != nil {
		return nil, nil, RefuseMalformed
	}
	last := make(map[string]member, len(all))
	for _, m := range all {
		last[m.key] = m
	}
	return last, all, nil
}

// Check reports whether the request of view v and body can be continued
// exactly, nil when it can.
func Check(v *request.View, body []byte) error {
	if v.Kind != request.Chat && v.Kind != request.Completion {
		return RefuseKind
	}
	if !v.Stream {
		return RefuseNotStream
	}
	last, _, err := members(body)
	if err != nil {
		return err
	}
	val := func(k string) []byte {
		m, ok := last[k]
		if !ok {
			return nil
		}
		b := bytes.TrimSpace(body[m.value:m.end])
		if string(b) == "null" {
			return nil
		}
		return b
	}
	if n := val("n"); n != nil && string(n) != "1" {
		return RefuseChoices
	}
	if b := val("best_of"); b != nil && string(b) != "1" {
		return RefuseChoices
	}
	if e := val("echo"); e != nil && string(e) != "false" {
		return RefuseEcho
	}
	if pl := val("prompt_logprobs"); pl != nil {
		return RefuseLogprobs
	}
	for k := range guided {
		if val(k) != nil {
			return RefuseGuided
		}
	}
	if rf := val("response_format"); rf != nil {
		var f struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(rf, &f) != nil || f.Type != "text" {
			return RefuseGuided
		}
	}
	if so := val("stream_options"); so != nil {
		var o struct {
			Continuous *bool `json:"continuous_usage_stats"`
		}
		if json.Unmarshal(so, &o) != nil || o.Continuous != nil && *o.Continuous {
			return RefuseUsage
		}
	}
	switch v.Kind {
	case request.Chat:
		if t := val("tools"); t != nil && string(t) != "[]" {
			if tc := val("tool_choice"); string(tc) != `"none"` {
				return RefuseTools
			}
		}
		if c := val("continue_final_message"); c != nil && string(c) != "false" {
			return RefuseContinued
		}
	case request.Completion:
		if p := val("prompt"); len(p) == 0 || p[0] != '"' {
			return RefusePrompt
		}
	}
	return nil
}

// Body is the body that continues, on another engine, the answer to the
// request of view v and body of which text, tokens tokens, was sent: a
// chat's messages with the text as a final assistant message to continue,
// a completion's prompt followed by the text, the output budgets reduced
// by tokens. Every other member is kept as the client sent it. It refuses
// (a Refusal) what Check refuses, and a request whose budget is spent.
func Body(v *request.View, body []byte, text string, tokens int) ([]byte, error) {
	if err := Check(v, body); err != nil {
		return nil, err
	}
	last, all, err := members(body)
	if err != nil {
		return nil, err
	}
	drop := map[string]bool{"max_tokens": true, "max_completion_tokens": true, "min_tokens": true,
		"add_generation_prompt": true, "continue_final_message": true}
	out := make([]byte, 0, len(body)+len(text)+128)
	out = append(out, '{')
	add := func(key string, value []byte) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, key) // keys of our own: plain ASCII
		out = append(out, ':')
		out = append(out, value...)
	}
	quoted, err := json.Marshal(text)
	if err != nil {
		return nil, err
	}
	for _, m := range all {
		if last[m.key] != m || drop[m.key] {
			continue // a repeated key's earlier value, or one rewritten
		}
		val := body[m.value:m.end]
		switch {
		case v.Kind == request.Chat && m.key == "messages":
			arr := bytes.TrimSpace(val)
			// Parse required a non-empty array: it ends with ']'.
			msg := append([]byte(`{"role":"assistant","content":`), quoted...)
			msg = append(msg, '}')
			val = append(append(append(append([]byte{}, arr[:len(arr)-1]...), ','), msg...), ']')
		case v.Kind == request.Completion && m.key == "prompt":
			p, err := json.Marshal(v.Prompt + text)
			if err != nil {
				return nil, err
			}
			val = p
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, body[m.start:m.value]...) // the key as sent, and its colon
		out = append(out, val...)
	}
	if v.MaxTokens > 0 {
		left := v.MaxTokens - tokens
		if left < 1 {
			return nil, RefuseBudget
		}
		key := "max_tokens"
		if _, ok := last["max_completion_tokens"]; ok && v.Kind == request.Chat && maxCompletionSet(body, last) {
			key = "max_completion_tokens"
		}
		add(key, strconv.AppendInt(nil, int64(left), 10))
	}
	if v.MinTokens > 0 {
		add("min_tokens", strconv.AppendInt(nil, int64(max(0, v.MinTokens-tokens)), 10))
	}
	if v.Kind == request.Chat {
		add("continue_final_message", []byte("true"))
		add("add_generation_prompt", []byte("false"))
	}
	out = append(out, '}')
	return out, nil
}

// maxCompletionSet reports whether body's max_completion_tokens is set
// (not null): the budget the view read.
func maxCompletionSet(body []byte, last map[string]member) bool {
	m := last["max_completion_tokens"]
	return string(bytes.TrimSpace(body[m.value:m.end])) != "null"
}

// Continuation is the continued request of Body as the router routes it:
// its body and its view (the prompt with the answer so far, which the
// prefix index matches, the engine that computed the original holding
// most of it).
func Continuation(v *request.View, body []byte, text string, tokens int, opt request.Options) ([]byte, *request.View, error) {
	b, err := Body(v, body, text, tokens)
	if err != nil {
		return nil, nil, err
	}
	nv, e := request.Parse(v.Kind, b, opt)
	if e != nil {
		return nil, nil, fmt.Errorf("the continuation does not parse: %w", e)
	}
	nv.SessionKey, nv.PrefixSalt, nv.Role = v.SessionKey, v.PrefixSalt, v.Role
	return b, nv, nil
}

// errNoEvent is a Stream's input that is not an event stream it can
// splice.
var errNoEvent = errors.New("not a chunk of a chat completion or completion stream")
