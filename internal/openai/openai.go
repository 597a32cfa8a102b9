// Package openai holds the OpenAI-compatible wire format that kvroute speaks:
// the error shape every client-visible error uses, and the response, chunk
// and usage objects that the emulated engine writes and the benchmark client
// reads. It owns no behaviour beyond encoding; it must not import any other
// kvroute package.
package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types, as the OpenAI API and vLLM name them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeAuthentication = "authentication_error"
)

// ErrorBody is the envelope of every error: {"error":{...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner error object.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// Error is a client-visible error with its HTTP status. Parsers return it so
// that the HTTP layer can write it without guessing the status.
type Error struct {
	Status  int
	Type    string
	Code    string
	Message string
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
	// Numeric writes the status as the code, as vLLM does, for an error
	// that stands for an engine's own answer.
	Numeric bool
}

func (e *Error) Error() string { return e.Message }

// Errorf-style constructors for the common cases.

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: code, Message: msg}
}

// Write encodes e as the OpenAI error shape with its status code.
func (e *Error) Write(w http.ResponseWriter) {
	if e.Numeric {
		writeError(w, e.Status, ErrorDetail{Message: e.Message, Type: e.Type, Code: e.Status}, e.RetryAfter)
		return
	}
	WriteError(w, e.Status, e.Type, e.Code, e.Message, e.RetryAfter)
}

// WriteError writes {"error":{"message","type","param","code"}} with status.
// code may be empty, in which case it is null.
func WriteError(w http.ResponseWriter, status int, typ, code, msg string, retryAfter int) {
	var c any
	if code != "" {
		c = code
	}
	writeError(w, status, ErrorDetail{Message: msg, Type: typ, Code: c}, retryAfter)
}

func writeError(w http.ResponseWriter, status int, d ErrorDetail, retryAfter int) {
	b := errorJSON(ErrorBody{Error: d})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// errorJSON is body's JSON and a newline, with <, > and & as they are: the
// body is application/json, never HTML, and a message quoting a client's
// "<model>" reads as it was written (encoding/json's default escapes them
// as \u003c, which is valid but unreadable in a terminal).
func errorJSON(body ErrorBody) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(body) // the fields are strings and nil: it cannot fail
	return buf.Bytes()
}

// Usage is the token accounting of a response. vLLM fills
// prompt_tokens_details.cached_tokens with prefix-cache hits.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails breaks prompt tokens down.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Message is one chat message in a response.
type Message struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// Choice is one choice of a chat completion, completion, or a streamed chunk
// of either (Delta for chat chunks, Text for completions).
type Choice struct {
	Index        int      `json:"index"`
	Message      *Message `json:"message,omitempty"`
	Delta        *Message `json:"delta,omitempty"`
	Text         *string  `json:"text,omitempty"`
	FinishReason *string  `json:"finish_reason"`
}

// Response is a chat.completion, text_completion, or a chunk of either.
type Response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
	// KVTransferParams is vLLM's kv_transfer_params of a prefill engine's
	// answer in a disaggregated fleet (what the decode engine needs to
	// pull the prompt's KV cache); absent otherwise.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	// Timings is llama.cpp's, on its last chunk or whole response.
	Timings *Timings `json:"timings,omitempty"`
}

// Timings is what the router reads of llama.cpp's timings object:
// prompt_n is the prompt tokens it computed, cache_n (newer servers) the
// ones it found in its prompt cache; prompt_n is -1 when not timed.
type Timings struct {
	PromptN *int `json:"prompt_n,omitempty"`
	CacheN  *int `json:"cache_n,omitempty"`
}

// ReportedCached is the prompt tokens an engine reported reusing from its
// prefix cache, from a response's usage and timings (either may be nil):
// usage.prompt_tokens_details.cached_tokens (vLLM with
// --enable-prompt-tokens-details, SGLang, llm-d's simulator), else
// llama.cpp's timings.cache_n, else its prompt tokens less timings.prompt_n
// (llama.cpp before cache_n). ok is false when the response reports none:
// an engine that does not say must never read as one that reused nothing.
func ReportedCached(u *Usage, t *Timings) (cached int, ok bool) {
	switch {
	case u != nil && u.PromptTokensDetails != nil:
		return max(u.PromptTokensDetails.CachedTokens, 0), true
	case t != nil && t.CacheN != nil && *t.CacheN >= 0:
		return *t.CacheN, true
	case t != nil && u != nil && t.PromptN != nil && *t.PromptN >= 0 && u.PromptTokens > 0:
		return max(u.PromptTokens-*t.PromptN, 0), true
	}
	return 0, false
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is vLLM's extension: the context length.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Chunk is what a router or client needs of one streamed chunk (the JSON
// of one SSE data event): whether it carries text, and its usage.
type Chunk struct {
	// Content is set when the chunk has a non-empty "text" or "content"
	// string: a chunk with tokens, not the role-only first chunk nor
	// the usage-only last one.
	Content bool
	// Usage is the chunk's usage object, nil without one; Timings its
	// llama.cpp timings, nil without.
	Usage   *Usage
	Timings *Timings
}

var (
	textKey    = []byte(`"text":"`)
	contentKey = []byte(`"content":"`)
	usageKey   = []byte(`"usage":{`)
	timingsKey = []byte(`"timings":{`)
)

// ReadChunk reads one chunk. Content chunks, the bulk of a stream, are
// recognised without decoding: thousands of streams at once make a full
// decode of every chunk the main cost of reading them. A chunk with a
// usage object is decoded; its error is that decode's.
func ReadChunk(data []byte) (Chunk, error) {
	var c Chunk
	c.Content = nonEmptyString(data, textKey) || nonEmptyString(data, contentKey)
	if bytes.Contains(data, usageKey) || bytes.Contains(data, timingsKey) {
		var r Response
		if err := json.Unmarshal(data, &r); err != nil {
			return c, err
		}
		c.Usage, c.Timings = r.Usage, r.Timings
	}
	return c, nil
}

// nonEmptyString reports whether data has key (`"name":"`) followed by a
// non-empty string.
func nonEmptyString(data, key []byte) bool {
	i := bytes.Index(data, key)
	return i >= 0 && i+len(key) < len(data) && data[i+len(key)] != '"'
}
