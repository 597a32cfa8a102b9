package config

import (
	"fmt"
	"os"
	"strings"
)

// AdminTokenEnv is the environment variable that carries the admin token;
// when set and not empty it wins over admin.token and admin.token_file, so
// that a secret need not live in the config file.
const AdminTokenEnv = "KVROUTE_ADMIN_TOKEN"

// Admin tunes the admin API under /admin/ (list backends, drain and
// undrain them, show the last routing decisions). It is off, and every
// /admin/ path answers 404, unless a token is configured; every call must
// then carry "Authorization: Bearer <token>".
type Admin struct {
	// Listen is a separate address for the admin API (and a copy of
	// /metrics), e.g. "127.0.0.1:9090", so that it can stay off the
	// network clients reach; /admin/ then answers 404 on the client
	// listener. Default "": the admin API shares the client listener.
	Listen string `yaml:"listen"`
	// Token is the bearer token, at least 16 characters
	// (MinAdminTokenLen). Default "" (admin API off). Prefer
	// token_file or the KVROUTE_ADMIN_TOKEN environment variable, which
	// keep the secret out of the config file.
	Token string `yaml:"token"`
	// TokenFile is a file whose content (surrounding whitespace trimmed)
	// is the token; it is read at startup and on every reload. Default "". At most one of
	// token and token_file may be set.
	TokenFile string `yaml:"token_file"`
	// Decisions is how many of the last routing decisions GET
	// /admin/decisions keeps. Default 256.
	Decisions int `yaml:"decisions"`
}

// DefaultAdminDecisions is the default length of the decision log.
const DefaultAdminDecisions = 256

// MinAdminTokenLen is the shortest admin token accepted, from any source:
// a short token is guessed (`openssl rand -hex 16` makes one of 32).
const MinAdminTokenLen = 16

func defaultAdmin() Admin { return Admin{Decisions: DefaultAdminDecisions} }

// validate reports the admin section's errors through bad.
func (a Admin) validate(bad func(format string, args ...any)) {
	if a.Token != "" && a.TokenFile != "" {
		bad("admin: set token or token_file, not both")
	}
	if a.Decisions <= 0 {
		bad("admin.decisions: %d must be positive", a.Decisions)
	}
	if t := strings.TrimSpace(a.Token); t != "" && len(t) < MinAdminTokenLen {
		bad("admin.token: %d characters is too short; use at least %d", len(t), MinAdminTokenLen)
	}
}

// ResolveToken returns the admin token: the KVROUTE_ADMIN_TOKEN
// environment variable if set, else the content of token_file, else token.
// "" means the admin API is off.
//
// A token shorter than MinAdminTokenLen is an error, wherever it came from.
func (a Admin) ResolveToken() (string, error) {
	t, where, err := a.token()
	if err != nil || t == "" {
		return "", err
	}
	if len(t) < MinAdminTokenLen {
		return "", fmt.Errorf("%s: the admin token has %d characters; use at least %d", where, len(t), MinAdminTokenLen)
	}
	return t, nil
}

// token returns the admin token and where it came from.
func (a Admin) token() (token, where string, err error) {
	if t := strings.TrimSpace(os.Getenv(AdminTokenEnv)); t != "" {
		return t, AdminTokenEnv, nil
	}
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", "", fmt.Errorf("admin.token_file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", "", fmt.Errorf("admin.token_file: %s is empty", a.TokenFile)
		}
		return t, "admin.token_file", nil
	}
	return strings.TrimSpace(a.Token), "admin.token", nil
}
