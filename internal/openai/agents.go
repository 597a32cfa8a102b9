package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// The agents' APIs: OpenAI's Responses API (/v1/responses) and Anthropic's
// Messages API (/v1/messages), as vLLM serves them.

// ResponseObject is a Responses API response ("object": "response").
type ResponseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Model              string          `json:"model"`
	Status             string          `json:"status"`
	Output             []ResponseItem  `json:"output"`
	Usage              *ResponseUsage  `json:"usage"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              bool            `json:"store"`
	Background         bool            `json:"background"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	IncompleteDetails  *IncompleteInfo `json:"incomplete_details"`
}

// IncompleteInfo says why a response is incomplete.
type IncompleteInfo struct {
	Reason string `json:"reason"`
}

// ResponseItem is an output item: an assistant message.
type ResponseItem struct {
	ID      string        `json:"id"`
	Type    string        `json:"type"`
	Role    string        `json:"role"`
	Status  string        `json:"status"`
	Content []ContentPart `json:"content"`
}

// ContentPart is an output_text part.
type ContentPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// ResponseUsage is a Responses API usage.
type ResponseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	OutputTokens        int                 `json:"output_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	InputTokensDetails  ResponseInputUsage  `json:"input_tokens_details"`
	OutputTokensDetails ResponseOutputUsage `json:"output_tokens_details"`
}

// ResponseInputUsage details a Responses usage's input.
type ResponseInputUsage struct {
	CachedTokens int `json:"cached_tokens"`
}

// ResponseOutputUsage details a Responses usage's output.
type ResponseOutputUsage struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// ResponseEvent is one event of a streamed response; Type is also the SSE
// event name.
type ResponseEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *ResponseObject `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	Item           *ResponseItem   `json:"item,omitempty"`
	Part           *ContentPart    `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
}

// MessagesResponse is an Anthropic Messages API answer ("type": "message").
type MessagesResponse struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []MessageBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        MessagesUsage  `json:"usage"`
}

// MessageBlock is a content block of an answer.
type MessageBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// MessagesUsage is Anthropic's usage; cache_read_input_tokens is the
// prompt tokens served from the cache.
type MessagesUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

// MessagesEvent is one event of a streamed Messages answer; Type is also
// the SSE event name.
type MessagesEvent struct {
	Type         string            `json:"type"`
	Message      *MessagesResponse `json:"message,omitempty"`
	Index        *int              `json:"index,omitempty"`
	ContentBlock *MessageBlock     `json:"content_block,omitempty"`
	Delta        any               `json:"delta,omitempty"`
	Usage        *MessagesUsage    `json:"usage,omitempty"`
}

// TextDelta is a content_block_delta's delta.
type TextDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// StopDelta is a message_delta's delta.
type StopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// AnthropicError is Anthropic's error shape:
// {"type":"error","error":{"type":...,"message":...}}.
type AnthropicError struct {
	Type  string               `json:"type"`
	Error AnthropicErrorDetail `json:"error"`
}

// AnthropicErrorDetail is the inner error.
type AnthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// ResponseNotFound is vLLM's answer to a request naming a stored response
// it does not hold.
func ResponseNotFound(id string) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "response_not_found",
		Message: "Response with id '" + id + "' not found.", Numeric: true}
}

// AnthropicType is Anthropic's error type for an HTTP status.
func AnthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusMethodNotAllowed, http.StatusRequestTimeout:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// WriteAnthropic encodes e in Anthropic's error shape with its status code
// (and Retry-After).
func (e *Error) WriteAnthropic(w http.ResponseWriter) {
	WriteAnthropicError(w, e.Status, e.Message, e.RetryAfter)
}

// WriteAnthropicError writes Anthropic's error shape with status.
func WriteAnthropicError(w http.ResponseWriter, status int, msg string, retryAfter int) {
	b, _ := json.Marshal(AnthropicError{Type: "error", Error: AnthropicErrorDetail{Type: AnthropicType(status), Message: msg}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// AgentUsage reads the usage object of either API: the Responses API's
// (input_tokens_details.cached_tokens) or Anthropic's
// (cache_read_input_tokens).
type AgentUsage struct {
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheReadInputTokens *int `json:"cache_read_input_tokens"`
}

// Usage is u as a chat usage; cached tokens are reported when u has them.
func (u *AgentUsage) Usage() *Usage {
	out := &Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.InputTokens + u.OutputTokens}
	switch {
	case u.InputTokensDetails != nil:
		out.PromptTokensDetails = &PromptTokensDetails{CachedTokens: u.InputTokensDetails.CachedTokens}
	case u.CacheReadInputTokens != nil:
		out.PromptTokensDetails = &PromptTokensDetails{CachedTokens: *u.CacheReadInputTokens}
	}
	return out
}

// AgentChunk is what one data event of a Responses or Messages stream
// says: whether it carries output text, its usage, and the response's id
// (response.created).
type AgentChunk struct {
	Content    bool
	Usage      *AgentUsage
	ResponseID string
}

var (
	textDeltaKeys = [][]byte{[]byte(`"type":"response.output_text.delta"`), []byte(`"type":"content_block_delta"`)}
	agentUsageKey = []byte(`"usage":{`)
	createdKey    = []byte(`"type":"response.created"`)
)

// agentEndKeys are the events that end a Responses or Messages stream's
// wait for its first token: the last ones, an error, or the final usage.
var agentEndKeys = [][]byte{[]byte(`"type":"response.completed"`), []byte(`"type":"response.incomplete"`),
	[]byte(`"type":"response.failed"`), []byte(`"type":"message_delta"`), []byte(`"type":"message_stop"`), []byte(`"type":"error"`)}

// AgentStarted reports whether the first bytes of a Responses or Messages
// stream hold its first text delta, or an event that ends the wait for
// one.
func AgentStarted(head []byte) bool {
	for _, keys := range [][][]byte{textDeltaKeys, agentEndKeys} {
		for _, k := range keys {
			if bytes.Contains(head, k) {
				return true
			}
		}
	}
	return false
}

// ReadAgentEvent reads one data event of a Responses or Messages stream.
// Text deltas, the stream's bulk, are recognised without a decode.
func ReadAgentEvent(data []byte) (AgentChunk, error) {
	var c AgentChunk
	for _, k := range textDeltaKeys {
		if bytes.Contains(data, k) {
			c.Content = true
			return c, nil
		}
	}
	created := bytes.Contains(data, createdKey)
	if !created && !bytes.Contains(data, agentUsageKey) {
		return c, nil
	}
	var ev struct {
		Type     string `json:"type"`
		Response *struct {
			ID    string      `json:"id"`
			Usage *AgentUsage `json:"usage"`
		} `json:"response"`
		Message *struct {
			Usage *AgentUsage `json:"usage"`
		} `json:"message"`
		Usage *AgentUsage `json:"usage"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return c, err
	}
	c.Usage = ev.Usage
	switch {
	case ev.Response != nil:
		if ev.Type == "response.created" {
			c.ResponseID = ev.Response.ID
		}
		c.Usage = ev.Response.Usage
	case ev.Message != nil:
		c.Usage = ev.Message.Usage
	}
	return c, nil
}

// Merge adds what u reports to what t holds of one stream: Anthropic's
// message_start reports the input, its message_delta the output.
func (u *AgentUsage) Merge(t *AgentUsage) {
	u.InputTokens = max(u.InputTokens, t.InputTokens)
	u.OutputTokens = max(u.OutputTokens, t.OutputTokens)
	if t.InputTokensDetails != nil {
		u.InputTokensDetails = t.InputTokensDetails
	}
	if t.CacheReadInputTokens != nil {
		u.CacheReadInputTokens = t.CacheReadInputTokens
	}
}
