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
}

// readStream reads an SSE stream of chat or completion chunks ("data: {...}"
// events ended by "data: [DONE]"). TTFT is the arrival of the first chunk
// with non-empty text; each later text chunk adds one inter-token gap.
// Token counts come from the usage chunk; without one, each text chunk
// counts as a token.
func readStream(body io.Reader, start time.Time) (st streamStats, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxEventBytes)
	var last time.Time
	chunks := 0
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
			if chunks == 0 {
				st.ttft = now.Sub(start)
			} else {
				st.itl = append(st.itl, now.Sub(last))
			}
			last = now
			chunks++
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
	st.e2e = time.Since(start)
	if !st.usage {
		st.output = chunks
	}
	if err := sc.Err(); err != nil {
		return st, fmt.Errorf("stream broken after %d chunks: %w", chunks, err)
	}
	if !done {
		return st, errNoDone
	}
	if chunks == 0 {
		if st.output == 0 {
			return st, fmt.Errorf("stream carried no tokens")
		}
		// Tokens that decoded to empty text: the first arrived by the end.
		st.ttft = st.e2e
	}
	return st, nil
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
