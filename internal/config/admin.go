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
	// Token is the bearer token. Default "" (admin API off). Prefer
	// token_file or the KVROUTE_ADMIN_TOKEN environment variable, which
	// keep the secret out of the config file.
	Token string `yaml:"token"`
	// TokenFile is a file whose content (surrounding whitespace trimmed)
	// is the token; it is read at startup. Default "". At most one of
	// token and token_file may be set.
	TokenFile string `yaml:"token_file"`
	// Decisions is how many of the last routing decisions GET
	// /admin/decisions keeps. Default 256.
	Decisions int `yaml:"decisions"`
}

// DefaultAdminDecisions is the default length of the decision log.
const DefaultAdminDecisions = 256

func defaultAdmin() Admin { return Admin{Decisions: DefaultAdminDecisions} }

// validate reports the admin section's errors through bad.
func (a Admin) validate(bad func(format string, args ...any)) {
	if a.Token != "" && a.TokenFile != "" {
		bad("admin: set token or token_file, not both")
	}
	if a.Decisions <= 0 {
		bad("admin.decisions: %d must be positive", a.Decisions)
	}
}

// ResolveToken returns the admin token: the KVROUTE_ADMIN_TOKEN
// environment variable if set, else the content of token_file, else token.
// "" means the admin API is off.
func (a Admin) ResolveToken() (string, error) {
	if t := strings.TrimSpace(os.Getenv(AdminTokenEnv)); t != "" {
		return t, nil
	}
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", fmt.Errorf("admin.token_file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", fmt.Errorf("admin.token_file: %s is empty", a.TokenFile)
		}
		return t, nil
	}
	return strings.TrimSpace(a.Token), nil
}
