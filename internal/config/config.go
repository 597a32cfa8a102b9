// Package config is the configuration of `kvroute serve`: the YAML file
// format (decoded strictly, so that a misspelt key is an error that names it
// rather than a silently ignored setting), the defaults, the command-line
// overrides, and validation.
//
// Defaults are set in one place (Default) and checked in another (Validate).
// The package does no network I/O and knows nothing of HTTP serving; it only
// describes what the proxy should do.
//
// The struct comments below are the user documentation of every key; keep
// docs/configuration.md in step with them.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Config is the whole configuration file.
type Config struct {
	// Listen is the address the router listens on. Default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// ListenTLS serves listen (and admin.listen) over TLS (tls.go).
	ListenTLS ListenTLS `yaml:"listen_tls"`
	// Policy names the routing policy (see `kvroute serve -h` for the list).
	// Default "kvroute".
	Policy string `yaml:"policy"`
	// PolicyOptions tune the policies.
	PolicyOptions PolicyOptions `yaml:"policy_options"`
	// Backends are the inference servers. At least one is required, from
	// the file or from --backend flags (which replace the file's list).
	Backends []Backend `yaml:"backends"`
	// Session says where a request's conversation key comes from.
	Session Session `yaml:"session"`
	// Limits bound what a client may send.
	Limits Limits `yaml:"limits"`
	// Prefix tunes the router's prefix-cache index.
	Prefix Prefix `yaml:"prefix"`
	// Health tunes active health checks and passive ejection.
	Health Health `yaml:"health"`
	// Retry tunes retries before the first response byte.
	Retry Retry `yaml:"retry"`
	// Admission queues requests while every backend is saturated.
	Admission Admission `yaml:"admission"`
	// Admin tunes the admin API under /admin/ (off without a token).
	Admin Admin `yaml:"admin"`
	// Auth is the router's own API key check (off by default).
	Auth Auth `yaml:"auth"`
	// Upstream tunes connections to the backends.
	Upstream Upstream `yaml:"upstream"`
	// Engines tunes the reading of the engines' own load from their metrics.
	Engines Engines `yaml:"engines"`
	// Fleet tunes DNS discovery, reloads and the warm-up of new backends.
	Fleet Fleet `yaml:"fleet"`
	// Log tunes the router's own log.
	Log Log `yaml:"log"`
	// Tracing is OpenTelemetry tracing (tracing.go).
	Tracing Tracing `yaml:"tracing"`
	// Passthrough says which other /v1/ endpoints are forwarded
	// (passthrough.go).
	Passthrough Passthrough `yaml:"passthrough"`
	// KVEvents tunes precise prefix routing on the engines' KV cache
	// events (kvevents.go).
	KVEvents KVEvents `yaml:"kv_events"`
	// Sync shares routing state with other replicas over NATS (sync.go).
	Sync Sync `yaml:"sync"`
	// Disaggregation is how requests are split over prefill and decode
	// engines (disagg.go).
	Disaggregation Disaggregation `yaml:"disaggregation"`
	// Objectives are the default latency objectives and criticalities
	// (objectives.go).
	Objectives Objectives `yaml:"objectives"`
	// EPP serves the router as a gateway's Endpoint Picker (epp.go).
	EPP EPP `yaml:"epp"`
	// ShutdownGrace is how long, on SIGTERM or SIGINT, the router lets
	// in-flight requests (streams included) finish after it stops accepting
	// new connections, before it closes them. Default 30s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// Migration moves a stream whose engine fails mid-answer to another
	// engine (migration.go).
	Migration Migration `yaml:"migration"`
}

// PolicyOptions tune the routing policies; see docs/routing.md.
type PolicyOptions struct {
	// LoadFactor bounds a backend's load relative to the fleet mean for
	// consistent hashing with bounded loads (policies session-hash and
	// kubeai-chwbl). 0 means the default, 1.25.
	LoadFactor float64 `yaml:"load_factor"`
	// Seed seeds the policies' random choices. Default 0.
	Seed int64 `yaml:"seed"`
	// ProbeInterval is how long an engine that a policy routing by
	// estimates (kvroute) avoids must go without requests, its estimate
	// unrefreshed, before the next short request probes it, and the least
	// time between two probes of one engine (docs/routing.md, "Probes").
	// Default 5s; 0 turns probes off.
	ProbeInterval time.Duration `yaml:"probe_interval"`
}

// Probes is ProbeInterval as scheduler.Config.ProbeInterval takes it
// (negative: off).
func (o PolicyOptions) Probes() time.Duration {
	if o.ProbeInterval == 0 {
		return -1
	}
	return o.ProbeInterval
}

