package members

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// The hash-parity check of a backend whose KV event stream begins (at
// startup, and after each restart of its engine): once its stream's first
// batch arrives, the follower sends the engine one known prompt
// (prefix.ParityPrompt with a fresh nonce), tokenized through its
// /tokenize as the router tokenizes requests, with max_tokens 1, and
// compares the router's keys of those tokens with the blocks the engine's
// next events report storing (prefix.CheckParity). The verdict is
// kvroute_kv_hash_parity{backend} (1 match, 0 mismatch) and, on a
// mismatch, an error in the log naming the likely cause.

// parityTimeout bounds the check's two calls to the engine.
const parityTimeout = 30 * time.Second

// maxParityEvents bounds the BlockStored events a check keeps while it
// waits for its prompt's blocks; maxParityBatches how many batches it
// waits for them before it gives up.
const (
	maxParityEvents  = 256
	maxParityBatches = 1000
)

// parityNonce makes each check's prompt new to the engine's cache.
var parityNonce atomic.Uint64

// parity is one stream's check, owned by its handler (the subscriber's
// goroutine) but for tokens, set by the goroutine that sends the prompt.
type parity struct {
	tokens  atomic.Pointer[[]uint32]
	events  []kvevents.Event
	batches int
	done    bool
}

// startParity sends the check's prompt to the backend of h on a goroutine
// of its own; the handler's next batches are compared once its tokens are
// known.
func (k *KVFollower) startParity(ctx context.Context, h *streamHandler, m *Member) {
	if m.B.URL == nil {
		return
	}
	p := &parity{}
	h.parity = p
	go func() {
		if err := k.sendParity(ctx, m, p); err != nil {
			k.log.Warn("kv events: hash parity check not sent", "backend", m.B.Name, "err", err)
		}
	}()
}

// sendParity tokenizes the check's prompt, hands the router's tokens of
// it to p (before the prompt is sent: its events may come before its
// answer), and sends it.
func (k *KVFollower) sendParity(ctx context.Context, m *Member, p *parity) error {
	ctx, cancel := context.WithTimeout(ctx, parityTimeout)
	defer cancel()
	model := ""
	if len(m.B.Models) > 0 {
		model = m.B.Models[0]
	}
	prompt := prefix.ParityPrompt(strconv.FormatUint(parityNonce.Add(1), 36) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	quoted, _ := json.Marshal(prompt)
	tc, err := tokenize.New(tokenize.Config{Timeout: parityTimeout})
	if err != nil {
		return err
	}
	toks, err := tc.Tokens(ctx, m.B.URL, tokenize.Key{}, &tokenize.Request{Model: model, Prompt: quoted})
	if err != nil {
		return err
	}
	p.tokens.Store(&toks)
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.B.URL.JoinPath("v1", "completions").String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("parity prompt: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("parity prompt: status %d", resp.StatusCode)
	}
	return nil
}

// observe adds a batch's events to h's check and judges it once the
// prompt's blocks are seen.
func (k *KVFollower) observe(h *streamHandler, events []kvevents.Event) {
	p := h.parity
	if p == nil || p.done {
		return
	}
	toks := p.tokens.Load()
	if toks == nil {
		// Not sent yet: these events cannot be the prompt's.
		return
	}
	for i := range events {
		if events[i].Kind == kvevents.BlockStored && !events[i].HasParent && len(p.events) < maxParityEvents {
			p.events = append(p.events, events[i])
		}
	}
	p.batches++
	v, decided := prefix.CheckParity(*toks, k.ix.BlockTokens(), k.ix.Salt(modelOf(h)), p.events)
	switch {
	case decided:
		p.done, p.events = true, nil
		if v.OK() {
			k.m.parity.WithLabelValues(h.name).Set(1)
			k.log.Info("kv events: hash parity check passed", "backend", h.name, "detail", v.Detail)
			return
		}
		k.m.parity.WithLabelValues(h.name).Set(0)
		k.log.Error("kv events: the router's block keys do not match the engine's; its precise matches will be wrong until fixed",
			"backend", h.name, "cause", v.Cause, "detail", v.Detail)
	case p.batches >= maxParityBatches:
		p.done, p.events = true, nil
		k.log.Warn("kv events: hash parity check saw no block of its prompt (is prefix caching on?)", "backend", h.name)
	}
}

// modelOf is the model h's backend serves first, "" for none.
func modelOf(h *streamHandler) string {
	if len(h.models) > 0 {
		return h.models[0]
	}
	return ""
}
