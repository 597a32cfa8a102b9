package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/racetest"
	"github.com/kvroute/kvroute/internal/request"
)

// writeTrace writes lines to a trace file and returns its path.
func writeTrace(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// parse parses a request's body as the router will.
func parse(t *testing.T, r *Request) *request.View {
	t.Helper()
	v, err := request.Parse(r.Kind, r.Body("test-model"), request.Options{})
	if err != nil {
		t.Fatalf("body does not parse: %v", err)
	}
	return v
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestTraceSharedPrefixes(t *testing.T) {
	p := writeTrace(t,
		`{"timestamp": 0, "input_length": 2000, "output_length": 7, "hash_ids": [0, 1, 2, 3]}`,
		`{"timestamp": 5, "input_length": 1300, "output_length": 0, "hash_ids": [0, 1, 5]}`,
		`{"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [0, 7]}`,
		`{"timestamp": 12, "input_length": 1000, "output_length": 3, "hash_ids": [8, 1]}`,
		`{"timestamp": 20, "input_length": 1200, "output_length": 3, "hash_ids": [0]}`,
	)
	reqs, err := Load(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	views := make([]*request.View, len(reqs))
	for i := range reqs {
		views[i] = parse(t, &reqs[i])
		v := views[i]
		if len(v.Prompt) != reqs[i].InputTokens*request.BytesPerToken || v.PromptTokens != reqs[i].InputTokens {
			t.Errorf("request %d: prompt of %d bytes (%d tokens), want %d tokens", i, len(v.Prompt), v.PromptTokens, reqs[i].InputTokens)
		}
		if v.Kind != request.Completion || v.Model != "test-model" || !v.Stream || !v.IncludeUsage || !v.IgnoreEOS ||
			v.MaxTokens != reqs[i].OutputTokens || v.MinTokens != reqs[i].OutputTokens {
			t.Errorf("request %d: view %+v does not ask for exactly %d streamed tokens", i, v, reqs[i].OutputTokens)
		}
		if strings.Trim(v.Prompt, "abcdefghijklmnopqrstuvwxyz ") != "" {
			t.Errorf("request %d: prompt has characters other than lowercase letters and spaces", i)
		}
	}
	if reqs[1].OutputTokens != 1 {
		t.Errorf("output_length 0 gives %d output tokens, want 1", reqs[1].OutputTokens)
	}
	tests := []struct {
		a, b, shared int // shared hash ids
	}{
		{0, 1, 2}, {0, 2, 1}, {1, 2, 1}, {0, 3, 0}, {2, 3, 0},
	}
	for _, tc := range tests {
		cp := commonPrefix(views[tc.a].Prompt, views[tc.b].Prompt)
		lo := tc.shared * blockBytes
		if cp < lo || cp >= lo+idTagLen {
			t.Errorf("requests %d and %d share %d hash ids but %d prompt bytes, want %d (plus less than %d of the id tag)", tc.a, tc.b, tc.shared, cp, lo, idTagLen)
		}
	}
	// A request with fewer ids than its length needs is padded with text
	// of its own: it shares exactly its one block with request 0.
	if cp := commonPrefix(views[0].Prompt, views[4].Prompt); cp < blockBytes || cp >= blockBytes+64 {
		t.Errorf("padded request shares %d bytes with request 0, want %d", cp, blockBytes)
	}
}

func TestTraceOptions(t *testing.T) {
	lines := []string{}
	for i := 0; i < 10; i++ {
		lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "input_length": 100, "output_length": 10, "hash_ids": [%d]}`, 1000*i, i))
	}
	p := writeTrace(t, lines...)
	tests := []struct {
		name string
		opt  Options
		want []time.Duration
	}{
		{"all", Options{}, durs(0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000)},
		{"limit", Options{Limit: 3}, durs(0, 1000, 2000)},
		{"speedup", Options{Speedup: 4, Limit: 3}, durs(0, 250, 500)},
		{"window rebased", Options{WindowStart: 2500 * time.Millisecond, WindowEnd: 5 * time.Second}, durs(0, 1000)},
		{"window open end", Options{WindowStart: 7 * time.Second}, durs(0, 1000, 2000)},
		{"window, speedup and limit", Options{WindowStart: 3 * time.Second, Speedup: 2, Limit: 2}, durs(0, 500)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := Load(p, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			var got []time.Duration
			for _, r := range reqs {
				got = append(got, r.At)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("arrivals %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := Load(p, Options{WindowStart: time.Hour}); err == nil {
		t.Error("an empty window loaded without error")
	}
}

func durs(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestTraceUnsortedKeepsArrivalOrder(t *testing.T) {
	p := writeTrace(t,
		`{"timestamp": 300, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 100, "input_length": 20, "output_length": 1, "hash_ids": [2]}`,
		`{"timestamp": 300, "input_length": 30, "output_length": 1, "hash_ids": [3]}`,
	)
	reqs, err := Load(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(reqs[0].InputTokens, reqs[0].At, reqs[1].InputTokens, reqs[1].At, reqs[2].InputTokens)
	if want := "20 0s 10 200ms 30"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestJitter(t *testing.T) {
	// Ten requests at each of two instants, 3 s apart, as the Mooncake
	// trace's timestamps come.
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%d]}`, i/10*3000, 10+i, i))
	}
	p := writeTrace(t, lines...)
	plain, err := Load(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const jitter = 20 * time.Millisecond
	load := func(seed int64) []Request {
		t.Helper()
		reqs, err := Load(p, Options{Jitter: jitter, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	order := func(reqs []Request) string {
		var b strings.Builder
		for _, r := range reqs {
			fmt.Fprint(&b, r.InputTokens, "@", r.At, " ")
		}
		return b.String()
	}
	a := load(1)
	if len(a) != len(plain) {
		t.Fatalf("%d requests, want %d", len(a), len(plain))
	}
	at := map[int]time.Duration{}
	for _, r := range plain {
		at[r.InputTokens] = r.At
	}
	moved := 0
	for i, r := range a {
		if d := r.At - at[r.InputTokens]; d < 0 || d >= jitter {
			t.Errorf("request %d moved by %v, want [0, %v)", r.InputTokens, d, jitter)
		}
		if i > 0 && r.At < a[i-1].At {
			t.Errorf("not in arrival order at %d: %v after %v", i, r.At, a[i-1].At)
		}
		if r.InputTokens != plain[i].InputTokens {
			moved++
		}
	}
	if moved == 0 {
		t.Error("jitter kept the trace order of requests given the same timestamp")
	}
	if order(load(1)) != order(a) {
		t.Error("the same seed gave different arrivals")
	}
	if order(load(2)) == order(a) {
		t.Error("seeds 1 and 2 gave the same arrivals")
	}
	if _, err := Load(p, Options{Jitter: -time.Millisecond}); err == nil || !strings.Contains(err.Error(), "jitter") {
		t.Errorf("negative jitter: err = %v, want an error naming jitter", err)
	}
}

func TestTraceErrors(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`
	tests := []struct {
		name, line, want string
	}{
		{"not JSON", `{"timestamp": 0,`, "invalid JSON"},
		{"wrong type", `{"timestamp": "x", "input_length": 10, "output_length": 1, "hash_ids": [1]}`, "invalid JSON"},
		{"missing timestamp", `{"input_length": 10, "output_length": 1, "hash_ids": [1]}`, `missing "timestamp"`},
		{"missing input", `{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`, `missing "input_length"`},
		{"missing output", `{"timestamp": 0, "input_length": 10, "hash_ids": [1]}`, `missing "output_length"`},
		{"missing ids", `{"timestamp": 0, "input_length": 10, "output_length": 1}`, `missing "hash_ids"`},
		{"empty ids", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}`, "empty"},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}`, "input_length 0"},
		{"huge input", `{"timestamp": 0, "input_length": 99999999, "output_length": 1, "hash_ids": [1]}`, "input_length 99999999"},
		{"negative output", `{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}`, "output_length -1"},
		{"negative timestamp", `{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}`, "timestamp -5"},
		{"negative id", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}`, "negative hash id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Line 3: a good line and a blank one come first.
			p := writeTrace(t, good, "", tc.line, good)
			_, err := Load(p, Options{})
			if err == nil {
				t.Fatal("loaded without error")
			}
			if !strings.Contains(err.Error(), "trace.jsonl:3: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want line 3 and %q", err, tc.want)
			}
		})
	}
	if _, err := Load(writeTrace(t, ""), Options{}); err == nil || !strings.Contains(err.Error(), "no requests") {
		t.Errorf("empty trace: error %v", err)
	}
	if _, err := Load("no-such-workload", Options{}); err == nil || !strings.Contains(err.Error(), "chat, chat-docs, agent, agentic, mixed, coding-agent") {
		t.Errorf("unknown name: error %v, want the list of built-ins", err)
	}
	for _, opt := range []Options{{Rate: -1}, {Speedup: -2}, {Limit: -1}, {WindowStart: 2, WindowEnd: 1}} {
		if _, err := Load("chat", opt); err == nil {
			t.Errorf("options %+v accepted", opt)
		}
	}
}

