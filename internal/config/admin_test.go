package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		admin   Admin
		env     string
		want    string
		wantErr string
	}{
		{name: "off", admin: Admin{}, want: ""},
		{name: "inline", admin: Admin{Token: "inline-0123456789"}, want: "inline-0123456789"},
		{name: "file", admin: Admin{TokenFile: file}, want: "from-file-0123456789"},
		{name: "env wins", admin: Admin{TokenFile: file}, env: "from-env-0123456789", want: "from-env-0123456789"},
		{name: "short inline", admin: Admin{Token: "inline"}, wantErr: "admin.token: the admin token has 6 characters"},
		{name: "short env", admin: Admin{TokenFile: file}, env: "from-env", wantErr: AdminTokenEnv + ": the admin token has 8"},
		{name: "missing file", admin: Admin{TokenFile: filepath.Join(dir, "nope")}, wantErr: "admin.token_file"},
		{name: "empty file", admin: Admin{TokenFile: empty}, wantErr: "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(AdminTokenEnv, tt.env)
			got, err := tt.admin.ResolveToken()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ResolveToken = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestAdminAndBreakerValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"token and file", func(c *Config) { c.Admin.Token, c.Admin.TokenFile = "a", "b" }, "not both"},
		{"no decisions", func(c *Config) { c.Admin.Decisions = 0 }, "admin.decisions"},
		{"short token", func(c *Config) { c.Admin.Token = "hunter2" }, "admin.token: 7 characters is too short"},
		{"cooldown", func(c *Config) { c.Health.Cooldown = 0 }, "health.cooldown"},
		{"max below cooldown", func(c *Config) { c.Health.MaxCooldown = c.Health.Cooldown / 2 }, "health.max_cooldown"},
		{"probes", func(c *Config) { c.Health.HalfOpenProbes = 0 }, "health.half_open_probes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Backends = []Backend{{URL: "http://127.0.0.1:9"}}
			if err := c.Validate(); err != nil {
				t.Fatalf("defaults do not validate: %v", err)
			}
			tt.mod(c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}
