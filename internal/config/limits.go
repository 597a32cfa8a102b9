package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// Defaults of the limits section.
const (
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxMessages       = 100000
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 60 * time.Second
	DefaultClientWrite       = 60 * time.Second
	DefaultAuthFailures      = 30
	DefaultMinBodyRate       = 1 << 10
	DefaultBodyRateGrace     = 5 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
)

func defaultLimits() Limits {
	return Limits{
		MaxBodyBytes:          DefaultMaxBodyBytes,
		MaxHeaderBytes:        DefaultMaxHeaderBytes,
		MaxMessages:           DefaultMaxMessages,
		ReadHeaderTimeout:     DefaultReadHeaderTimeout,
		BodyTimeout:           DefaultBodyTimeout,
		RejectOverContext:     true,
		ClientWriteTimeout:    DefaultClientWrite,
		AuthFailuresPerMinute: DefaultAuthFailures,
		MaxBytesPerToken:      request.MaxBytesPerToken,
		MinBodyRate:           DefaultMinBodyRate,
		BodyRateGrace:         DefaultBodyRateGrace,
		IdleTimeout:           DefaultIdleTimeout,
	}
}

// validate reports the new limits' errors through bad (max_body_bytes is
// checked in Validate).
func (l Limits) validate(bad func(format string, args ...any)) {
	if l.MaxHeaderBytes <= 0 || l.MaxHeaderBytes > 1<<30 {
		bad("limits.max_header_bytes: %d must be positive and at most 1GiB", l.MaxHeaderBytes)
	}
	if l.MaxMessages <= 0 {
		bad("limits.max_messages: %d must be positive", l.MaxMessages)
	}
	if l.ReadHeaderTimeout <= 0 {
		bad("limits.read_header_timeout: %v must be positive", l.ReadHeaderTimeout)
	}
	if l.BodyTimeout <= 0 {
		bad("limits.body_timeout: %v must be positive", l.BodyTimeout)
	}
	if l.AuthFailuresPerMinute < 0 {
		bad("limits.auth_failures_per_minute: %d must not be negative (0 is off)", l.AuthFailuresPerMinute)
	}
	if l.ClientWriteTimeout < 0 {
		bad("limits.client_write_timeout: %v must not be negative", l.ClientWriteTimeout)
	}
	// A body budget, when set, must hold at least one body of max_body_bytes.
	budget := func(key string, v ByteSize) {
		if v < 0 {
			bad("limits.%s: %d must not be negative", key, v)
		} else if v > 0 && v < l.MaxBodyBytes {
			bad("limits.%s: %d is below max_body_bytes (%d): no body of the largest size could be read", key, v, l.MaxBodyBytes)
		}
	}
	budget("max_buffered_bytes", l.MaxBufferedBytes)
	budget("max_buffered_bytes_per_client", l.MaxBufferedBytesPerClient)
	if l.MaxBytesPerToken < 1 {
		bad("limits.max_bytes_per_token: %d must be at least 1", l.MaxBytesPerToken)
	}
	if l.MinBodyRate < 0 {
		bad("limits.min_body_rate: %d must not be negative (0 is off)", l.MinBodyRate)
	}
	if l.BodyRateGrace <= 0 {
		bad("limits.body_rate_grace: %v must be positive (a body's first bytes need time to arrive)", l.BodyRateGrace)
	}
	if l.MaxConnections < 0 {
		bad("limits.max_connections: %d must not be negative (0 derives it from the file descriptor limit)", l.MaxConnections)
	}
	if l.IdleTimeout <= 0 {
		bad("limits.idle_timeout: %v must be positive", l.IdleTimeout)
	}
}

// BufferedBytesPerClient is max_buffered_bytes_per_client, or its default:
// a quarter of the budget, at least one body of max_body_bytes, at most
// the whole budget.
func (l Limits) BufferedBytesPerClient() int64 {
	if l.MaxBufferedBytesPerClient > 0 {
		return min(int64(l.MaxBufferedBytesPerClient), l.BufferedBytes())
	}
	return min(max(l.BufferedBytes()/4, int64(l.MaxBodyBytes)), l.BufferedBytes())
}

// MinConnections is the least max_connections derived from the file
// descriptor limit.
const MinConnections = 64

// Connections is max_connections, or its default for a process allowed
// nofile descriptors: half of them (the other half for connections to the
// backends, the metrics scrapes and the peers), at least MinConnections.
func (l Limits) Connections(nofile uint64) int {
	if l.MaxConnections > 0 {
		return l.MaxConnections
	}
	return int(max(min(nofile/2, 1<<30), MinConnections))
}

// DefaultBufferedBodies is max_buffered_bytes in bodies of max_body_bytes
// when it is not set.
const DefaultBufferedBodies = 8

// BufferedBytes is max_buffered_bytes, or its default derived from
// max_body_bytes.
func (l Limits) BufferedBytes() int64 {
	if l.MaxBufferedBytes > 0 {
		return int64(l.MaxBufferedBytes)
	}
	return DefaultBufferedBodies * int64(l.MaxBodyBytes)
}

// DefaultAuthExempt are the paths that need no API key by default: probes,
// metrics, and the admin API, which has its own token.
var DefaultAuthExempt = []string{"/healthz", "/health", "/readyz", "/metrics", "/admin/"}