// Backend is one inference server.
type Backend struct {
	// URL is the server's base URL, http or https with a host, e.g.
	// "http://10.0.0.5:8000". Requests keep their path: /v1/chat/completions
	// goes to URL + "/v1/chat/completions". Required.
	URL string `yaml:"url"`
	// Name labels the backend in metrics, logs and the X-Kvroute-Backend
	// header. Default: the URL's host:port.
	Name string `yaml:"name"`
	// Models the backend serves. Empty means: ask the backend's /v1/models
	// at startup (when discover_models is on), and serve any model if that
	// fails.
	Models []string `yaml:"models"`
	// Discovery is static (the URL is one backend), dns (the URL's host
	// is re-resolved every dns_interval and each A/AAAA address is a
	// backend on the URL's port, e.g. a Kubernetes headless service) or
	// kubernetes (the endpoints that kubernetes names, followed through
	// the Kubernetes API). Default static.
	Discovery string `yaml:"discovery"`
	// SRV, with discovery dns, names an SRV record whose targets and
	// ports are the backends (e.g. _http._tcp.vllm.ns.svc.cluster.local);
	// url is then optional and only its scheme and path are used. Setting
	// it implies discovery: dns. Default "".
	SRV string `yaml:"srv"`
	// DNSInterval overrides fleet.dns_interval for this entry. Default 0
	// (use fleet.dns_interval).
	DNSInterval time.Duration `yaml:"dns_interval"`
	// Kubernetes, with discovery kubernetes, says what to watch in the
	// Kubernetes API: a Service's EndpointSlices, pods by label, or an
	// InferencePool (kubernetes.go). url is then optional and only its
	// scheme and path are used. Setting it implies discovery: kubernetes.
	// Default: none.
	Kubernetes *Kubernetes `yaml:"kubernetes"`
	// Kind is the engine behind the URL, which says how to read its
	// metrics: vllm, sglang, llamacpp, tgi, or auto (detect it from what
	// its /metrics exposes, or a llama.cpp server's /slots). Default auto.
	Kind string `yaml:"kind"`
	// MaxModelLen is the backend's context length in tokens, for
	// limits.reject_over_context. Default 0: what its /v1/models says
	// (vLLM's max_model_len), else unknown.
	MaxModelLen int `yaml:"max_model_len"`
	// MaxNumSeqs is the engine's cap on running sequences (vLLM's
	// --max-num-seqs, SGLang's --max-running-requests), which the kvroute
	// policy uses to cost the wait for a slot. Default 0: what the engine
	// reports (llama.cpp's /slots), else learned from its metrics (the
	// running count it holds while requests wait; docs/routing.md).
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxNumBatchedTokens is the engine's token budget per step (vLLM's
	// --max-num-batched-tokens, SGLang's --chunked-prefill-size), which
	// the kvroute policy uses as the prefill chunk. Default 0: unknown
	// (8,192 assumed).
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`
	// Preset names the engine preset (engine.Presets: hardware and model)
	// whose coefficients the backend's cost model starts from, a prior
	// its first observations overrule, with its KV transfer time per
	// token. Default "": the generic prior.
	Preset string `yaml:"preset"`
	// CPUKVBlocks is the engine's CPU tier in blocks of 16 tokens (vLLM's
	// OffloadingConnector num_cpu_blocks; SGLang's host pool over its page
	// size): the blocks it offloads from its GPU and loads back rather
	// than recomputes. The approximate index keeps the blocks it evicts
	// for the GPU's capacity in a tier of that size (less the GPU's, which
	// the engine's CPU tier holds too); with kv_events the tier is seen
	// from the events whatever this says. Default 0 (none known).
	CPUKVBlocks int `yaml:"cpu_kv_blocks"`
	// CPULoadTimePerToken and DiskLoadTimePerToken are the time to load
	// one token's KV cache into the GPU from the engine's CPU tier and
	// from its disk tier: the price of a hit there. Default 0: the
	// preset's (its PCIe link), else what the engine reports, else
	// 5.12 µs and 32.8 µs (Llama-3.1-8B's 128 KiB a token over PCIe 4.0
	// x16 at 80%, and a 4 GB/s drive).
	CPULoadTimePerToken  time.Duration `yaml:"cpu_load_time_per_token"`
	DiskLoadTimePerToken time.Duration `yaml:"disk_load_time_per_token"`
	// KVEvents is the backend's KV cache event endpoint (vLLM's
	// kv-events-config endpoint), tcp://host:port; for a dns entry, a
	// port ("5557") on each discovered address, or a template such as
	// tcp://{host}:5557. The router subscribes to it and routes this
	// backend on what its events say. Default "" (approximate routing).
	KVEvents string `yaml:"kv_events"`
	// KVEventsBind makes the router bind kv_events (e.g. tcp://*:5557)
	// for an engine that connects out to it, instead of connecting.
	// Default false.
	KVEventsBind bool `yaml:"kv_events_bind"`
	// KVEventsReplay is the engine's replay endpoint (vLLM's
	// replay_endpoint), in kv_events' forms: a gap in the stream is then
	// filled from it rather than dropping the backend's precise entries.
	// Default "".
	KVEventsReplay string `yaml:"kv_events_replay"`
	// TLS is how the router connects to this entry's https URL (CA,
	// client certificate for mutual TLS, server name; tls.go). Default:
	// upstream.tls.
	TLS *BackendTLS `yaml:"tls"`
	// Role is the part of a disaggregated request the engine serves:
	// prefill, decode or both (whole requests, and decode legs). For a
	// DNS entry, every discovered address has it. Default both.
	Role string `yaml:"role"`
}

// Session says where the session (conversation) key comes from.
type Session struct {
	// Header is the request header carrying the session key; it wins over
	// BodyField. Default "X-Session-ID". Empty disables it.
	Header string `yaml:"header"`
	// BodyField is a top-level request body field (e.g. "user") whose value
	// is the session key when the header is absent. Default "" (off).
	BodyField string `yaml:"body_field"`
	// Headers are more request headers carrying the session key, read
	// in order after Header and before BodyField: the agents' session
	// headers (Claude Code's, Codex's, OpenCode's) by default
	// (DefaultSessionHeaders). Empty disables them.
	Headers []string `yaml:"headers"`
	// ResponseTTL and MaxResponses bound the router's table of stored
	// responses (which engine holds each Responses API response): an
	// entry is forgotten after ResponseTTL, the oldest first beyond
	// MaxResponses (-1: none, continuations routed as any request).
	// Defaults 6h and 131,072. Read at startup.
	ResponseTTL  time.Duration `yaml:"response_ttl"`
	MaxResponses int           `yaml:"max_responses"`
}

// DefaultSessionHeaders are the agents' session headers: Claude Code's,
// Codex's and OpenCode's.
var DefaultSessionHeaders = []string{"x-claude-code-session-id", "session-id", "x-session-affinity"}

// Limits bound what a client may send.
type Limits struct {
	// MaxBodyBytes is the largest request body accepted; larger bodies get
	// 413. A number of bytes or a size such as "32MiB". Default 32MiB.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes"`
	// MaxHeaderBytes bounds the request line and headers; the HTTP server
	// answers larger ones with 431. Default 64KiB (Envoy allows 60KiB,
	// nginx 32KiB in its large buffers).
	MaxHeaderBytes ByteSize `yaml:"max_header_bytes"`
	// MaxMessages is the largest number of chat messages accepted; more
	// get 400. Default 100000.
	MaxMessages int `yaml:"max_messages"`
	// ReadHeaderTimeout bounds the time a client takes to send the request
	// line and headers; a slower client's connection is closed. Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// BodyTimeout bounds the time a client takes to send the request body,
	// counted from the end of the headers; a slower client gets 408 and no
	// backend sees its request (the body is read in full before routing).
	// Default 60s.
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// RejectOverContext answers 400 (in vLLM's context-length wording)
	// when a request's estimated prompt tokens exceed the largest context
	// (max_model_len) among the backends serving its model, as their
	// /v1/models or backends[].max_model_len say; a backend whose context
	// is unknown lifts the limit. Default true.
	RejectOverContext bool `yaml:"reject_over_context"`
	// ClientWriteTimeout bounds each write of a response to the client: a
	// client that stops reading (its socket buffers full) for this long is
	// cut off, which ends the upstream request and frees its backend slot
	// and admission place. Default 60s (nginx's send_timeout). 0 means no
	// limit.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	// AuthFailuresPerMinute bounds how often one client address (an IPv4
	// address, or an IPv6 /64) may fail the API key or admin token check:
	// a token bucket of this many failures, refilled at this many a
	// minute. A client whose bucket is empty gets 429 with Retry-After
	// for every request that needs a key or token, right or wrong, until
	// it refills. Default 30. 0 turns the limit off.
	AuthFailuresPerMinute int `yaml:"auth_failures_per_minute"`
	// MaxBytesPerToken is the most bytes of text that one token of the
	// backends' vocabularies stands for: reject_over_context refuses a
	// prompt only when its bytes over this bound (a lower bound of its
	// tokens; token ids count exactly), plus max_tokens, exceed the
	// context. Averages are 1-5 bytes a token; the longest tokens of
	// common vocabularies are well within the default. Default 128.
	MaxBytesPerToken int `yaml:"max_bytes_per_token"`
	// MaxBufferedBytes bounds the request bodies the router holds in
	// memory at once, all requests together (each body is read whole
	// before routing and kept until its request ends, streams included,
	// for retries). A request whose body would go over it gets 503
	// server_busy with Retry-After: 1, before its body is read, so that
	// many large bodies cannot exhaust memory: the router's memory for
	// bodies is at most about 3x this (the body, its decoded prompt, the
	// parser's scratch). Default 0: 8 x max_body_bytes (256MiB with the
	// default 32MiB).
	MaxBufferedBytes ByteSize `yaml:"max_buffered_bytes"`
	// MaxBufferedBytesPerClient bounds the part of max_buffered_bytes that
	// one client's bodies still arriving may hold (a client is its API
	// key when keys are configured, else its IPv4 address or IPv6 /64):
	// a request that would go over it gets 429. A body that has fully
	// arrived no longer counts against its client. Default 0: a quarter
	// of max_buffered_bytes, at least max_body_bytes.
	MaxBufferedBytesPerClient ByteSize `yaml:"max_buffered_bytes_per_client"`
	// MinBodyRate is the slowest a client may send its body, in bytes a
	// second averaged from the end of its headers, once body_rate_grace
	// has passed (Kestrel's MinRequestBodyDataRate); a slower client gets
	// 408 and the connection is closed. Default 1KiB. 0 turns it off
	// (body_timeout still bounds the whole body).
	MinBodyRate ByteSize `yaml:"min_body_rate"`
	// BodyRateGrace is the time a body may take before min_body_rate
	// applies. Default 5s.
	BodyRateGrace time.Duration `yaml:"body_rate_grace"`
	// MaxConnections bounds the client connections open at once on
	// listen. When it is reached the router stops accepting (new
	// connections wait in the kernel's backlog) and closes its oldest
	// idle keep-alive connection to make room. Default 0: half the
	// process's file descriptor limit (RLIMIT_NOFILE), leaving the other
	// half for connections to the backends, at least 64.
	MaxConnections int `yaml:"max_connections"`
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before the router closes it. Default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
}

