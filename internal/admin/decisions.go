package admin

import (
	"sync"
	"time"
	"unicode/utf8"
)

// SessionShown is how many leading characters of a session key a
// Decision keeps: enough to tell conversations apart in a listing, too
// few to replay a client's identifier.
const SessionShown = 8

// ModelShown is how many bytes of a model name a Decision keeps: more
// than any served model's name, and a bound on what a client's request
// leaves in the log (a 16 MB model name, answered 404, was kept whole).
const ModelShown = 256

// Decision is one routing decision as GET /admin/decisions shows it. It
// never holds prompt text or credentials.
type Decision struct {
	// Time is when the request arrived.
	Time time.Time `json:"time"`
	// Model is the request's model, its first ModelShown bytes with "…"
	// when it was longer.
	Model string `json:"model"`
	// Session is the session key's first SessionShown characters, with
	// "…" when it was longer; "" for requests without one.
	Session string `json:"session,omitempty"`
	// Backend is the backend that answered (after retries); "" when none
	// could be chosen.
	Backend string `json:"backend"`
	// Reason is the scheduler's reason for the final choice, or the
	// routing error.
	Reason string `json:"reason"`
	// PromptTokens is the router's estimate of the prompt's tokens.
	PromptTokens int `json:"prompt_tokens"`
	// TTFTMillis is the time from the request's arrival to the backend's
	// first content byte, as the router saw it; absent when none came
	// before the decision was recorded (an error, a non-streaming body).
	TTFTMillis float64 `json:"ttft_ms,omitempty"`
	// Retries is how many times the request was re-routed.
	Retries int `json:"retries"`
	// Status is the response status the router saw when the decision was
	// settled (the backend's, or the router's own error).
	Status int `json:"status"`
	// Whole is why a request that could have been split over a prefill
	// and a decode engine was served whole; "" otherwise.
	Whole string `json:"whole,omitempty"`
	// Legs are the legs of a split request (prefill, then decode), in the
	// order they ran; absent for a request of one leg.
	Legs []Leg `json:"legs,omitempty"`
}

// Leg is one leg of a split request in a Decision.
type Leg struct {
	// Role is the leg's role: prefill or decode.
	Role string `json:"role"`
	// Backend is the engine of the leg's last attempt, "" when none could
	// be chosen.
	Backend string `json:"backend,omitempty"`
	// Reason is the scheduler's reason for choosing it.
	Reason string `json:"reason,omitempty"`
	// Attempts is how many times the leg was sent (0: never).
	Attempts int `json:"attempts"`
	// Skipped is why the leg was skipped ("no backend", "failed on
	// <backend>"); "" for a leg that served.
	Skipped string `json:"skipped,omitempty"`
	// Whole marks a decode leg that served the request whole, its
	// prefill leg skipped.
	Whole bool `json:"whole,omitempty"`
}

// Log is a fixed-size ring of the last decisions, bounded in bytes as
// in entries: the strings a client sent (model, session key) are kept
// to a few hundred bytes each, copied, so that a decision never holds on
// to a request's memory. Record is on the request path: it takes a short
// lock, and allocates only to shorten a long string.
type Log struct {
	mu   sync.Mutex
	ring []Decision
	next int // where the next decision goes
	n    int // how many are held, up to len(ring)
}

// NewLog returns a log that keeps the last size decisions (at least 1).
func NewLog(size int) *Log {
	return &Log{ring: make([]Decision, max(size, 1))}
}

// Cap is how many decisions the log keeps.
func (l *Log) Cap() int { return len(l.ring) }

// Record adds d, truncating its session key and model; the oldest
// decision goes when the log is full. A nil log records nothing.
func (l *Log) Record(d Decision) {
	if l == nil {
		return
	}
	d.Session = Truncate(d.Session)
	d.Model = clip(d.Model, ModelShown)
	l.mu.Lock()
	l.ring[l.next] = d
	l.next++
	if l.next == len(l.ring) {
		l.next = 0
	}
	l.n = min(l.n+1, len(l.ring))
	l.mu.Unlock()
}

// Last returns up to n decisions, newest first.
func (l *Log) Last(n int) []Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	n = min(n, l.n)
	out := make([]Decision, 0, max(n, 0))
	for i := range n {
		j := l.next - 1 - i
		if j < 0 {
			j += len(l.ring)
		}
		out = append(out, l.ring[j])
	}
	return out
}

// Truncate shortens a session key to SessionShown characters.
func Truncate(key string) string {
	n, i := 0, 0
	for i < len(key) && n < SessionShown {
		_, size := utf8.DecodeRuneInString(key[i:])
		i += size
		n++
	}
	if i == len(key) {
		return key
	}
	return key[:i] + "…" // a new string: key's memory is not kept
}

// clip shortens s to at most n bytes, cut at a character's start, with
// "…" when it was longer. The result never shares s's memory when shorter.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…" // a new string
}
