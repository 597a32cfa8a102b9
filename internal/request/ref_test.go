package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/openai"
)

// This file is the reference implementation of Parse, on encoding/json
// (which decodes the body several times): FuzzParse checks that Parse
// accepts exactly the bodies it accepts and gives the same views.
//
// It reads the body as the engines do (see body.go): every object is
// decoded into a map[string]json.RawMessage, whose keys encoding/json
// matches byte for byte, the last of a repeated key winning, as a
// Python dict does; refStrict adds the rules of json.loads that
// encoding/json lacks. FuzzEngineReading holds both to json.loads itself.

// refParse is Parse on encoding/json: the reference that FuzzParse holds
// Parse to.
func refParse(k Kind, body []byte, opt Options) (*View, *openai.Error) {
	body = bytes.Trim(body, " \t\n\r")
	if len(body) == 0 || body[0] != '{' {
		return nil, openai.BadRequest("invalid_json", "request body must be a JSON object")
	}
	if k != Chat && k != Completion {
		return nil, openai.BadRequest("invalid_endpoint", "unknown endpoint")
	}
	if err := refStrict(body); err != nil {
		return nil, refJSONError(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, refJSONError(err)
	}
	// First every type the view holds, as Parse fails on the first value
	// of a wrong type before it checks the view.
	var b refBody
	if err := b.decode(k, top); err != nil {
		return nil, refJSONError(err)
	}
	v := &View{Kind: k, Model: b.model, Stream: b.stream, IgnoreEOS: b.ignoreEOS, IncludeUsage: b.includeUsage}
	lim := opt.limits()
	maxTok := b.maxTokens
	switch k {
	case Chat:
		if len(b.messages) == 0 {
			return nil, errMissingMessages()
		}
		if len(b.messages) > lim.messages {
			return nil, errTooManyMessages(len(b.messages), lim.messages)
		}
		if n := refCalls(b.messages); n > lim.calls {
			return nil, errTooManyToolCalls(n, lim.calls)
		}
		if len(b.tools) > lim.tools {
			return nil, errTooManyTools(len(b.tools), lim.tools)
		}
		prompt, first, err := refRenderChat(b.messages, b.tools, lim.parts)
		if err != nil {
			return nil, err
		}
		v.Prompt, v.FirstUser = prompt, first
		v.PromptTokens = EstimateTokens(v.Prompt)
		if b.maxCompletionTokens != nil {
			maxTok = b.maxCompletionTokens
		}
	case Completion:
		prompt, ntok, err := refRenderPrompt(top["prompt"], lim.items)
		if err != nil {
			return nil, err
		}
		v.Prompt = prompt
		v.PromptTokens, v.PromptExact = ntok, true
		if ntok < 0 {
			v.PromptTokens, v.PromptExact = EstimateTokens(v.Prompt), false
		}
	}
	if maxTok != nil {
		if *maxTok < 0 {
			return nil, errMaxTokens()
		}
		v.MaxTokens = *maxTok
	}
	if b.minTokens != nil {
		if *b.minTokens < 0 {
			return nil, errMinTokens()
		}
		v.MinTokens = *b.minTokens
	}
	if raw, ok := top[opt.SessionField]; ok && opt.SessionField != "" {
		v.SessionKey = refSessionKey(raw)
	}
	return v, nil
}

// refBody holds the fields of a body, decoded.
type refBody struct {
	model                                     string
	stream, ignoreEOS, includeUsage           bool
	maxTokens, maxCompletionTokens, minTokens *int
	messages                                  []refMessage
	tools                                     []json.RawMessage
}

type refMessage struct {
	role, name string
	content    json.RawMessage
	toolCalls  []refToolCall
}

type refToolCall struct{ name, arguments string }

func (b *refBody) decode(k Kind, top map[string]json.RawMessage) error {
	err := errors.Join(
		refValue(top["model"], &b.model),
		refValue(top["stream"], &b.stream),
		refValue(top["ignore_eos"], &b.ignoreEOS),
		refValue(top["max_tokens"], &b.maxTokens),
		refValue(top["min_tokens"], &b.minTokens),
	)
	var so map[string]json.RawMessage
	if err := refValue(top["stream_options"], &so); err != nil {
		return err
	}
	if so != nil {
		err = errors.Join(err, refValue(so["include_usage"], &b.includeUsage))
	}
	if k == Completion {
		return err
	}
	err = errors.Join(err,
		refValue(top["max_completion_tokens"], &b.maxCompletionTokens),
		refValue(top["tools"], &b.tools))
	var msgs []map[string]json.RawMessage
	if err := errors.Join(err, refValue(top["messages"], &msgs)); err != nil {
		return err
	}
	b.messages = make([]refMessage, len(msgs))
	for i, m := range msgs {
		mm := &b.messages[i]
		mm.content = m["content"]
		var calls []map[string]json.RawMessage
		err = errors.Join(err,
			refValue(m["role"], &mm.role),
			refValue(m["name"], &mm.name),
			refValue(m["tool_calls"], &calls))
		for _, c := range calls {
			var f map[string]json.RawMessage
			var tc refToolCall
			err = errors.Join(err, refValue(c["function"], &f),
				refValue(f["name"], &tc.name), refValue(f["arguments"], &tc.arguments))
			mm.toolCalls = append(mm.toolCalls, tc)
		}
	}
	return err
}

func refCalls(msgs []refMessage) int {
	n := 0
	for _, m := range msgs {
		n += len(m.toolCalls)
	}
	return n
}

// refValue decodes raw, if any, into v, a string, bool, *int, map or
// slice; null leaves v's zero value, as None does a field.
func refValue(raw json.RawMessage, v any) error {
	if raw == nil {
		return nil
	}
	return json.Unmarshal(raw, v)
}

// refStrict fails on what json.loads refuses, or reads otherwise, and
// encoding/json does not (see scan.go): invalid UTF-8, an escaped lone
// surrogate, an integer of more than maxIntDigits digits, nesting deeper
// than maxDepth. It trusts the syntax to encoding/json.
func refStrict(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("invalid UTF-8")
	}
	depth := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] != '\\' || i+1 >= len(b) {
					continue
				}
				if b[i+1] != 'u' || i+6 > len(b) {
					i++
					continue
				}
				r, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 32)
				if err != nil {
					return nil // encoding/json fails on it
				}
				if 0xD800 <= r && r < 0xDC00 && i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					if r2, err := strconv.ParseUint(string(b[i+8:i+12]), 16, 32); err == nil && 0xDC00 <= r2 && r2 < 0xE000 {
						i += 11
						continue
					}
				}
				if 0xD800 <= r && r < 0xE000 {
					return errors.New("lone surrogate")
				}
				i += 5
			}
		case c == '[' || c == '{':
			if depth++; depth > maxDepth {
				return errors.New("too deep")
			}
		case c == ']' || c == '}':
			depth--
		case c == '-' || '0' <= c && c <= '9':
			j := i
			if c == '-' {
				j++
			}
			k := j
			for k < len(b) && '0' <= b[k] && b[k] <= '9' {
				k++
			}
			if k-j > maxIntDigits && (k == len(b) || b[k] != '.' && b[k] != 'e' && b[k] != 'E') {
				return errors.New("integer too long")
			}
			i = k - 1
		}
	}
	return nil
}

