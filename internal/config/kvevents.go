package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// KVEvents tunes precise prefix routing on the engines' KV cache events
// (vLLM's --kv-events-config, SGLang's equivalent). It takes effect for
// the backends whose entry sets kv_events; the others are routed on the
// approximate prefix index. See docs/routing.md.
type KVEvents struct {
	// Tokenizer is where a request's token ids come from: "backend" (POST
	// /tokenize, vLLM's request and response shapes, on a healthy backend
	// serving the request's model) or the base URL of a service answering
	// the same POST /tokenize. Default "backend".
	Tokenizer string `yaml:"tokenizer"`
	// TokenizeTimeout bounds one tokenize call; a request whose tokens do
	// not come in time is routed on the approximate index. Default 100ms.
	TokenizeTimeout time.Duration `yaml:"tokenize_timeout"`
	// TokenizeCache is how many prompts' token ids are kept, keyed by
	// model and prompt prefix. 0 disables the cache. Default 4096.
	TokenizeCache int `yaml:"tokenize_cache"`
	// TokenizeCacheBytes bounds the cache in bytes: 4 a token id, plus
	// the model's name and about a hundred bytes an entry. Only answers
	// for requests an engine accepted are kept. 0 disables the cache.
	// Default 64 MiB (4,096 prompts of 4,096 tokens).
	TokenizeCacheBytes ByteSize `yaml:"tokenize_cache_bytes"`
	// MinPromptTokens is the estimated prompt size (4 characters a token)
	// below which no tokenize call is made: such a prompt spans only a
	// few blocks and is routed approximately. Default 64 (four blocks).
	MinPromptTokens int `yaml:"min_prompt_tokens"`
	// BlockTokens is the engines' KV block size in tokens (vLLM's
	// --block-size); events of another size are skipped. Default 16.
	BlockTokens int `yaml:"block_tokens"`
	// SpeculativeTTL is how long a routed request's blocks count as held
	// by its backend before its events report them. Default 2s.
	SpeculativeTTL time.Duration `yaml:"speculative_ttl"`
	// StaleAfter is how long a backend may go without an event while
	// requests routed to it wait for theirs before it is routed
	// approximately. Default 10s.
	StaleAfter time.Duration `yaml:"stale_after"`
	// Retrust is how long a stream must flow after a gap that replay
	// could not fill (or after the router joined a running engine) before
	// its picture is trusted again. Default 30s.
	Retrust time.Duration `yaml:"retrust"`
	// MaxBlocksPerBackend bounds the blocks kept per backend; the least
	// recently stored are dropped first. Default 65536.
	MaxBlocksPerBackend int `yaml:"max_blocks_per_backend"`
	// MaxMessageBytes bounds one message on a KV event socket, its frames
	// together (libzmq's ZMQ_MAXMSGSIZE): a peer that declares more has
	// its connection closed before the router allocates it, as has one
	// that breaks ZMTP. Default 16MiB (a vLLM batch is about 10 bytes a
	// token of its engine step).
	MaxMessageBytes ByteSize `yaml:"max_message_bytes"`
}

// Defaults of the kv_events section.
const (
	DefaultTokenizer       = "backend"
	DefaultTokenizeTimeout = 100 * time.Millisecond
	DefaultTokenizeCache   = 4096
	// DefaultTokenizeCacheBytes is DefaultTokenizeCache answers of 4,096
	// tokens (4 bytes each).
	DefaultTokenizeCacheBytes = DefaultTokenizeCache * 4096 * 4
	DefaultMinPromptTokens    = 64
)

func defaultKVEvents() KVEvents {
	return KVEvents{
		Tokenizer:           DefaultTokenizer,
		TokenizeTimeout:     DefaultTokenizeTimeout,
		TokenizeCache:       DefaultTokenizeCache,
		TokenizeCacheBytes:  DefaultTokenizeCacheBytes,
		MinPromptTokens:     DefaultMinPromptTokens,
		BlockTokens:         prefix.DefaultBlockTokens,
		SpeculativeTTL:      prefix.DefaultSpeculativeTTL,
		StaleAfter:          prefix.DefaultStaleAfter,
		Retrust:             prefix.DefaultRetrust,
		MaxBlocksPerBackend: prefix.DefaultPreciseBlocks,
		MaxMessageBytes:     kvevents.DefaultMaxMessageBytes,
	}
}

