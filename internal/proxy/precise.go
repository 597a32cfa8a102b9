package proxy

import (
	"context"
	"net/url"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// This file is the exchange's part of precise prefix routing: getting a
// request's token ids before it is routed, with the tokenizer
// (tokenize.Tokenizer, nil when no backend has a KV event stream). The
// index's streams and metrics are the control plane's (members.KVFollower).

// tokenized is a request's answer from the tokenizer, kept by its
// exchange until the engine's answer says whether to cache it.
type tokenized struct {
	key    tokenize.Key
	tokens []uint32
}

// rememberTokens caches the exchange's token ids once the engine has
// accepted its request (rememberTokens of Server).
func (ex *exchange) rememberTokens() { ex.s.rememberTokens(ex.tokenized, ex.Status) }

// rememberTokens caches t's token ids once the engine has accepted their
// request (status, a 2xx): a prompt the engine refused (too long, an
// unknown model) is never cached, so that refused requests cannot fill
// the cache.
func (s *Server) rememberTokens(t tokenized, status int) {
	if p := s.precise; p != nil && t.tokens != nil && status/100 == 2 {
		p.Remember(t.key, t.tokens)
	}
}

// tokenKeys returns the precise index's keys of v's prompt, or nil (the
// request is then routed approximately): without a precise index, for a
// prompt under kv_events.min_prompt_tokens, or when the tokenizer fails in
// any way. It is called before routing, never inside the pick. The token
// ids are kept in ex.tokenized for rememberTokens.
func (ex *exchange) tokenKeys(ctx context.Context, v *request.View, body []byte) []uint64 {
	keys, t := ex.s.tokenKeys(ctx, v, body)
	ex.tokenized = t
	return keys
}

// tokenKeys is every front's tokenKeys: the keys, and the token ids behind
// them for rememberTokens (none when the keys are nil).
func (s *Server) tokenKeys(ctx context.Context, v *request.View, body []byte) ([]uint64, tokenized) {
	p := s.precise
	if p == nil || v == nil || v.PromptTokens < p.MinTokens {
		return nil, tokenized{}
	}
	base := p.Service
	if base == nil {
		base = s.tokenizerBackend(v)
		if base == nil {
			p.Failed(tokenize.FailNoBackend)
			return nil, tokenized{}
		}
	}
	key := tokenize.Key{Model: v.Model, Prompt: xxhash.Sum64String(v.Prompt)}
	toks, ok := p.Cached(key)
	if !ok {
		var err error
		if toks, err = p.Ask(ctx, base, key, v.Model, body); err != nil {
			s.log.Debug("tokenize failed: routing approximately", "err", err)
			return nil, tokenized{}
		}
	}
	// The chain is salted as the engine salts it: the LoRA adapter, then
	// the request's cache_salt (and its tenant's, with isolate_prefix) on
	// the first block, as the engines' events' extra keys carry it.
	return s.sched.TokenKeys(toks, prefix.JoinSalt(s.sched.Precise().Salt(v.Model), v.PrefixSalt)), tokenized{key, toks}
}

// tokenizerBackend picks the healthy backend serving v's model to ask for
// its tokens: one with a KV event stream (an engine that publishes events
// is one whose tokenizer the index's keys follow) if any, spread over them
// by the prompt's hash.
func (s *Server) tokenizerBackend(v *request.View) *url.URL {
	snap := s.fleet.Snapshot()
	var fallback, pick *fleet.Backend
	n := 0
	h := xxhash.Sum64String(v.Model)
	for _, b := range snap.Healthy {
		if !b.Serves(v.Model) || b.URL == nil {
			continue
		}
		if fallback == nil {
			fallback = b
		}
		if m := s.set.Of(b); m != nil && m.Entry.KVEvents != "" {
			n++
			if h%uint64(n) == 0 { // reservoir: each with probability 1/n
				pick = b
			}
			h = prefix.Mix64(h)
		}
	}
	if pick == nil {
		pick = fallback
	}
	if pick == nil {
		return nil
	}
	return pick.URL
}
