package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// maxEventBytes bounds one SSE line: chunks are small, and a line longer
// than this is a broken stream, not a reason to buffer without end.
const maxEventBytes = 4 << 20

// streamStats is what one response stream told us.
type streamStats struct {
	ttft, e2e              time.Duration
	itl                    []time.Duration
	prompt, cached, output int
	usage                  bool
	// responseID is a Responses API stream's id (response.created).
	responseID string
}

// readStream reads an SSE stream of chat or completion chunks ("data: {...}"
// events ended by "data: [DONE]"). TTFT is the arrival of the first chunk
// with non-empty text; each later text chunk adds one inter-token gap.
// Token counts come from the usage chunk; without one, each text chunk
// counts as a token.
func readStream(body io.Reader, start time.Time) (st streamStats, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxEventBytes)
	var tc tokenClock
	done := false
	for sc.Scan() {
		line := bytes.TrimRight(sc.Bytes(), "\r")
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, event: and id: fields
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		now := time.Now()
		ev, err := parseChunk(data)
		if err != nil {
			return st, err
		}
		if ev.content {
			tc.tick(&st, start, now)
		}
		if ev.usage != nil {
			st.usage = true
			st.prompt, st.output = ev.usage.PromptTokens, ev.usage.CompletionTokens
		}
		if ev.usage != nil || ev.timings != nil {
			// vLLM's and SGLang's cached_tokens, or llama.cpp's timings.
			if c, ok := openai.ReportedCached(ev.usage, ev.timings); ok {
				st.cached = c
			}
		}
	}
	return st, tc.end(&st, sc, start, done)
}

// tokenClock times a stream's token chunks.
type tokenClock struct {
	last   time.Time
	chunks int
}

// tick notes a token chunk that arrived at now: the first's TTFT, the
// later ones' gaps.
func (c *tokenClock) tick(st *streamStats, start, now time.Time) {
	if c.chunks == 0 {
		st.ttft = now.Sub(start)
	} else {
		st.itl = append(st.itl, now.Sub(c.last))
	}
	c.last = now
	c.chunks++
}

// end completes st once the stream's reading stopped, done when its last
// event was read: its E2E, its output without a usage, and the stream's
// error.
func (c *tokenClock) end(st *streamStats, sc *bufio.Scanner, start time.Time, done bool) error {
	st.e2e = time.Since(start)
	if !st.usage {
		st.output = c.chunks
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stream broken after %d chunks: %w", c.chunks, err)
	}
	if !done {
		return errNoDone
	}
	if c.chunks == 0 {
		if st.output == 0 {
			return fmt.Errorf("stream carried no tokens")
		}
		// Tokens that decoded to empty text: the first arrived by the end.
		st.ttft = st.e2e
	}
	return nil
}

type chunkEvent struct {
	content bool
	usage   *openai.Usage
	timings *openai.Timings
}

var errorKey = []byte(`"error"`)

// parseChunk reads one chunk. Content chunks, the bulk of a stream, are
// recognised without decoding (a non-empty "text" or "content" string):
// thousands of streams at once make a full decode of every chunk the
// client's main cost. Chunks with usage or an error are decoded.
func parseChunk(data []byte) (chunkEvent, error) {
	var ev chunkEvent
	if len(data) == 0 || data[0] != '{' {
		return ev, fmt.Errorf("malformed stream event %q", truncate(data))
	}
	if bytes.HasPrefix(data, []byte(`{"error"`)) || (bytes.Contains(data, errorKey) && !bytes.Contains(data, []byte(`"choices"`))) {
		var eb openai.ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error.Message != "" {
			return ev, fmt.Errorf("error in stream: %s", eb.Error.Message)
		}
	}
	c, err := openai.ReadChunk(data)
	if err != nil {
		return ev, fmt.Errorf("malformed usage chunk: %w", err)
	}
	ev.content, ev.usage, ev.timings = c.Content, c.Usage, c.Timings
	return ev, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}
