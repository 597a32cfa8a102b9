package config

// Migration is the continuation of a stream whose engine fails after its
// first byte on another engine (docs/reliability.md, "Moving a stream").
type Migration struct {
	// MaxAttempts is how many times one stream may be moved to another
	// engine; 0 turns moving off (a broken stream ends with an error
	// event, as it did before). Default 2.
	MaxAttempts int `yaml:"max_attempts"`
	// MaxContextTokens bounds the continuation's prompt (the original
	// prompt and the answer so far, estimated), whose uncached part the
	// new engine computes again: a longer one is not moved. 0: no bound.
	// Default 32768.
	MaxContextTokens int `yaml:"max_context_tokens"`
}

// Defaults of the migration keys.
const (
	DefaultMigrationAttempts      = 2
	DefaultMigrationContextTokens = 32768
)

func defaultMigration() Migration {
	return Migration{MaxAttempts: DefaultMigrationAttempts, MaxContextTokens: DefaultMigrationContextTokens}
}

func (m Migration) validate(bad func(string, ...any)) {
	if m.MaxAttempts < 0 {
		bad("migration.max_attempts: %d must not be negative", m.MaxAttempts)
	}
	if m.MaxContextTokens < 0 {
		bad("migration.max_context_tokens: %d must not be negative", m.MaxContextTokens)
	}
}