// Prefix tunes the prefix-cache index.
type Prefix struct {
	// BlockChars is the size of a prefix block in characters of rendered
	// prompt (about 4 characters per token). Default 64.
	BlockChars int `yaml:"block_chars"`
	// CapacityBlocks is each backend's capacity in blocks: the index
	// forgets a backend's least recently used blocks beyond it. Default
	// 100000 (about 6.4M characters, 1.6M tokens).
	CapacityBlocks int `yaml:"capacity_blocks"`
}

// Health tunes health checking.
type Health struct {
	// Interval between active checks of each backend. Default 5s.
	Interval time.Duration `yaml:"interval"`
	// Timeout of one active check. Default 2s.
	Timeout time.Duration `yaml:"timeout"`
	// Path of the active check (GET; 200 means healthy). Default "/health"
	// (vLLM, SGLang, llama.cpp and TGI all serve it). Empty disables active
	// checks; the circuit breaker then probes with requests alone.
	Path string `yaml:"path"`
	// EjectAfter is the number of consecutive failures (connection errors,
	// timeouts and 5xx responses of proxied requests, failed active
	// checks) that open a backend's circuit breaker: it receives no
	// requests for cooldown, then goes half-open. Default 3.
	EjectAfter int `yaml:"eject_after"`
	// Cooldown is how long an open breaker keeps its backend out before
	// going half-open. Each failed probe doubles it, up to max_cooldown;
	// a successful probe resets it. Default 2s.
	Cooldown time.Duration `yaml:"cooldown"`
	// MaxCooldown caps the doubled cool-down. Default 30s.
	MaxCooldown time.Duration `yaml:"max_cooldown"`
	// HalfOpenProbes is how many requests a half-open breaker lets
	// through per cool-down when active checks are off; with them on,
	// the next active check is the probe. The first success closes the
	// breaker, the first failure opens it again. Default 1.
	HalfOpenProbes int `yaml:"half_open_probes"`
}