func TestBuiltinsDeterministic(t *testing.T) {
	for _, b := range Builtins() {
		t.Run(b[0], func(t *testing.T) {
			a, err := Load(b[0], Options{Seed: 7, Limit: 60})
			if err != nil {
				t.Fatal(err)
			}
			c, _ := Load(b[0], Options{Seed: 7, Limit: 60})
			d, _ := Load(b[0], Options{Seed: 8, Limit: 60})
			// The coding-agent loops' arrivals are sessions of several
			// requests each.
			if !strings.HasPrefix(b[0], "coding-agent") && len(a) != 60 || len(a) != len(c) {
				t.Fatalf("got %d and %d requests, want 60", len(a), len(c))
			}
			same := 0
			for i := range a {
				if a[i].At != c[i].At || a[i].Session != c[i].Session || !bytes.Equal(a[i].Body("m"), c[i].Body("m")) {
					t.Fatalf("request %d differs between two loads with the same seed", i)
				}
				if i < len(d) && bytes.Equal(a[i].Body("m"), d[i].Body("m")) {
					same++
				}
			}
			if same == len(a) {
				t.Error("another seed gives the same bodies")
			}
		})
	}
}

func TestBuiltinsBodies(t *testing.T) {
	for _, b := range Builtins() {
		t.Run(b[0], func(t *testing.T) {
			if b[1] == "" {
				t.Error("no description")
			}
			opt := Options{Seed: 1, Rate: 20, Duration: 30 * time.Second}
			if strings.HasPrefix(b[0], "coding-agent") {
				// Arrivals are sessions of several long requests each.
				opt.Duration = 3 * time.Second
			}
			reqs, err := Load(b[0], opt)
			if err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				r := &reqs[i]
				v := parse(t, r)
				if v.PromptTokens != r.InputTokens {
					t.Fatalf("request %d: InputTokens %d, rendered prompt has %d", i, r.InputTokens, v.PromptTokens)
				}
				if r.InputTokens+r.OutputTokens > ContextTokens {
					t.Errorf("request %d: %d+%d tokens exceed the context", i, r.InputTokens, r.OutputTokens)
				}
				if strings.HasPrefix(b[0], "coding-agent") {
					// The agents' APIs have no min_tokens: the outputs are
					// the engine's choice within the budget, in all three.
					if v.MaxTokens != r.OutputTokens || !v.Stream {
						t.Errorf("request %d: view %+v does not ask for at most %d streamed tokens", i, v, r.OutputTokens)
					}
				} else if v.MaxTokens != r.OutputTokens || v.MinTokens != r.OutputTokens || !v.IgnoreEOS || !v.Stream || !v.IncludeUsage {
					t.Errorf("request %d: view %+v does not ask for exactly %d streamed tokens", i, v, r.OutputTokens)
				}
				if i > 0 && r.At < reqs[i-1].At {
					t.Errorf("request %d arrives before request %d", i, i-1)
				}
			}
		})
	}
}

