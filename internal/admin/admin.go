// Package admin is the router's admin API under /admin/: it lists the
// backends with their live state as the router sees them, drains and
// undrains them, and shows the last routing decisions with their reasons;
// GET /admin/fleet (and /admin/) is a live page over the same calls.
//
// It owns the API's authentication (a bearer token compared in constant
// time; no token configured means the API does not exist and every path
// answers 404), its JSON wire format and the fixed-size log of decisions.
// It reads and changes router state only through Source, so it makes no
// routing decision and does no network I/O of its own; it never sees a
// prompt or a client's Authorization header beyond checking its own token.
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// Prefix is the path under which the router mounts the handler.
const Prefix = "/admin/"

// Errors a Source returns for drain and undrain.
var (
	// ErrUnknownBackend: no backend has that name (404).
	ErrUnknownBackend = errors.New("no backend has this name")
	// ErrRemoving: the backend is being removed, which is final (409).
	ErrRemoving = errors.New("backend is being removed")
)

// Source is the router state the admin API reads and changes.
type Source interface {
	// Backends returns every member backend's live state, in ID order.
	Backends() []Backend
	// Drain stops new requests to the named backend; its in-flight
	// requests (streams included) go on.
	Drain(name string) error
	// Undrain lets the named backend receive new requests again.
	Undrain(name string) error
}

// Backend is one backend's live state as GET /admin/backends shows it.
type Backend struct {
	Name   string   `json:"name"`
	URL    string   `json:"url"`
	Models []string `json:"models"`
	// Role is the backend's part in disaggregated serving: prefill,
	// decode or both (its entry's backends[].role, or its pod's
	// kvroute.io/role label).
	Role string `json:"role"`
	// Healthy is false while the breaker is open.
	Healthy bool `json:"healthy"`
	// Draining backends get no new requests.
	Draining bool    `json:"draining"`
	Breaker  Breaker `json:"breaker"`
	// Load is the router's own accounting of the backend.
	Load Load `json:"load"`
	// PrefillRate is the learned prefill rate in tokens per second (the
	// prior until a first byte taught it).
	PrefillRate float64 `json:"prefill_rate_tokens_per_second"`
	// EnginePrefillRate is the prefill rate the engine's own counters
	// show, absent when it reports none.
	EnginePrefillRate float64 `json:"engine_prefill_rate_tokens_per_second,omitempty"`
	// What else the router learns about the engine from its traffic and
	// reports belongs beside the rates above (a learned running-sequence
	// cap, with what it was learned from).
	// Engine is what the engine itself last reported, nil if nothing.
	Engine *Engine `json:"engine"`
	// Adapters are the LoRA adapters the engine last reported, nil when it
	// reports none.
	Adapters *Adapters `json:"adapters,omitempty"`
	// PrefixBlocks is how many prefix blocks the router's index believes
	// the backend holds.
	PrefixBlocks int `json:"prefix_blocks"`
	// RoutedPromptTokens is the estimated prompt tokens routed to the
	// backend since it joined, and PredictedCachedTokens how many of them
	// the router predicted to be in its cache: their ratio is the
	// backend's predicted hit rate.
	RoutedPromptTokens    int64 `json:"routed_prompt_tokens"`
	PredictedCachedTokens int64 `json:"predicted_cached_tokens"`
	// MaxNumSeqs is the running-sequence cap the backend is routed by, 0
	// when none is known, and MaxNumSeqsSource where it comes from:
	// "engine" (its own report, llama.cpp's slots), "config"
	// (backends[].max_num_seqs), "learned" (confirmed from its running
	// and waiting counts) or "plausible" (the cold-start cap, not
	// confirmed yet).
	MaxNumSeqs       int    `json:"max_num_seqs"`
	MaxNumSeqsSource string `json:"max_num_seqs_source,omitempty"`
	// Cache is the audit of the router's cache picture of the backend
	// against the cached tokens its engine reported.
	Cache CacheAudit `json:"cache_audit"`
}

