package proxy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/openai"
)

// tally reads, without altering it, what a relayed 2xx body says of its
// tokens: in an event stream, each data event is read as a chunk
// (openai.ReadChunk: token chunks are recognised without a decode), the
// gap between token chunks is the router-side inter-token latency, and a
// usage chunk gives the counts; in a JSON body, the usage object is read
// from its last bytes, where the engines put it. It holds at most one
// event line (maxTallyLine) or the JSON body's tail (tallyTail).
type tally struct {
	sse bool
	// line is the stream's current line; skip marks one longer than
	// maxTallyLine, which is not read.
	line []byte
	skip bool
	// chunks counts token chunks; first and last are the arrivals of the
	// first and the latest.
	chunks      int
	first, last time.Time
	// itl observes the gaps; nil: not observed.
	itl prometheus.Observer
	// usage is the response's, nil until read; model the model the
	// response names, read from its first data event or bytes
	// (modelSeen once they were, or from the start when nothing reports
	// the model: tracing is off).
	usage     *openai.Usage
	timings   *openai.Timings
	model     string
	modelSeen bool
	// head and tail are the JSON body's first and last bytes.
	head, tail []byte
	// agent marks the body of a Responses or Messages request, read as
	// its API writes it (openai.ReadAgentEvent); agentUsage is what its
	// events reported, responseID the Responses API's id of the answer
	// (a stream's response.created, a JSON body's first "id"), start
	// the JSON body's first bytes, where the id is.
	agent      bool
	agentUsage *openai.AgentUsage
	// resumed marks a stream moved to another engine (migrate.go): the
	// gap before its next token chunk is the move's, not an inter-token
	// latency.
	resumed    bool
	responseID string
	start      []byte
}

// maxTallyLine bounds the event line a tally reads; tallyTail is how much
// of a JSON body's end it keeps to find the usage, tallyHead of its start
// to find the model.
const (
	maxTallyLine = 64 << 10
	tallyTail    = 2 << 10
	tallyHead    = 512
)

// readModel reads the JSON body's model from its head.
func (t *tally) readModel() {
	t.model, t.modelSeen, t.head = responseModel(t.head), true, nil
}

// note reads p, relayed at now.
func (t *tally) note(p []byte, now time.Time) {
	if !t.sse {
		if t.agent && len(t.start) < tallyHead {
			t.start = append(t.start, p[:min(len(p), tallyHead-len(t.start))]...)
		}
		if !t.modelSeen {
			t.head = append(t.head, p[:min(len(p), tallyHead-len(t.head))]...)
			if len(t.head) == tallyHead {
				t.readModel()
			}
		}
		if len(p) >= tallyTail {
			t.tail = append(t.tail[:0], p[len(p)-tallyTail:]...)
			return
		}
		if drop := len(t.tail) + len(p) - tallyTail; drop > 0 {
			t.tail = append(t.tail[:0], t.tail[drop:]...)
		}
		t.tail = append(t.tail, p...)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.keep(p)
			return
		}
		t.keep(p[:i])
		if !t.skip {
			t.event(bytes.TrimSuffix(t.line, []byte("\r")), now)
		}
		t.line, t.skip = t.line[:0], false
		p = p[i+1:]
	}
}

// keep adds p to the current line, within maxTallyLine.
func (t *tally) keep(p []byte) {
	if t.skip || len(t.line)+len(p) > maxTallyLine {
		t.skip = true
		return
	}
	t.line = append(t.line, p...)
}

// event reads one line of the stream.
func (t *tally) event(line []byte, now time.Time) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return // [DONE]
	}
	if !t.modelSeen {
		t.model, t.modelSeen = responseModel(data), true
	}
	if t.agent {
		t.agentEvent(data, now)
		return
	}
	c, err := openai.ReadChunk(data)
	if err != nil {
		return
	}
	if c.Usage != nil {
		t.usage = c.Usage
	}
	if c.Timings != nil {
		t.timings = c.Timings
	}
	if c.Content {
		t.token(now)
	}
}

// token counts a token chunk relayed at now.
func (t *tally) token(now time.Time) {
	if t.chunks > 0 && t.itl != nil && !t.resumed {
		t.itl.Observe(now.Sub(t.last).Seconds())
	}
	t.resumed = false
	if t.chunks == 0 {
		t.first = now
	}
	t.chunks++
	t.last = now
}

// agentEvent reads one data event of a Responses or Messages stream.
func (t *tally) agentEvent(data []byte, now time.Time) {
	c, err := openai.ReadAgentEvent(data)
	if err != nil {
		return
	}
	if c.ResponseID != "" && t.responseID == "" {
		t.responseID = c.ResponseID
	}
	if c.Usage != nil {
		if t.agentUsage == nil {
			t.agentUsage = &openai.AgentUsage{}
		}
		t.agentUsage.Merge(c.Usage)
		t.usage = t.agentUsage.Usage()
	}
	if c.Content {
		t.token(now)
	}
}

// finish reads a complete JSON body's usage from its tail.
func (t *tally) finish() {
	if t.sse {
		return
	}
	if !t.modelSeen {
		t.readModel()
	}
	if t.agent {
		var u openai.AgentUsage
		if tailObject(t.tail, `"usage":`, &u) {
			t.usage = u.Usage()
		}
		t.responseID, t.start = firstString(t.start, idKey), nil
		t.tail = nil
		return
	}
	var u openai.Usage
	if tailObject(t.tail, `"usage":`, &u) {
		t.usage = &u
	}
	var tm openai.Timings
	if tailObject(t.tail, `"timings":`, &tm) {
		t.timings = &tm
	}
	t.tail = nil
}

// tailObject decodes into v the object that follows the last key (`"name":`)
// in tail, reporting whether it could.
func tailObject(tail []byte, key string, v any) bool {
	i := bytes.LastIndex(tail, []byte(key+"{"))
	return i >= 0 && json.NewDecoder(bytes.NewReader(tail[i+len(key):])).Decode(v) == nil
}

// cached is the prompt tokens the engine reported reusing and its count
// of the prompt (see openai.ReportedCached); ok is false when it reported
// none.
func (t *tally) cached() (cached, prompt int, ok bool) {
	cached, ok = openai.ReportedCached(t.usage, t.timings)
	if ok && t.usage != nil {
		prompt = t.usage.PromptTokens
	}
	return cached, prompt, ok
}

// output is the response's generated tokens: its usage's, else its token
// chunks.
func (t *tally) output() int {
	if t.usage != nil {
		return t.usage.CompletionTokens
	}
	return t.chunks
}

// decoding is the time from the stream's first token chunk to its last,
// 0 for a stream of fewer than two (or a JSON body).
func (t *tally) decoding() time.Duration {
	if t.chunks < 2 {
		return 0
	}
	return t.last.Sub(t.first)
}

// modelKey starts the response's model in its first chunk or JSON body,
// idKey its id.
var (
	modelKey = []byte(`"model":"`)
	idKey    = []byte(`"id":"`)
)

// responseModel is the model named in p (the response's first bytes),
// "" when they name none. A name with an escape is left out.
func responseModel(p []byte) string { return firstString(p, modelKey) }

// firstString is the string value after the first key (`"name":"`) in p,
// "" when p has none, or one with an escape or longer than 256 bytes.
func firstString(p, key []byte) string {
	i := bytes.Index(p, key)
	if i < 0 {
		return ""
	}
	rest := p[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 || j > 256 || bytes.IndexByte(rest[:j], '\\') >= 0 {
		return ""
	}
	return string(rest[:j])
}