func TestChatHistoryGrows(t *testing.T) {
	reqs, err := Load("chat", Options{Seed: 3, Rate: 20, Duration: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	turns := map[string]int{}
	outs := map[string]int{}
	for i := range reqs {
		r := &reqs[i]
		if r.Session == "" || r.Kind != request.Chat {
			t.Fatalf("request %d: session %q kind %v", i, r.Session, r.Kind)
		}
		v := parse(t, r)
		if prev, ok := last[r.Session]; ok {
			if !strings.HasPrefix(v.Prompt, prev) {
				t.Fatalf("%s turn %d does not extend turn %d's prompt", r.Session, turns[r.Session], turns[r.Session]-1)
			}
			// What follows is the assistant reply, as long as the output
			// turn n asked for, then the next user message.
			rest, n := v.Prompt[len(prev):], outs[r.Session]*request.BytesPerToken
			if len(rest) < n || !strings.HasPrefix(rest[n:], "\n<|user|>\n") {
				t.Fatalf("%s: turn %d does not add a %d-byte reply and a user message", r.Session, turns[r.Session], n)
			}
		}
		last[r.Session] = v.Prompt
		outs[r.Session] = r.OutputTokens
		turns[r.Session]++
	}
	multi := 0
	for _, n := range turns {
		if n > 1 {
			multi++
		}
	}
	if multi < len(turns)/3 {
		t.Errorf("only %d of %d conversations have a second turn", multi, len(turns))
	}
}

func TestArrivals(t *testing.T) {
	tests := []struct {
		name   string
		opt    Options
		lo, hi int
	}{
		// Poisson: 600 expected, 4 standard deviations (~98) either side.
		{"rate 10 for 60s", Options{Rate: 10, Duration: time.Minute}, 502, 698},
		{"default 10/s for 60s", Options{}, 502, 698},
		{"limit without duration", Options{Rate: 1000, Limit: 250}, 250, 250},
		{"limit before duration", Options{Rate: 100, Limit: 50, Duration: time.Minute}, 50, 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := Load("mixed", tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if len(reqs) < tc.lo || len(reqs) > tc.hi {
				t.Errorf("%d requests, want %d..%d", len(reqs), tc.lo, tc.hi)
			}
			if tc.opt.Duration > 0 && reqs[len(reqs)-1].At >= tc.opt.Duration {
				t.Errorf("arrival %v past the duration", reqs[len(reqs)-1].At)
			}
		})
	}
}

func TestPromptTokensPerSecAndScaleTime(t *testing.T) {
	reqs := []Request{{At: 0, InputTokens: 100}, {At: time.Second, InputTokens: 300}, {At: 2 * time.Second, InputTokens: 600}}
	if got := PromptTokensPerSec(reqs); got != 500 {
		t.Errorf("PromptTokensPerSec = %v, want 1000 tokens / 2 s = 500", got)
	}
	ScaleTime(reqs, 0.5)
	if reqs[2].At != time.Second || reqs[1].At != 500*time.Millisecond {
		t.Errorf("scaled arrivals %v %v", reqs[1].At, reqs[2].At)
	}
	if got := PromptTokensPerSec(reqs); got != 1000 {
		t.Errorf("after scaling by 0.5: %v, want 1000", got)
	}
	if got := PromptTokensPerSec(reqs[:1]); got != 0 {
		t.Errorf("one request: %v, want 0", got)
	}
}

func TestRealTrace(t *testing.T) {
	const path = "../../../shared/traces/mooncake_conversation.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skip("trace not present")
	}
	reqs, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 {
		t.Errorf("%d requests, want 12031", len(reqs))
	}
	v := parse(t, &reqs[0])
	if v.PromptTokens != 6758 || v.MaxTokens != 500 {
		t.Errorf("first request: %d prompt tokens, %d output, want 6758 and 500", v.PromptTokens, v.MaxTokens)
	}
}

func FuzzLoadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}` + "\n"))
	f.Add([]byte(`{"timestamp": 1.5, "input_length": 10, "output_length": 0, "hash_ids": [3], "extra": true}`))
	f.Add([]byte("{}\n\n[1,2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadTrace(bytes.NewReader(data), "fuzz", Options{Limit: 3})
		if err != nil {
			return
		}
		for i := range reqs {
			if reqs[i].InputTokens > 50000 {
				continue // valid, but too slow to build in a fuzz loop
			}
			b := reqs[i].Body("m")
			if !json.Valid(b) {
				t.Fatalf("request %d: invalid JSON body", i)
			}
		}
	})
}

func BenchmarkTraceBody(b *testing.B) {
	reqs, err := ReadTrace(strings.NewReader(`{"timestamp": 0, "input_length": 12035, "output_length": 343, "hash_ids": [`+ids(24)+`]}`), "b", Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(12035 * 4)
	for b.Loop() {
		reqs[0].Body("m")
	}
}

func BenchmarkAppendBlock(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(blockBytes)
	buf := make([]byte, 0, blockBytes)
	for i := 0; b.Loop(); i++ {
		buf = appendBlock(buf[:0], uint64(i))
	}
}

func ids(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprint(i)
	}
	return strings.Join(s, ",")
}

// TestAgenticShape checks agentic's structure on its rendered prompts: a
// few harness prefixes (tools and system prompt) shared by many tasks; each
// step of a loop extends the previous step's prompt by the model's call and
// a tool result; sub-agents start from their parent's context and fork
// call, and the parent goes on with their answers; a few heavy one-off
// requests without a session.
func TestAgenticShape(t *testing.T) {
	racetest.Heavy(t, "renders two minutes of agentic traffic on one goroutine")
	reqs, err := Load("agentic", Options{Seed: 5, Rate: 40, Duration: 120 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	harness := map[string]map[string]bool{} // tools+system prefix -> sessions
	prompts := map[string][]string{}        // session -> its prompts in order
	outs := map[string][]int{}
	heavy := 0
	for i := range reqs {
		r := &reqs[i]
		v := parse(t, r)
		end := strings.Index(v.Prompt, "\n<|user|>\n")
		if end < 0 || !strings.HasPrefix(v.Prompt, "<|tools|>\n") {
			t.Fatalf("request %d: no tools and system prompt before the first user message", i)
		}
		if r.Session == "" {
			heavy++
			if r.InputTokens < 8000 {
				t.Errorf("request %d: a one-off request of only %d tokens", i, r.InputTokens)
			}
			continue
		}
		h := v.Prompt[:end]
		if harness[h] == nil {
			harness[h] = map[string]bool{}
		}
		harness[h][r.Session] = true
		prompts[r.Session] = append(prompts[r.Session], v.Prompt)
		outs[r.Session] = append(outs[r.Session], r.OutputTokens)
	}
	if len(harness) != 3 {
		t.Errorf("%d distinct harness prefixes, want 3", len(harness))
	}
	for h, sessions := range harness {
		if len(sessions) < len(prompts)/10 || len(h) < 4*3000 {
			t.Errorf("a harness prefix of %d bytes shared by %d of %d sessions", len(h), len(sessions), len(prompts))
		}
	}
	if share := float64(heavy) / float64(len(reqs)); share < 0.02 || share > 0.06 {
		t.Errorf("heavy one-off requests are %.1f%% of %d", 100*share, len(reqs))
	}

	long, forks, resumed := 0, 0, 0
	for id, ps := range prompts {
		if len(ps) >= 5 {
			long++
		}
		parent, _, isSub := strings.Cut(id, "/sub-")
		for k := 1; k < len(ps); k++ {
			// Step k's prompt is step k-1's (which ends with the generation
			// prompt), the call it returned (as long as the output asked
			// for), then a tool message.
			prev, rest := ps[k-1], ""
			if !strings.HasPrefix(ps[k], prev) {
				t.Fatalf("%s step %d does not extend step %d", id, k, k-1)
			}
			rest = ps[k][len(prev):]
			call := len("call ") + outs[id][k-1]*request.BytesPerToken
			if len(rest) <= call || !strings.HasPrefix(rest[call:], "\n<|tool|>\n") {
				t.Fatalf("%s step %d adds no call and tool result to step %d", id, k, k-1)
			}
		}
		if !isSub {
			continue
		}
		// A sub-agent's first prompt is its parent's prompt at some step,
		// that step's call, and its own part of the task.
		pp := prompts[parent]
		at := -1
		for k, p := range pp {
			if strings.HasPrefix(ps[0], p) && strings.HasPrefix(ps[0][len(p):], "call ") {
				at = k
			}
		}
		if at < 0 {
			t.Fatalf("%s does not start from a step of %s", id, parent)
		}
		call := len(pp[at]) + len("call ") + outs[parent][at]*request.BytesPerToken
		if !strings.HasPrefix(ps[0][call:], "\n<|user|>\nyour part ") {
			t.Errorf("%s does not add its part of the task after the fork call", id)
		}
		if id == parent+"/sub-0" {
			forks++
			if at+1 < len(pp) {
				// The parent resumes from the same call with one answer per
				// sub-agent.
				subs := 0
				for prompts[fmt.Sprintf("%s/sub-%d", parent, subs)] != nil {
					subs++
				}
				next := pp[at+1]
				resumed++
				if !strings.HasPrefix(next, ps[0][:call]) || strings.Count(next[call:], "<|tool|>\nsub-agent answer ") != subs || subs < 2 || subs > 4 {
					t.Errorf("%s resumes without the answers of its %d sub-agents", parent, subs)
				}
			}
		}
	}
	if long < len(prompts)/5 || forks < 10 || resumed < forks/2 {
		t.Errorf("%d of %d loops have 5 steps or more, %d forked, %d resumed", long, len(prompts), forks, resumed)
	}
	t.Logf("%d requests: %d loops and sub-agents (%d of 5 steps or more), %d forks (%d resumed), %d heavy", len(reqs), len(prompts), long, forks, resumed, heavy)
}

// TestCodingAgentVariants: the three APIs of the coding-agent loop carry
// the same sessions (same arrivals, turns and dependencies), each turn
// after its session's previous one, the Responses turns continuing it by
// id and the Messages ones under Claude Code's session header.
func TestCodingAgentVariants(t *testing.T) {
	load := func(name string) []Request {
		reqs, err := Load(name, Options{Seed: 2, Limit: 12})
		if err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	chat, resp, msgs := load("coding-agent"), load("coding-agent-responses"), load("coding-agent-messages")
	if len(chat) != len(resp) || len(chat) != len(msgs) || len(chat) < 12*4 {
		t.Fatalf("%d, %d and %d requests for 12 sessions", len(chat), len(resp), len(msgs))
	}
	for i := range chat {
		c, r, m := chat[i], resp[i], msgs[i]
		if c.At != r.At || c.At != m.At || c.After != r.After || c.After != m.After || c.Prev != 0 || m.Prev != 0 || r.Prev != r.After {
			t.Fatalf("request %d differs between the APIs: %+v %+v %+v", i, c, r, m)
		}
		if c.Kind != request.Chat || r.Kind != request.Responses || m.Kind != request.Messages || m.SessionHeader != ClaudeSessionHeader || c.Session == "" || m.Session != c.Session {
			t.Fatalf("request %d: kinds or sessions %+v %+v %+v", i, c, r, m)
		}
		if a := c.After; a > 0 && (a-1 >= i || chat[a-1].Session != c.Session) {
			t.Fatalf("request %d waits on request %d of another session or later", i, a-1)
		}
		if a := c.After; a > 0 {
			// The whole history is a prefix of the next turn's prompt.
			prev, cur := parse(t, &chat[a-1]), parse(t, &chat[i])
			if n := commonPrefix(prev.Prompt, cur.Prompt); n < len(prev.Prompt)-len("<|assistant|>\n") {
				t.Fatalf("request %d keeps %d bytes of its previous turn's %d", i, n, len(prev.Prompt))
			}
		}
	}
}