func refJSONError(err error) *openai.Error {
	return openai.BadRequest("invalid_json", "malformed request body: "+err.Error())
}

// refSessionKey is the session field's string, "" for null, else its JSON
// text.
func refSessionKey(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// refRenderChat renders chat messages as chatView does.
func refRenderChat(msgs []refMessage, tools []json.RawMessage, maxParts int) (prompt, firstUser string, e *openai.Error) {
	var sb strings.Builder
	if len(tools) > 0 {
		sb.WriteString("<|tools|>\n")
		var buf bytes.Buffer
		for _, t := range tools {
			buf.Reset()
			if err := json.Compact(&buf, t); err != nil {
				panic(err) // a valid JSON value always compacts
			}
			sb.Write(buf.Bytes())
			sb.WriteByte('\n')
		}
	}
	seenUser := false
	for i, m := range msgs {
		if m.role == "" {
			return "", "", errNoRole(i)
		}
		sb.WriteString("<|")
		sb.WriteString(m.role)
		sb.WriteString("|>\n")
		start := sb.Len()
		if fault, parts := refWriteContent(&sb, m.content); fault != contentOK {
			return "", "", errContent(i, fault)
		} else if parts > maxParts {
			return "", "", errTooManyParts(i, parts, maxParts)
		}
		if m.role == "user" && !seenUser {
			seenUser = true
			firstUser = sb.String()[start:]
		}
		for _, tc := range m.toolCalls {
			sb.WriteString("<|tool_call|>")
			sb.WriteString(tc.name)
			sb.WriteByte(' ')
			sb.WriteString(tc.arguments)
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), firstUser, nil
}

// refWriteContent writes the text of a message's content, and says how it
// is wrong and how many parts it has.
func refWriteContent(sb *strings.Builder, raw json.RawMessage) (fault uint8, parts int) {
	if raw == nil || string(raw) == "null" {
		return contentOK, 0
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			panic(err) // a valid JSON string always decodes
		}
		sb.WriteString(s)
		return contentOK, 0
	case '[':
		var ps []json.RawMessage
		if err := json.Unmarshal(raw, &ps); err != nil {
			panic(err)
		}
		var text strings.Builder
		for _, p := range ps {
			var m map[string]json.RawMessage
			var typ, txt string
			if p[0] != '{' || json.Unmarshal(p, &m) != nil || refValue(m["type"], &typ) != nil || refValue(m["text"], &txt) != nil {
				return contentParts, 0
			}
			switch typ {
			case "text", "input_text":
				text.WriteString(txt)
			default:
				text.WriteString("<|" + typ + "|>")
			}
		}
		sb.WriteString(text.String())
		return contentOK, len(ps)
	}
	return contentType, 0
}

// refRenderPrompt renders a completions prompt, whose first element
// decides its type. ntok is the exact token count for token-id prompts,
// else -1.
func refRenderPrompt(raw json.RawMessage, maxItems int) (text string, ntok int, e *openai.Error) {
	if raw == nil || string(raw) == "null" {
		return "", 0, errMissingPrompt()
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			panic(err)
		}
		return s, -1, nil
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			panic(err)
		}
		if len(elems) == 0 || elems[0][0] == '"' {
			var strs []string
			for _, e := range elems {
				var s string
				if e[0] != '"' || json.Unmarshal(e, &s) != nil {
					return "", 0, errInvalidPrompt()
				}
				strs = append(strs, s)
			}
			if len(strs) > maxItems {
				return "", 0, errTooManyItems(len(strs), maxItems)
			}
			return strings.Join(strs, ""), -1, nil
		}
		var toks []int64
		if elems[0][0] != '[' {
			if refTokens(raw, &toks) != nil {
				return "", 0, errInvalidPrompt()
			}
		} else {
			for _, e := range elems {
				var batch []int64
				if e[0] != '[' || refTokens(e, &batch) != nil {
					return "", 0, errInvalidPrompt()
				}
				toks = append(toks, batch...)
			}
		}
		if len(toks) > maxItems {
			return "", 0, errTooManyItems(len(toks), maxItems)
		}
		return refTokensText(toks), len(toks), nil
	}
	return "", 0, errInvalidPrompt()
}

// refTokens decodes an array of token ids, none null.
func refTokens(raw json.RawMessage, toks *[]int64) error {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return err
	}
	for _, e := range elems {
		var t int64
		if string(e) == "null" || json.Unmarshal(e, &t) != nil {
			return errors.New("not a token id")
		}
		*toks = append(*toks, t)
	}
	return nil
}

// refTokensText renders token ids as text so that equal token prefixes
// give equal text prefixes.
func refTokensText(toks []int64) string {
	b := make([]byte, 0, len(toks)*6)
	for _, t := range toks {
		b = strconv.AppendInt(b, t, 36)
		b = append(b, ' ')
	}
	return string(b)
}