// Adapters are an engine's LoRA adapters, as its metrics report them
// (vllm:lora_requests_info, SGLang's LoRA pool).
type Adapters struct {
	// Running and Waiting name the adapters of the running and the
	// waiting requests; empty when the engine reports no names.
	Running []string `json:"running"`
	Waiting []string `json:"waiting"`
	// Max is the engine's cap on adapters (vLLM's --max-loras), Used how
	// many it holds.
	Max  int `json:"max"`
	Used int `json:"used"`
}

// CacheAudit is a backend's cache picture checked against its engine's
// reports (see prefix.Audit), over the requests whose engine reported
// its cached tokens, every policy together.
type CacheAudit struct {
	// AuditedPromptTokens is those requests' prompt tokens (the router's
	// estimate); PredictedCachedTokens how many of them the router
	// predicted cached there, ReportedCachedTokens how many the engine
	// reported reusing, BestCachedTokens how many the best-placed
	// candidate held at decision time.
	AuditedPromptTokens   int64 `json:"audited_prompt_tokens"`
	PredictedCachedTokens int64 `json:"predicted_cached_tokens"`
	ReportedCachedTokens  int64 `json:"reported_cached_tokens"`
	BestCachedTokens      int64 `json:"best_cached_tokens"`
	// Trusted is false while the audit counts the backend's matches as
	// 0; CapacityBlocks is its capacity in the prefix index.
	Trusted        bool `json:"trusted"`
	CapacityBlocks int  `json:"capacity_blocks"`
	// Actions counts the audit's verdicts by name (forget, shrink,
	// grow, untrust, trust).
	Actions map[string]uint64 `json:"actions"`
}

// Breaker is a backend's circuit breaker.
type Breaker struct {
	// State is closed, open or half-open.
	State string `json:"state"`
	// ConsecutiveFailures counts failures while closed.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// OpenUntil is when an open breaker goes half-open.
	OpenUntil *time.Time `json:"open_until,omitempty"`
}

// Load is the router's accounting of a backend (see fleet.Load).
type Load struct {
	InFlight             int64 `json:"in_flight"`
	PendingPrefillTokens int64 `json:"pending_prefill_tokens"`
	Decoding             int64 `json:"decoding"`
	DecodeBudgetTokens   int64 `json:"decode_budget_tokens"`
	DecodeTokens         int64 `json:"decode_tokens"`
}

// Engine is the engine's last report (see fleet.EngineState).
type Engine struct {
	ReportedAt time.Time `json:"reported_at"`
	// AgeSeconds is how old the report was when the API answered.
	AgeSeconds float64 `json:"age_seconds"`
	// Running, Waiting and KVUsage are nil (absent) when the engine does
	// not report them.
	Running  *int     `json:"running,omitempty"`
	Waiting  *int     `json:"waiting,omitempty"`
	KVUsage  *float64 `json:"kv_usage,omitempty"`
	KVBlocks int      `json:"kv_blocks"`
}

// Handler serves the admin API.
type Handler struct {
	// digest is the SHA-256 of the token (nil: the API is off); comparing
	// digests keeps the comparison constant-time whatever the length of
	// the guess. SetToken replaces it.
	digest atomic.Pointer[[sha256.Size]byte]
	src    Source
	log    *Log
	now    func() time.Time
}

// Off is what every admin path answers, with 404, while the API is off:
// how to turn it on.
const Off = "the admin API is off: set a token of at least 16 characters in KVROUTE_ADMIN_TOKEN, admin.token_file or admin.token " +
	"(e.g. KVROUTE_ADMIN_TOKEN=$(openssl rand -hex 16)) and call it with Authorization: Bearer <token>"

// New returns the admin API over src and log. An empty token disables it:
// every path answers 404, as if the API did not exist.
func New(token string, src Source, log *Log) *Handler {
	h := &Handler{src: src, log: log, now: time.Now}
	h.SetToken(token)
	return h
}

// SetToken replaces the token (a configuration reload); "" turns the API
// off. Calls in flight finish under the token they were checked against.
func (h *Handler) SetToken(token string) {
	if token == "" {
		h.digest.Store(nil)
		return
	}
	d := sha256.Sum256([]byte(token))
	h.digest.Store(&d)
}