// Retry tunes retries.
type Retry struct {
	// Attempts is how many times a request is re-routed to another backend
	// when its backend fails (connection error, 5xx, or a broken response)
	// before the first response byte reached the client. After the first
	// byte a request is never retried. 0 disables retries. Default 2.
	Attempts int `yaml:"attempts"`
}

// Upstream tunes connections to the backends.
type Upstream struct {
	// ConnectTimeout bounds establishing a connection. Default 5s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ResponseHeaderTimeout bounds the wait for a backend's response
	// headers after the request was sent, and then again the wait for the
	// first body byte (vLLM sends a stream's headers before its prefill).
	// A backend that exceeds it is a failure: the request is retried
	// elsewhere, or gets 504. A non-streaming request sends its headers
	// only when the whole completion is done, so keep it above the
	// longest completion. 0 means no limit. Default 10m.
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout"`
	// FirstTokenTimeout bounds, for a streaming request, the wait from
	// sending it to the first body byte (headers and prefill together),
	// in place of response_header_timeout when shorter. A backend that
	// exceeds it is a failure: the request is retried elsewhere, or gets
	// 504, and the backend's breaker counts it, so that an engine that
	// hangs every completion while its /health answers is ejected. Keep
	// it above the longest queueing plus prefill a healthy engine takes.
	// 0 means response_header_timeout alone. Default 2m.
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// StreamIdleTimeout bounds the silence of a backend after the first
	// body byte: a response whose backend sends nothing for this long is
	// ended (an event stream with an error event in the OpenAI shape) and
	// counts as a failure of the backend. 0 means no limit. Default 5m,
	// as Envoy's stream idle timeout.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// ModelsCacheTTL is how long the router keeps its GET /v1/models
	// answer (the union of the healthy backends' lists) before asking the
	// backends again; a change in the set of healthy backends also asks
	// again. 0 asks on every request. Default 5s.
	ModelsCacheTTL time.Duration `yaml:"models_cache_ttl"`
	// DiscoverModels asks each backend without a configured models list
	// for its /v1/models at startup, so that requests for a model no
	// backend serves get 404. Turn it off for servers that accept any
	// model name whatever their /v1/models says. Default true.
	DiscoverModels bool `yaml:"discover_models"`
	// TLS is how the router connects to every https backend whose entry
	// sets no tls of its own (tls.go). Default: Go's (the system's roots,
	// no client certificate).
	TLS *BackendTLS `yaml:"tls"`
}

