package engine

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// closedLoop keeps inFlight requests in the engine, adding the next prompt
// of the workload whenever one finishes, until n requests have finished.
type closedLoop struct {
	e       *Engine
	prompts []string
	outputs []int
	next    int
	done    int
	now     time.Duration
	free    []*Request
	events  []kvevents.Event // drained after every step when the engine records them
}

func (c *closedLoop) Token(*Request, time.Duration) {}

func (c *closedLoop) Finished(r *Request, _ time.Duration) {
	c.done++
	c.free = append(c.free, r)
}

func (c *closedLoop) addNext() {
	r := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	i := c.next % len(c.prompts)
	c.next++
	*r = Request{ID: uint64(c.next), Prompt: c.prompts[i], OutputTokens: c.outputs[i]}
	if err := c.e.Add(r, c.now); err != nil {
		panic(err)
	}
}

func (c *closedLoop) run(n, inFlight int) {
	for range inFlight {
		c.free = append(c.free, &Request{})
	}
	for c.done < n {
		for len(c.free) > 0 {
			c.addNext()
		}
		c.now += c.e.Step(c.now, c)
		if c.e.kvEvents {
			c.events = c.e.TakeKVEvents(c.events[:0])
		}
	}
}

// mixedWorkload is mostly short chat requests under a few shared system
// prompts plus a minority of long summarisation requests.
func mixedWorkload(n int) ([]string, []int) {
	rng := rand.New(rand.NewPCG(1, 2))
	systems := make([]string, 8)
	for i := range systems {
		systems[i] = prompt(0, 1000*i+1, 1000*i+2, 1000*i+3, 1000*i+4) // 64 tokens
	}
	prompts, outputs := make([]string, n), make([]int, n)
	for i := range n {
		var b strings.Builder
		b.WriteString(systems[rng.IntN(len(systems))])
		if rng.IntN(10) == 0 {
			for range 250 { // 4,000-token document
				b.WriteString(block(rng.IntN(1 << 30)))
			}
			outputs[i] = 200
		} else {
			for range 1 + rng.IntN(8) {
				b.WriteString(block(rng.IntN(1 << 30)))
			}
			outputs[i] = 20 + rng.IntN(100)
		}
		b.WriteString("tail")
		prompts[i] = b.String()
	}
	return prompts, outputs
}

// BenchmarkEngine runs a mixed workload through one h100-llama3-8b engine
// with 64 requests in flight; ns/op is the CPU cost of one request from Add
// to Finished, all its steps and tokens included.
func BenchmarkEngine(b *testing.B) {
	p, _ := LookupPreset("h100-llama3-8b")
	prompts, outputs := mixedWorkload(4096)
	c := &closedLoop{e: New(p, 0), prompts: prompts, outputs: outputs}
	c.run(2000, 64) // warm the cache and the pools
	b.ReportAllocs()
	b.ResetTimer()
	c.done = 0
	c.run(b.N, 0)
	b.StopTimer()
	st := c.e.Stats()
	b.ReportMetric(float64(st.PrefixHits)/float64(st.PrefixQueries), "hit-rate")
}

// BenchmarkEngineKVEvents is BenchmarkEngine with KV cache events recorded
// and drained after every step, as the emulator does when it publishes them.
func BenchmarkEngineKVEvents(b *testing.B) {
	p, _ := LookupPreset("h100-llama3-8b")
	prompts, outputs := mixedWorkload(4096)
	c := &closedLoop{e: New(p, 0), prompts: prompts, outputs: outputs}
	c.e.SetKVEvents(true)
	c.run(2000, 64)
	b.ReportAllocs()
	b.ResetTimer()
	c.done = 0
	c.run(b.N, 0)
}

// BenchmarkEngineLongPrompts is the Mooncake-like case: 12,000-token
// prompts that share long prefixes, 300 output tokens, 32 in flight.
func BenchmarkEngineLongPrompts(b *testing.B) {
	p, _ := LookupPreset("h100-llama3-8b")
	rng := rand.New(rand.NewPCG(3, 4))
	docs := make([]string, 16)
	for i := range docs {
		var s strings.Builder
		for range 500 { // 8,000 shared tokens
			s.WriteString(block(rng.IntN(1 << 30)))
		}
		docs[i] = s.String()
	}
	prompts, outputs := make([]string, 1024), make([]int, 1024)
	for i := range prompts {
		var s strings.Builder
		s.WriteString(docs[rng.IntN(len(docs))])
		for range 250 { // 4,000 own tokens
			s.WriteString(block(rng.IntN(1 << 30)))
		}
		prompts[i], outputs[i] = s.String(), 300
	}
	c := &closedLoop{e: New(p, 0), prompts: prompts, outputs: outputs}
	c.run(200, 32)
	b.ReportAllocs()
	b.ResetTimer()
	c.done = 0
	c.run(b.N, 0)
}
