package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// This file is the reference implementation of Parse, on encoding/json
// (which decodes the body up to four times): FuzzParse checks that Parse
// accepts exactly the bodies it accepts and gives the same views.

// refParse is Parse as it was built on encoding/json: the reference that
// FuzzParse holds Parse to. Only the limits that came later are added.
func refParse(k Kind, body []byte, opt Options) (*View, *openai.Error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, openai.BadRequest("invalid_json", "request body must be a JSON object")
	}
	v := &View{Kind: k}
	var maxTok, minTok *int
	switch k {
	case Chat:
		var b refChatBody
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, refJSONError(err)
		}
		if len(b.Messages) == 0 {
			return nil, errMissingMessages()
		}
		lim := opt.limits()
		if len(b.Messages) > lim.messages {
			return nil, errTooManyMessages(len(b.Messages), lim.messages)
		}
		prompt, first, err := refRenderChat(b.Messages, b.Tools, lim.parts)
		if err != nil {
			return nil, err
		}
		v.Model, v.Prompt, v.FirstUser = b.Model, prompt, first
		v.IgnoreEOS, v.Stream = b.IgnoreEOS, b.Stream
		v.IncludeUsage = b.StreamOptions != nil && b.StreamOptions.IncludeUsage
		maxTok, minTok = b.MaxTokens, b.MinTokens
		if b.MaxCompletionTokens != nil {
			maxTok = b.MaxCompletionTokens
		}
		v.PromptTokens = EstimateTokens(v.Prompt)
	case Completion:
		var b refCompletionBody
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, refJSONError(err)
		}
		prompt, ntok, err := refRenderPrompt(b.Prompt, opt.limits().items)
		if err != nil {
			return nil, err
		}
		v.Model, v.Prompt = b.Model, prompt
		v.IgnoreEOS, v.Stream = b.IgnoreEOS, b.Stream
		v.IncludeUsage = b.StreamOptions != nil && b.StreamOptions.IncludeUsage
		maxTok, minTok = b.MaxTokens, b.MinTokens
		v.PromptTokens, v.PromptExact = ntok, true
		if ntok < 0 {
			v.PromptTokens, v.PromptExact = EstimateTokens(v.Prompt), false
		}
	default:
		return nil, openai.BadRequest("invalid_endpoint", "unknown endpoint")
	}
	if maxTok != nil {
		if *maxTok < 0 {
			return nil, errMaxTokens()
		}
		v.MaxTokens = *maxTok
	}
	if minTok != nil {
		if *minTok < 0 {
			return nil, errMinTokens()
		}
		v.MinTokens = *minTok
	}
	if opt.SessionField != "" {
		v.SessionKey = refSessionField(body, opt.SessionField)
	}
	return v, nil
}

// refCommon are the fields of both kinds of body; encoding/json decodes
// an embedded struct's fields as the outer struct's own.
type refCommon struct {
	Model         string            `json:"model"`
	MaxTokens     *int              `json:"max_tokens"`
	MinTokens     *int              `json:"min_tokens"`
	IgnoreEOS     bool              `json:"ignore_eos"`
	Stream        bool              `json:"stream"`
	StreamOptions *refStreamOptions `json:"stream_options"`
}

type refChatBody struct {
	refCommon
	Messages            []refMessage `json:"messages"`
	Tools               []refRaw     `json:"tools"`
	MaxCompletionTokens *int         `json:"max_completion_tokens"`
}

type refCompletionBody struct {
	refCommon
	Prompt refRaw `json:"prompt"`
}

type refStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type refMessage struct {
	Role      string `json:"role"`
	Content   refRaw `json:"content"`
	Name      string `json:"name"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// refRaw is a JSON value of the body left undecoded, like
// json.RawMessage but aliasing the body. UnmarshalJSON never fails, so
// that a content of the wrong type is reported with the message's index.
type refRaw []byte

func (r *refRaw) UnmarshalJSON(data []byte) error {
	*r = data
	return nil
}

type refPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func refJSONError(err error) *openai.Error {
	msg := err.Error()
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		msg = fmt.Sprintf("field %q has the wrong type: got JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	return openai.BadRequest("invalid_json", "malformed request body: "+msg)
}

func refSessionField(body []byte, field string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	raw, ok := m[field]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	// A number or other scalar still identifies a session.
	return string(bytes.TrimSpace(raw))
}

// refRenderChat renders chat messages as chatView does.
func refRenderChat(msgs []refMessage, tools []refRaw, maxParts int) (prompt, firstUser string, e *openai.Error) {
	var sb strings.Builder
	if len(tools) > 0 {
		sb.WriteString("<|tools|>\n")
		var buf bytes.Buffer
		for _, t := range tools {
			buf.Reset()
			if err := json.Compact(&buf, t); err != nil {
				panic(err) // a valid JSON value always compacts
			}
			sb.Write(bytes.ToValidUTF8(buf.Bytes(), []byte("\uFFFD")))
			sb.WriteByte('\n')
		}
	}
	seenUser := false
	for i, m := range msgs {
		if m.Role == "" {
			return "", "", errNoRole(i)
		}
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		start := sb.Len()
		if fault, parts := refWriteContent(&sb, m.Content); fault != contentOK {
			return "", "", errContent(i, fault)
		} else if parts > maxParts {
			return "", "", errTooManyParts(i, parts, maxParts)
		}
		if m.Role == "user" && !seenUser {
			seenUser = true
			firstUser = sb.String()[start:]
		}
		for _, tc := range m.ToolCalls {
			sb.WriteString("<|tool_call|>")
			sb.WriteString(tc.Function.Name)
			sb.WriteByte(' ')
			sb.WriteString(tc.Function.Arguments)
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String(), firstUser, nil
}

// refWriteContent writes the text of a message's content, and says how it
// is wrong and how many parts it has.
func refWriteContent(sb *strings.Builder, raw refRaw) (fault uint8, parts int) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
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
		var ps []refPart
		if err := json.Unmarshal(raw, &ps); err != nil {
			return contentParts, 0
		}
		for _, p := range ps {
			switch p.Type {
			case "text", "input_text":
				sb.WriteString(p.Text)
			default:
				sb.WriteString("<|")
				sb.WriteString(p.Type)
				sb.WriteString("|>")
			}
		}
		return contentOK, len(ps)
	}
	return contentType, 0
}

// refRenderPrompt renders a completions prompt, trying each type it may
// have in turn. ntok is the exact token count for token-id prompts, else -1.
func refRenderPrompt(raw refRaw, maxItems int) (text string, ntok int, e *openai.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
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
		var strs []string
		if json.Unmarshal(raw, &strs) == nil {
			if len(strs) > maxItems {
				return "", 0, errTooManyItems(len(strs), maxItems)
			}
			return strings.Join(strs, ""), -1, nil
		}
		var toks []int64
		if json.Unmarshal(raw, &toks) == nil {
			if len(toks) > maxItems {
				return "", 0, errTooManyItems(len(toks), maxItems)
			}
			return refTokensText(toks), len(toks), nil
		}
		var batches [][]int64
		if json.Unmarshal(raw, &batches) == nil {
			var sb strings.Builder
			n := 0
			for _, b := range batches {
				if b == nil {
					n++ // a null entry is an item too
				}
				sb.WriteString(refTokensText(b))
				n += len(b)
			}
			if n > maxItems {
				return "", 0, errTooManyItems(n, maxItems)
			}
			return sb.String(), n - refNulls(batches), nil
		}
	}
	return "", 0, errInvalidPrompt()
}

func refNulls(batches [][]int64) int {
	n := 0
	for _, b := range batches {
		if b == nil {
			n++
		}
	}
	return n
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