// Engines tunes the scraping of each backend's /metrics (and llama.cpp's
// /slots), whose queue, batch and KV cache figures the policies combine
// with the router's own accounting.
type Engines struct {
	// Enabled turns scraping on. Turn it off for servers that expose no
	// engine metrics. Default true.
	Enabled bool `yaml:"enabled"`
	// Interval between two scrapes of one backend. It must be below 3s,
	// the age beyond which the kvroute policy ignores a report. Default
	// 250ms.
	Interval time.Duration `yaml:"interval"`
	// Timeout of one scrape. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// StaleAfter is how many intervals a backend's last report is still
	// used while its scrapes fail; after that the policies fall back to
	// the router's own accounting for it. Default 4.
	StaleAfter int `yaml:"stale_after"`
}

// Log tunes the router's log.
type Log struct {
	// Level is debug, info, warn or error. Default info. Prompts and
	// Authorization headers are never logged.
	Level string `yaml:"level"`
	// Format is text or json. Default text.
	Format string `yaml:"format"`
	// Access writes one line per request at info (the access log: every
	// outcome, refusals included); false leaves it out. Default true.
	Access bool `yaml:"access"`
}

// Defaults, named so that docs and tests can refer to them.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultSessionHeader  = "X-Session-ID"
	DefaultMaxBodyBytes   = 32 << 20
	DefaultHealthInterval = 5 * time.Second
	DefaultHealthTimeout  = 2 * time.Second
	DefaultHealthPath     = "/health"
	DefaultEjectAfter     = 3
	DefaultCooldown       = 2 * time.Second
	DefaultMaxCooldown    = 30 * time.Second
	DefaultHalfOpenProbes = 1
	DefaultRetryAttempts  = 2
	DefaultConnectTimeout = 5 * time.Second
	DefaultHeaderTimeout  = 10 * time.Minute
	DefaultFirstToken     = 2 * time.Minute
	DefaultStreamIdle     = 5 * time.Minute
	DefaultModelsTTL      = 5 * time.Second
	DefaultShutdownGrace  = 30 * time.Second
	DefaultEngineInterval = 250 * time.Millisecond
	DefaultEngineTimeout  = time.Second
	DefaultEngineStale    = 4
)

