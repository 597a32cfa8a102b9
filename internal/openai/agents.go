package openai

import (
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
