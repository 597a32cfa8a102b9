package lifecycle

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// Tally reads, without altering it, what a relayed 2xx body says of its
// tokens: in an event stream, each data event is read as a chunk
// (openai.ReadChunk: token chunks are recognised without a decode), the
// gap between token chunks is the router-side inter-token latency, and a
// usage chunk gives the counts; in a JSON body, the usage object is read
// from its last bytes, where the engines put it. It holds at most one
// event line (maxTallyLine) or the JSON body's tail (tallyTail). Every
// front that sees a response body feeds one (the HTTP front's relay, the
// external processor's response phases), and BodyEnd is what it says to
// Settle. SSE, Agent, ITL and ModelSeen are set before the first Note.
//
// It is read by one goroutine at a time.
type Tally struct {
	// SSE marks an event stream.
	SSE bool
	// line is the stream's current line; skip marks one longer than
	// maxTallyLine, which is not read.
	line []byte
	skip bool
	// chunks counts token chunks; first and last are the arrivals of the
	// first and the latest.
	chunks      int
	first, last time.Time
	// ITL observes the gaps in seconds; nil: not observed.
	ITL Observer
	// usage is the response's, nil until read; model the model the
	// response names, read from its first data event or bytes
	// (ModelSeen once they were, or from the start when nothing reports
	// the model: tracing is off).
	usage     *openai.Usage
	timings   *openai.Timings
	model     string
	ModelSeen bool
	// head and tail are the JSON body's first and last bytes.
	head, tail []byte
	// Agent marks the body of a Responses or Messages request, read as
	// its API writes it (openai.ReadAgentEvent); agentUsage is what its
	// events reported, responseID the Responses API's id of the answer
	// (a stream's response.created, a JSON body's first "id"), start
	// the JSON body's first bytes, where the id is.
	Agent      bool
	agentUsage *openai.AgentUsage
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
func (t *Tally) readModel() {
	t.model, t.ModelSeen, t.head = responseModel(t.head), true, nil
}

// Note reads p, relayed at now.
func (t *Tally) Note(p []byte, now time.Time) {
	if !t.SSE {
		if t.Agent && len(t.start) < tallyHead {
			t.start = append(t.start, p[:min(len(p), tallyHead-len(t.start))]...)
		}
		if !t.ModelSeen {
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
func (t *Tally) keep(p []byte) {
	if t.skip || len(t.line)+len(p) > maxTallyLine {
		t.skip = true
		return
	}
	t.line = append(t.line, p...)
}

// event reads one line of the stream.
func (t *Tally) event(line []byte, now time.Time) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return // [DONE]
	}
	if !t.ModelSeen {
		t.model, t.ModelSeen = responseModel(data), true
	}
	if t.Agent {
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
func (t *Tally) token(now time.Time) {
	if t.chunks > 0 && t.ITL != nil {
		t.ITL.Observe(now.Sub(t.last).Seconds())
	}
	if t.chunks == 0 {
		t.first = now
	}
	t.chunks++
	t.last = now
}

// agentEvent reads one data event of a Responses or Messages stream.
func (t *Tally) agentEvent(data []byte, now time.Time) {
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

// Finish reads a complete JSON body's usage from its tail: once the body
// ended complete.
func (t *Tally) Finish() {
	if t.SSE {
		return
	}
	if !t.ModelSeen {
		t.readModel()
	}
	if t.Agent {
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

// Cached is the prompt tokens the engine reported reusing and its count
// of the prompt (see openai.ReportedCached); ok is false when it reported
// none.
func (t *Tally) Cached() (cached, prompt int, ok bool) {
	cached, ok = openai.ReportedCached(t.usage, t.timings)
	if ok && t.usage != nil {
		prompt = t.usage.PromptTokens
	}
	return cached, prompt, ok
}

// Output is the response's generated tokens: its usage's, else its token
// chunks.
func (t *Tally) Output() int {
	if t.usage != nil {
		return t.usage.CompletionTokens
	}
	return t.chunks
}

// Decoding is the time from the stream's first token chunk to its last,
// 0 for a stream of fewer than two (or a JSON body).
func (t *Tally) Decoding() time.Duration {
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

// Observer observes a value (prometheus.Observer is one).
type Observer interface{ Observe(float64) }

// Usage is the usage the response reported, nil for none.
func (t *Tally) Usage() *openai.Usage { return t.usage }

// Model is the model the response names, "" when unread.
func (t *Tally) Model() string { return t.model }

// ResponseID is the Responses API's id of the answer, "" for none.
func (t *Tally) ResponseID() string { return t.responseID }

// End is what the tallied 2xx body says to Settle, the body having ended
// complete or broken as the front saw it: its tokens (the usage's, else
// prompt, the router's estimate, and the token chunks), the cached tokens
// the engine reported, and the stream's decoding time.
func (t *Tally) End(complete bool, broken error, prompt int) BodyEnd {
	end := BodyEnd{Complete: complete, Broken: broken, Counted: true, In: prompt, Out: t.Output()}
	if t.usage != nil {
		end.In = t.usage.PromptTokens
	}
	end.Cached, _, end.HasCached = t.Cached()
	end.Decoding = t.Decoding()
	return end
}
