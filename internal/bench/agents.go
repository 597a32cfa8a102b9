package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// The agents' loops: a turn is sent once the answer to its previous one is
// in (workload.Request.After), and a Responses turn names that answer's id
// (Request.Prev). Its latencies count from the later of its arrival and
// its previous turn's end: an agent cannot send earlier.

// turns are the ends of the requests other requests wait on.
type turns struct {
	done []chan struct{}
	// ids and ends are written before done[i] is closed.
	ids  []string
	ends []time.Time
	once []sync.Once
}

// newTurns is nil for a workload without dependencies.
func newTurns(reqs []*workload.Request) *turns {
	deps := false
	for i := range reqs {
		deps = deps || reqs[i].After > 0
	}
	if !deps {
		return nil
	}
	t := &turns{done: make([]chan struct{}, len(reqs)), ids: make([]string, len(reqs)), ends: make([]time.Time, len(reqs)), once: make([]sync.Once, len(reqs))}
	for i := range t.done {
		t.done[i] = make(chan struct{})
	}
	return t
}

// end records request i's answer id and end.
func (t *turns) end(i int, id string) {
	if t == nil {
		return
	}
	t.once[i].Do(func() {
		t.ids[i], t.ends[i] = id, time.Now()
		close(t.done[i])
	})
}

// doTurn sends request i once its previous turn is done.
func (r *runner) doTurn(ctx context.Context, wr *workload.Request, s *report.Sample, i int) {
	start, prev := r.start.Add(wr.At), ""
	if wr.After > 0 && r.turns != nil {
		select {
		case <-r.turns.done[wr.After-1]:
		case <-ctx.Done():
			s.Err = ctx.Err().Error()
			r.turns.end(i, "")
			return
		}
		if end := r.turns.ends[wr.After-1]; end.After(start) {
			start = end
		}
		if wr.Prev > 0 {
			prev = r.turns.ids[wr.Prev-1]
		}
	}
	id := r.send(ctx, wr, s, r.entry(i), start, prev)
	r.turns.end(i, id)
}

// readAgentStream reads a stream of the Responses or Messages API (named
// events, "data: {...}" lines, openai.ReadAgentEvent): TTFT is the first
// text delta, the usage the events' (Anthropic's message_start and
// message_delta merged), and the stream is complete at its last event
// (response.completed, message_stop). An error event fails it.
func readAgentStream(body io.Reader, start time.Time) (st streamStats, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxEventBytes)
	var tc tokenClock
	var usage openai.AgentUsage
	done := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(bytes.TrimRight(sc.Bytes(), "\r"), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		now := time.Now()
		if bytes.Contains(data, []byte(`"type":"error"`)) {
			var ev struct {
				Message string                      `json:"message"`
				Error   openai.AnthropicErrorDetail `json:"error"`
			}
			_ = json.Unmarshal(data, &ev)
			return st, fmt.Errorf("error in stream: %s%s", ev.Message, ev.Error.Message)
		}
		ev, err := openai.ReadAgentEvent(data)
		if err != nil {
			return st, fmt.Errorf("malformed event: %w", err)
		}
		if ev.ResponseID != "" {
			st.responseID = ev.ResponseID
		}
		if ev.Content {
			tc.tick(&st, start, now)
		}
		if ev.Usage != nil {
			usage.Merge(ev.Usage)
			st.usage = true
		}
		if bytes.Contains(data, []byte(`"type":"response.completed"`)) || bytes.Contains(data, []byte(`"type":"message_stop"`)) ||
			bytes.Contains(data, []byte(`"type":"response.incomplete"`)) {
			done = true
		}
	}
	if st.usage {
		u := usage.Usage()
		st.prompt, st.output = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			st.cached = u.PromptTokensDetails.CachedTokens
		}
	}
	return st, tc.end(&st, sc, start, done)
}