// Default returns the configuration with every default set and no
// backends. Load decodes the file over it, so a key the file leaves out
// keeps its default; this is the one place where defaults are set.
func Default() *Config {
	return &Config{
		Listen:        DefaultListen,
		Policy:        policy.Default,
		PolicyOptions: PolicyOptions{ProbeInterval: scheduler.DefaultProbeInterval},
		Session: Session{Header: DefaultSessionHeader, Headers: slices.Clone(DefaultSessionHeaders),
			ResponseTTL: scheduler.DefaultResponseTTL, MaxResponses: scheduler.DefaultMaxResponses},
		Limits: defaultLimits(),
		Prefix: Prefix{BlockChars: prefix.DefaultBlockChars, CapacityBlocks: prefix.DefaultCapacity},
		Health: Health{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout, Path: DefaultHealthPath, EjectAfter: DefaultEjectAfter,
			Cooldown: DefaultCooldown, MaxCooldown: DefaultMaxCooldown, HalfOpenProbes: DefaultHalfOpenProbes},
		Retry:          Retry{Attempts: DefaultRetryAttempts},
		Disaggregation: defaultDisaggregation(),
		Admission:      defaultAdmission(),
		Admin:          defaultAdmin(),
		Auth:           defaultAuth(),
		Upstream: Upstream{ConnectTimeout: DefaultConnectTimeout, ResponseHeaderTimeout: DefaultHeaderTimeout,
			FirstTokenTimeout: DefaultFirstToken, StreamIdleTimeout: DefaultStreamIdle, ModelsCacheTTL: DefaultModelsTTL, DiscoverModels: true},
		Engines:       Engines{Enabled: true, Interval: DefaultEngineInterval, Timeout: DefaultEngineTimeout, StaleAfter: DefaultEngineStale},
		Fleet:         defaultFleet(),
		Log:           Log{Level: "info", Format: "text", Access: true},
		Tracing:       defaultTracing(),
		Passthrough:   defaultPassthrough(),
		KVEvents:      defaultKVEvents(),
		Sync:          defaultSync(),
		Migration:     defaultMigration(),
		ShutdownGrace: DefaultShutdownGrace,
	}
}

// Load reads and strictly decodes the YAML file at path over the defaults.
// It does not validate; call Validate after applying overrides.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse strictly decodes YAML over the defaults: a key that is not part of
// the format is an error that names it and its line.
func Parse(b []byte) (*Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, cleanYAMLError(err)
	}
	// A second document would be silently ignored; refuse it instead.
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	return c, nil
}

// cleanYAMLError rewrites yaml's "field x not found in type config.Backend"
// into words a user of the file understands, with the known key nearest to
// an unknown one.
func cleanYAMLError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if j := strings.Index(m, " not found in type "); j >= 0 && strings.Contains(m, "field ") {
			typ := m[j+len(" not found in type "):]
			m = strings.Replace(m[:j], "field ", "unknown key ", 1)
			_, key, _ := strings.Cut(m, "unknown key ")
			if near := nearestKey(typ, key); near != "" {
				m += " (did you mean " + near + "?)"
			}
		}
		msgs[i] = humanTypeError(m)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// humanTypeError rewrites yaml's "line 3: cannot unmarshal !!int `30` into
// time.Duration" into what to write instead: a bare number is the most
// common slip in a duration, and "!!int" means nothing to a reader.
func humanTypeError(m string) string {
	line, rest, ok := strings.Cut(m, ": cannot unmarshal ")
	if !ok {
		return m
	}
	tag, rest, _ := strings.Cut(rest, " ")
	val, into, ok := strings.Cut(" "+rest, " into ")
	if !ok {
		return m
	}
	val = strings.TrimSpace(val)
	what := map[string]string{"!!int": "a number", "!!float": "a number", "!!str": "a string", "!!bool": "a boolean",
		"!!seq": "a list", "!!map": "a mapping", "!!null": "nothing"}[tag]
	if what == "" {
		what = tag
	}
	if val != "" {
		what += " " + val
	}
	switch into {
	case "time.Duration":
		return fmt.Sprintf("%s: %s is not a duration; use a duration such as 30s, 500ms or 2m", line, what)
	case "string":
		return fmt.Sprintf("%s: %s where a string is expected", line, what)
	case "int", "int64", "float64":
		return fmt.Sprintf("%s: %s where a number is expected", line, what)
	case "bool":
		return fmt.Sprintf("%s: %s where true or false is expected", line, what)
	}
	if strings.HasPrefix(into, "[]") {
		return fmt.Sprintf("%s: %s where a list is expected", line, what)
	}
	return fmt.Sprintf("%s: %s does not fit here (want %s)", line, what, strings.TrimPrefix(into, "config."))
}