// Precise returns the precise index's configuration.
func (k *KVEvents) Precise() prefix.PreciseConfig {
	return prefix.PreciseConfig{BlockTokens: k.BlockTokens, MaxBlocks: k.MaxBlocksPerBackend,
		SpeculativeTTL: k.SpeculativeTTL, StaleAfter: k.StaleAfter, Retrust: k.Retrust}
}

// validate checks the kv_events section.
func (k *KVEvents) validate(bad func(string, ...any)) {
	if k.Tokenizer != DefaultTokenizer {
		if _, err := ParseBackendURL(k.Tokenizer); err != nil {
			bad("kv_events.tokenizer: want \"backend\" or a tokenize service's base URL: %v", err)
		}
	}
	if k.TokenizeTimeout <= 0 {
		bad("kv_events.tokenize_timeout: %v must be positive", k.TokenizeTimeout)
	}
	if k.TokenizeCache < 0 {
		bad("kv_events.tokenize_cache: %d must not be negative", k.TokenizeCache)
	}
	if k.TokenizeCacheBytes < 0 {
		bad("kv_events.tokenize_cache_bytes: %d must not be negative", k.TokenizeCacheBytes)
	}
	if k.MinPromptTokens < 0 {
		bad("kv_events.min_prompt_tokens: %d must not be negative", k.MinPromptTokens)
	}
	if k.BlockTokens <= 0 || k.BlockTokens > 1024 {
		bad("kv_events.block_tokens: %d must be in 1..1024", k.BlockTokens)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"speculative_ttl", k.SpeculativeTTL}, {"stale_after", k.StaleAfter}, {"retrust", k.Retrust}} {
		if d.v <= 0 {
			bad("kv_events.%s: %v must be positive", d.key, d.v)
		}
	}
	if k.MaxBlocksPerBackend <= 0 {
		bad("kv_events.max_blocks_per_backend: %d must be positive", k.MaxBlocksPerBackend)
	}
	if k.MaxMessageBytes <= 0 || k.MaxMessageBytes > MaxKVMessageBytes {
		bad("kv_events.max_message_bytes: %d must be in 1..%d (1GiB)", k.MaxMessageBytes, MaxKVMessageBytes)
	}
}

// MaxKVMessageBytes is the largest kv_events.max_message_bytes: a message
// is held whole, and a bound above this bounds nothing.
const MaxKVMessageBytes = 1 << 30

// KVEndpoint returns the KV event endpoint of a backend at host (an
// address of a DNS pool, or a static entry's host) from the entry's
// kv_events: a tcp://host:port endpoint as is, a port alone on host, or a
// template with {host}. "" when the entry sets none.
func (e *Entry) KVEndpoint(host string) string {
	s := e.KVEvents
	switch {
	case s == "":
		return ""
	case strings.Contains(s, "{host}"):
		return strings.ReplaceAll(s, "{host}", bracketHost(host))
	case isPort(s):
		return "tcp://" + net.JoinHostPort(host, s)
	}
	return s
}

func bracketHost(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0 && n < 65536
}

// validateKVEvents checks backends[i]'s kv_events keys.
func (e *Entry) validateKVEvents(i int, bad func(string, ...any)) {
	if e.KVEvents == "" {
		if e.KVEventsBind || e.KVEventsReplay != "" {
			bad("backends[%d]: kv_events_bind and kv_events_replay need kv_events", i)
		}
		return
	}
	if err := checkEndpoint(e.KVEndpoint("h")); err != nil {
		bad("backends[%d].kv_events: %v (want tcp://host:port, a port, or a template such as tcp://{host}:5557)", i, err)
	}
	if e.KVEventsReplay != "" {
		if err := checkEndpoint(e.KVReplayEndpoint("h")); err != nil {
			bad("backends[%d].kv_events_replay: %v", i, err)
		}
	}
}

// KVReplayEndpoint is KVEndpoint for kv_events_replay.
func (e *Entry) KVReplayEndpoint(host string) string {
	c := *e
	c.KVEvents = e.KVEventsReplay
	return c.KVEndpoint(host)
}

// checkEndpoint accepts a ZMQ tcp endpoint with a host (or * to bind on
// every interface) and a port.
func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "tcp" {
		return fmt.Errorf("%q: scheme must be tcp", s)
	}
	if u.Hostname() == "" || !isPort(u.Port()) {
		return fmt.Errorf("%q: want tcp://host:port", s)
	}
	if u.Path != "" || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("%q: an endpoint takes no path, query or user", s)
	}
	return nil
}
