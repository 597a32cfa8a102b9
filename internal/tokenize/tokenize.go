// Package tokenize is the router's client of the engines' POST /tokenize
// (vLLM's request and response shapes, which kvroute engine serves too): a
// request's token ids as the engine will see them, chat template applied,
// for precise prefix routing. Each call is bounded by a timeout, and
// answers are cached per model and rendered prompt.
//
// It decides nothing: a failure of any kind is an error to the caller,
// who then routes the request approximately. The exchange calls it before
// routing, never inside the pick.
package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// maxResponseBytes bounds a /tokenize answer: 1M tokens of up to 10 digits.
const maxResponseBytes = 12 << 20

// Config tunes a Client.
type Config struct {
	// Timeout bounds one call; required.
	Timeout time.Duration
	// CacheEntries is how many answers are kept (0: none).
	CacheEntries int
	// Transport carries the calls; nil: http.DefaultTransport.
	Transport http.RoundTripper
}

// Client calls /tokenize.
type Client struct {
	hc      *http.Client
	timeout time.Duration
	cache   *lru.Cache[Key, []uint32] // nil without a cache
}

// Key names one prompt in the cache: its model and a hash of its rendered
// prompt (the caller's, e.g. xxhash).
type Key struct {
	Model  string
	Prompt uint64
}

// New returns a client.
func New(cfg Config) (*Client, error) {
	if cfg.Timeout <= 0 {
		return nil, errors.New("tokenize: timeout must be positive")
	}
	c := &Client{hc: &http.Client{Transport: cfg.Transport}, timeout: cfg.Timeout}
	if cfg.CacheEntries > 0 {
		var err error
		if c.cache, err = lru.New[Key, []uint32](cfg.CacheEntries); err != nil {
			return nil, fmt.Errorf("tokenize: %w", err)
		}
	}
	return c, nil
}

// Request is the body of one /tokenize call: vLLM's chat form (model,
// messages, tools) or its completion form (model, prompt), the client's
// own JSON passed through.
type Request struct {
	Model    string          `json:"model"`
	Messages json.RawMessage `json:"messages,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	Prompt   json.RawMessage `json:"prompt,omitempty"`
}

// RequestOf extracts the /tokenize request from a chat or completion body
// that request.Parse has already accepted. Its members are read as the
// engine and request.Parse read them (into a map: keys matched byte for
// byte, the last of a repeated key winning), not into a struct, whose
// fields encoding/json would match case-insensitively: "MESSAGES" is not
// the messages.
func RequestOf(model string, body []byte) (*Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	r := &Request{Model: model, Messages: top["messages"], Tools: top["tools"], Prompt: top["prompt"]}
	if len(r.Messages) == 0 && len(r.Prompt) == 0 {
		return nil, errors.New("tokenize: neither messages nor prompt")
	}
	return r, nil
}

// Tokens returns req's token ids from the /tokenize of base (a backend's
// or a tokenize service's base URL), from the cache when key was answered
// before. The returned slice is shared with the cache: never modify it.
func (c *Client) Tokens(ctx context.Context, base *url.URL, key Key, req *Request) ([]uint32, error) {
	if c.cache != nil {
		if t, ok := c.cache.Get(key); ok {
			return t, nil
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, base.JoinPath("tokenize").String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base.Host, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base.Host, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize %s: status %d", base.Host, resp.StatusCode)
	}
	if len(b) > maxResponseBytes {
		return nil, fmt.Errorf("tokenize %s: answer over %d bytes", base.Host, maxResponseBytes)
	}
	t, err := ParseResponse(b)
	if err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base.Host, err)
	}
	if c.cache != nil {
		c.cache.Add(key, t)
	}
	return t, nil
}

// ParseResponse decodes vLLM's /tokenize answer, {"count": N,
// "max_model_len": M, "tokens": [ids...]} (other fields ignored): the ids,
// each a non-negative 32-bit integer, count equal to their number when
// present.
func ParseResponse(b []byte) ([]uint32, error) {
	var r struct {
		Count  *int     `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bad /tokenize answer: %w", err)
	}
	if r.Tokens == nil {
		return nil, errors.New("bad /tokenize answer: no tokens")
	}
	if r.Count != nil && *r.Count != len(r.Tokens) {
		return nil, fmt.Errorf("bad /tokenize answer: count %d for %d tokens", *r.Count, len(r.Tokens))
	}
	return r.Tokens, nil
}