// Auth is the router's own API key check. It is off unless api_keys_file
// or api_keys_env names at least one key; then every request, except to
// the exempt paths, must carry "Authorization: Bearer <key>" (or, as
// Anthropic's clients send it, "x-api-key: <key>") with one of the keys,
// or gets 401. The header still reaches the backend unchanged.
type Auth struct {
	// APIKeysFile is a file of keys, one a line; blank lines and lines
	// starting with # are ignored. A line "sha256:<64 hex digits>" is the
	// SHA-256 digest of a key, so the file need not hold the key itself.
	// Read at startup. Default "".
	APIKeysFile string `yaml:"api_keys_file"`
	// APIKeysEnv names an environment variable holding keys separated by
	// commas (plain or "sha256:<hex>"). Default "".
	APIKeysEnv string `yaml:"api_keys_env"`
	// Exempt are paths served without a key; one ending in "/" covers the
	// paths under it. Default [/healthz, /health, /readyz, /metrics, /admin/].
	Exempt []string `yaml:"exempt"`
	// DecisionHeaderKeys are the API keys (or "sha256:<64 hex digits>",
	// their digests) whose requests get the routing decision headers
	// X-Kvroute-Backend and X-Kvroute-Reason while keys are configured;
	// so do requests that carry the admin token in X-Kvroute-Admin-Token.
	// Other tenants do not: the reason's prefix match would tell them
	// what another tenant's prompts hold. Without keys the router serves
	// one tenant and every response has them. Default [].
	DecisionHeaderKeys []string `yaml:"decision_header_keys"`
	// IsolatePrefix salts every API key's prefix chain with the key's
	// identity (its SHA-256), in the approximate prefix index and the
	// precise one, so that one tenant's routing never follows another's
	// prompts. Default false.
	IsolatePrefix bool `yaml:"isolate_prefix"`
}

// DecisionHeaderDigests returns the digests of decision_header_keys.
func (a Auth) DecisionHeaderDigests() (map[[sha256.Size]byte]bool, error) {
	out := map[[sha256.Size]byte]bool{}
	for i, k := range a.DecisionHeaderKeys {
		where := fmt.Sprintf("auth.decision_header_keys[%d]", i)
		d, ok, err := keyDigest(where, k)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: empty", where)
		}
		out[d] = true
	}
	return out, nil
}

func defaultAuth() Auth { return Auth{Exempt: DefaultAuthExempt} }

func (a Auth) validate(bad func(format string, args ...any)) {
	for i, p := range a.Exempt {
		if !strings.HasPrefix(p, "/") {
			bad("auth.exempt[%d]: %q must start with /", i, p)
		}
	}
	if _, err := a.DecisionHeaderDigests(); err != nil {
		bad("%v", err)
	}
}

// KeyDigests returns the SHA-256 digests of the configured keys, from the
// file and the environment variable. None means the check is off; a named
// file that cannot be read, an empty named variable, or a malformed digest
// is an error, so that a typo does not silently open the router.
func (a Auth) KeyDigests() ([][sha256.Size]byte, error) {
	var out [][sha256.Size]byte
	add := func(where, k string) error {
		d, ok, err := keyDigest(where, k)
		if ok {
			out = append(out, d)
		}
		return err
	}
	if a.APIKeysFile != "" {
		b, err := os.ReadFile(a.APIKeysFile)
		if err != nil {
			return nil, fmt.Errorf("auth.api_keys_file: %w", err)
		}
		n := len(out)
		for i, line := range strings.Split(string(b), "\n") {
			if err := add(fmt.Sprintf("auth.api_keys_file %s line %d", a.APIKeysFile, i+1), line); err != nil {
				return nil, err
			}
		}
		if len(out) == n {
			return nil, fmt.Errorf("auth.api_keys_file: %s holds no key", a.APIKeysFile)
		}
	}
	if a.APIKeysEnv != "" {
		v := os.Getenv(a.APIKeysEnv)
		n := len(out)
		for _, k := range strings.Split(v, ",") {
			if err := add("auth.api_keys_env "+a.APIKeysEnv, k); err != nil {
				return nil, err
			}
		}
		if len(out) == n {
			return nil, fmt.Errorf("auth.api_keys_env: $%s holds no key", a.APIKeysEnv)
		}
	}
	return out, nil
}

// keyDigest reads one key: blank or a # comment (ok false), a plain key
// (its SHA-256 digest), or "sha256:<64 hex digits>".
func keyDigest(where, k string) (d [sha256.Size]byte, ok bool, err error) {
	k = strings.TrimSpace(k)
	if k == "" || strings.HasPrefix(k, "#") {
		return d, false, nil
	}
	if hexd, isDigest := strings.CutPrefix(k, "sha256:"); isDigest {
		b, err := hex.DecodeString(hexd)
		if err != nil || len(b) != sha256.Size {
			return d, false, fmt.Errorf("%s: %q is not sha256: followed by 64 hex digits", where, truncateKey(k))
		}
		return [sha256.Size]byte(b), true, nil
	}
	return sha256.Sum256([]byte(k)), true, nil
}

// truncateKey keeps a malformed key's first characters for an error
// message, not the whole secret.
func truncateKey(k string) string {
	if len(k) > 12 {
		return k[:12] + "..."
	}
	return k
}