// Authorized reports whether token is the admin token (compared in
// constant time); false while the API is off.
func (h *Handler) Authorized(token string) bool {
	digest := h.digest.Load()
	return digest != nil && token != "" && matches(token, digest)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	digest := h.digest.Load()
	if digest == nil {
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, "admin_api_off", Off, 0)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(Prefix, "/"))
	if path == "/" || path == "/fleet" {
		// The page holds no state and asks for the token itself
		// (fleetpage.go); what it shows comes from the calls below.
		if method(w, r, http.MethodGet) {
			h.fleet(w)
		}
		return
	}
	if !authorized(r, digest) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute admin"`)
		openai.WriteError(w, http.StatusUnauthorized, openai.TypeAuthentication, "invalid_admin_token",
			"the admin API needs the header Authorization: Bearer <admin token>", 0)
		return
	}
	switch {
	case path == "/backends":
		if method(w, r, http.MethodGet) {
			h.backends(w)
		}
	case path == "/decisions":
		if method(w, r, http.MethodGet) {
			h.decisions(w, r)
		}
	case strings.HasPrefix(path, "/backends/"):
		// The action is the last segment: names of backends from DNS
		// pools hold a slash (pool/host:port).
		rest := strings.TrimPrefix(path, "/backends/")
		i := strings.LastIndexByte(rest, '/')
		name, action := rest[:max(i, 0)], rest[i+1:]
		if i < 0 || name == "" || (action != "drain" && action != "undrain") {
			notFound(w, r)
			return
		}
		if method(w, r, http.MethodPost) {
			h.drain(w, name, action)
		}
	default:
		notFound(w, r)
	}
}

// authorized checks the bearer token against digest in constant time.
func authorized(r *http.Request, digest *[sha256.Size]byte) bool {
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return matches(strings.TrimSpace(token), digest)
}

// matches compares token's digest with digest in constant time.
func matches(token string, digest *[sha256.Size]byte) bool {
	d := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(d[:], digest[:]) == 1
}

func (h *Handler) backends(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, map[string]any{"backends": h.src.Backends()})
}

func (h *Handler) drain(w http.ResponseWriter, name, action string) {
	var err error
	if action == "drain" {
		err = h.src.Drain(name)
	} else {
		err = h.src.Undrain(name)
	}
	switch {
	case errors.Is(err, ErrUnknownBackend):
		openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, "backend_not_found", "no backend is named '"+name+"'", 0)
		return
	case errors.Is(err, ErrRemoving):
		openai.WriteError(w, http.StatusConflict, openai.TypeInvalidRequest, "backend_removing", "backend '"+name+"' is being removed; it cannot be undrained", 0)
		return
	case err != nil:
		openai.WriteError(w, http.StatusInternalServerError, openai.TypeServer, "admin_error", action+" "+name+": "+err.Error(), 0)
		return
	}
	for _, b := range h.src.Backends() {
		if b.Name == name {
			writeJSON(w, http.StatusOK, b)
			return
		}
	}
	// Removed between the change and the read: the change still happened.
	writeJSON(w, http.StatusOK, map[string]string{"name": name})
}

// decisions answers the last routing decisions, newest first; ?limit=N
// bounds how many.
func (h *Handler) decisions(w http.ResponseWriter, r *http.Request) {
	n := h.log.Cap()
	if q := r.URL.Query().Get("limit"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v <= 0 {
			openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "invalid_limit", "limit must be a positive integer, got '"+q+"'", 0)
			return
		}
		n = min(n, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"decisions": h.log.Last(n)})
}

// method reports whether r uses want, answering 405 otherwise.
func method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want {
		return true
	}
	w.Header().Set("Allow", want)
	openai.WriteError(w, http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path+"; use "+want, 0)
	return false
}

func notFound(w http.ResponseWriter, r *http.Request) {
	openai.WriteError(w, http.StatusNotFound, openai.TypeNotFound, "not_found", "no route for "+r.Method+" "+r.URL.Path, 0)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, openai.TypeServer, "admin_error", err.Error(), 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