// Overrides are the command-line flags that override the file.
type Overrides struct {
	// Listen, when non-empty, replaces listen.
	Listen string
	// Policy, when non-empty, replaces policy.
	Policy string
	// Backends, when non-empty, replace the file's backends list.
	Backends []string
	// Tracing, when true, sets tracing.enabled.
	Tracing bool
	// Sync, when non-empty, replaces sync.url.
	Sync string
	// LogLevel and LogFormat, when non-empty, replace log.level and
	// log.format.
	LogLevel, LogFormat string
	// EPPListen, when non-empty, replaces epp.listen.
	EPPListen string
}

// Apply applies o to c.
func (c *Config) Apply(o Overrides) {
	if o.Tracing {
		c.Tracing.Enabled = true
	}
	if o.Listen != "" {
		c.Listen = o.Listen
	}
	if o.EPPListen != "" {
		c.EPP.Listen = o.EPPListen
	}
	if o.Sync != "" {
		c.Sync.URL = o.Sync
	}
	if o.Policy != "" {
		c.Policy = o.Policy
	}
	if o.LogLevel != "" {
		c.Log.Level = o.LogLevel
	}
	if o.LogFormat != "" {
		c.Log.Format = o.LogFormat
	}
	if len(o.Backends) > 0 {
		c.Backends = c.Backends[:0:0]
		for _, u := range o.Backends {
			c.Backends = append(c.Backends, Backend{URL: u})
		}
	}
}

// Validate checks c without changing it. Its error says which key is wrong
// and why. What an entry leaves out (a backend's name, an SRV entry's URL)
// is derived by Entries, which Validate checks.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Listen == "" {
		bad("listen: must not be empty")
	}
	c.ListenTLS.validate(bad)
	c.Upstream.TLS.validate("upstream.tls", bad)
	if _, err := policy.New(c.Policy, policy.Options{}); err != nil {
		bad("policy: %v", err)
	}
	if c.PolicyOptions.LoadFactor != 0 && c.PolicyOptions.LoadFactor < 1 {
		bad("policy_options.load_factor: %g must be at least 1 (or 0 for the default)", c.PolicyOptions.LoadFactor)
	}
	if c.PolicyOptions.ProbeInterval < 0 {
		bad("policy_options.probe_interval: %v must not be negative (0 turns probes off)", c.PolicyOptions.ProbeInterval)
	}
	if c.Session.ResponseTTL < 0 || c.Session.MaxResponses < -1 {
		bad("session.response_ttl must not be negative, session.max_responses not below -1 (0 for the defaults)")
	}
	for i, h := range c.Session.Headers {
		if h == "" || strings.ContainsAny(h, " :\t\r\n") {
			bad("session.headers[%d]: %q is not a header name", i, h)
		}
	}
	if len(c.Backends) == 0 {
		bad("backends: none configured (add backends to the file or pass --backend URL)")
	}
	c.entries(bad)
	c.validateRoles(bad)
	if c.Limits.MaxBodyBytes <= 0 {
		bad("limits.max_body_bytes: %d must be positive", c.Limits.MaxBodyBytes)
	}
	if c.Prefix.BlockChars <= 0 {
		bad("prefix.block_chars: %d must be positive", c.Prefix.BlockChars)
	}
	if c.Prefix.CapacityBlocks <= 0 {
		bad("prefix.capacity_blocks: %d must be positive", c.Prefix.CapacityBlocks)
	}
	if c.Health.Interval <= 0 {
		bad("health.interval: %v must be positive", c.Health.Interval)
	}
	if c.Health.Timeout <= 0 {
		bad("health.timeout: %v must be positive", c.Health.Timeout)
	}
	if c.Health.Path != "" && !strings.HasPrefix(c.Health.Path, "/") {
		bad("health.path: %q must start with /", c.Health.Path)
	}
	if c.Health.EjectAfter <= 0 {
		bad("health.eject_after: %d must be positive", c.Health.EjectAfter)
	}
	if c.Health.Cooldown <= 0 {
		bad("health.cooldown: %v must be positive", c.Health.Cooldown)
	}
	if c.Health.MaxCooldown < c.Health.Cooldown {
		bad("health.max_cooldown: %v must be at least health.cooldown (%v)", c.Health.MaxCooldown, c.Health.Cooldown)
	}
	if c.Health.HalfOpenProbes <= 0 {
		bad("health.half_open_probes: %d must be positive", c.Health.HalfOpenProbes)
	}
	c.Admission.validate(bad)
	c.Objectives.validate(bad)
	c.Fleet.validate(bad)
	c.Admin.validate(bad)
	c.Limits.validate(bad)
	c.Auth.validate(bad)
	c.Tracing.validate(bad)
	c.Passthrough.validate(bad)
	c.KVEvents.validate(bad)
	c.Sync.validate(bad)
	c.Migration.validate(bad)
	c.EPP.validate(bad)
	if c.Retry.Attempts < 0 {
		bad("retry.attempts: %d must not be negative", c.Retry.Attempts)
	}
	if c.Upstream.ConnectTimeout <= 0 {
		bad("upstream.connect_timeout: %v must be positive", c.Upstream.ConnectTimeout)
	}
	if c.Upstream.ResponseHeaderTimeout < 0 {
		bad("upstream.response_header_timeout: %v must not be negative", c.Upstream.ResponseHeaderTimeout)
	}
	if c.Upstream.FirstTokenTimeout < 0 {
		bad("upstream.first_token_timeout: %v must not be negative", c.Upstream.FirstTokenTimeout)
	}
	if c.Upstream.ModelsCacheTTL < 0 {
		bad("upstream.models_cache_ttl: %v must not be negative", c.Upstream.ModelsCacheTTL)
	}
	if c.Upstream.StreamIdleTimeout < 0 {
		bad("upstream.stream_idle_timeout: %v must not be negative", c.Upstream.StreamIdleTimeout)
	}
	if c.Engines.Interval <= 0 || c.Engines.Interval >= policy.EngineStateMaxAge {
		bad("engines.interval: %v must be positive and below %v (the kvroute policy ignores older engine reports)", c.Engines.Interval, policy.EngineStateMaxAge)
	}
	if c.Engines.Timeout <= 0 {
		bad("engines.timeout: %v must be positive", c.Engines.Timeout)
	}
	if c.Engines.StaleAfter < 1 {
		bad("engines.stale_after: %d must be at least 1", c.Engines.StaleAfter)
	}
	if c.ShutdownGrace < 0 {
		bad("shutdown_grace: %v must not be negative", c.ShutdownGrace)
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level: %q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format: %q is not text or json", c.Log.Format)
	}
	return errors.Join(errs...)
}

// Check runs every check `kvroute serve` makes before it starts: Validate,
// then what the configuration names outside itself, in files and the
// environment (the admin token, API keys and sync key with their lengths
// and formats, the TLS certificates and keys; Validate already parses the
// trusted priority sources and keys).
// `kvroute validate` and serve call it alike, so that a configuration
// validate accepts does not stop serve from starting.
func (c *Config) Check() error {
	if err := c.Validate(); err != nil {
		return err
	}
	var errs []error
	if _, err := c.Admin.ResolveToken(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Auth.KeyDigests(); err != nil {
		errs = append(errs, err)
	}
	if c.Sync.Enabled() {
		if _, err := c.Sync.ResolveKey(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ListenTLS.Enabled() {
		if _, err := c.ListenTLS.Load(); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := c.Upstream.TLS.ClientConfig(""); err != nil {
		errs = append(errs, fmt.Errorf("upstream.%w", err))
	}
	for i, b := range c.Backends {
		if _, err := b.TLS.ClientConfig(""); err != nil {
			errs = append(errs, fmt.Errorf("backends[%d].%w", i, err))
		}
	}
	return errors.Join(errs...)
}

// ParseBackendURL parses a backend base URL: http or https, with a host, no
// query or fragment. A trailing slash is dropped.
func ParseBackendURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("empty URL")
	}
	if !strings.Contains(s, "://") {
		// "127.0.0.1:8000" would otherwise be Go's "first path segment in
		// URL cannot contain colon", "localhost:8000" a scheme "localhost".
		return nil, fmt.Errorf("%q has no scheme; write http://%s (or https://)", s, s)
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%q is not a URL: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: scheme must be http or https", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%q: no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%q: a backend URL takes no query, fragment or user info", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// ByteSize is a size in bytes that YAML may write as a number or as a
// string with a unit: "32MiB", "512KiB", "1GiB", "1000000B", "10MB".
type ByteSize int64

// UnmarshalYAML accepts an integer or a string with a unit.
func (s *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a size must be a number or a string such as \"32MiB\"", n.Line)
	}
	v, err := parseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*s = ByteSize(v)
	return nil
}

func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q (want bytes, or a number with KiB, MiB, GiB, KB, MB, GB)", s)
	}
	return v * mult, nil
}
