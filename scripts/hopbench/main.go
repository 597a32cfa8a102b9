// Command hopbench holds the pieces of scripts/overhead.sh that need more
// than a shell: the chat bodies it sends, a streaming backend that emits
// tokens at a fixed pace, and a client that holds many streams at once and
// reports the gaps between their tokens.
//
//	hopbench ports N                       print N free loopback TCP ports
//	hopbench body --kind chat --bytes 4096 print a chat-completion body of exactly that size
//	hopbench sse-backend --listen ADDR     stream a token every --interval, --tokens of them
//	hopbench sse-client --target URL       open --streams streams at once; print ITL percentiles
//	hopbench go-proxy --listen ADDR --target URL
//	                                       the standard library's reverse proxy and nothing else:
//	                                       the floor of any hop built on net/http
//
// It is a benchmark fixture, not part of the router: it only wires kvroute's
// own load generator (internal/bench) and workloads to a fixed-pace backend.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/workload"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hopbench ports|body|sse-backend|sse-client [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "ports":
		err = ports(args)
	case "body":
		err = body(args)
	case "sse-backend":
		err = sseBackend(args)
	case "sse-client":
		err = sseClient(args)
	case "go-proxy":
		err = goProxy(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "hopbench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// ports prints N distinct free loopback ports, one a line. All N listeners
// are held open until every port is chosen, so no two are the same.
func ports(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: hopbench ports N")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return fmt.Errorf("bad count %q", args[0])
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	}
	return nil
}

// body prints a non-streaming chat-completion body of exactly --bytes bytes.
// chat: a system prompt and turns of English conversation; agent: the same
// with tool definitions, tool calls and long tool outputs (file contents,
// logs), as an agent's context grows. The same flags print the same bytes.
func body(args []string) error {
	fs := flag.NewFlagSet("body", flag.ContinueOnError)
	kind := fs.String("kind", "chat", "chat or agent")
	size := fs.Int("bytes", 4096, "exact size of the body in bytes (at least 1024)")
	model := fs.String("model", "bench-model", "the body's model")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kind != "chat" && *kind != "agent" {
		return fmt.Errorf("--kind %q: want chat or agent", *kind)
	}
	b, err := chatBody(*kind == "agent", *size, *model)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(b)
	return err
}

// sseBackend serves POST /v1/chat/completions and /v1/completions as SSE
// streams of --tokens chat chunks, the first at once and then one every
// --interval from the request's arrival (deadlines from the start, so that
// a late wake-up does not shift the later tokens), and GET /health and
// /v1/models. Request bodies are read in full and ignored.
func sseBackend(args []string) error {
	fs := flag.NewFlagSet("sse-backend", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8000", "address to listen on")
	interval := fs.Duration("interval", 40*time.Millisecond, "time between two tokens of a stream")
	tokens := fs.Int("tokens", 100, "tokens per stream")
	model := fs.String("model", "bench-stream", "model listed by /v1/models")
	if err := fs.Parse(args); err != nil {
		return err
	}
	chunk := []byte(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"` + *model +
		`","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")
	last := []byte(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"` + *model +
		`","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","created":1,"owned_by":"hopbench"}]}`, *model)
	})
	stream := func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		flush := w.(http.Flusher)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for i := range *tokens {
			if i > 0 {
				timer.Reset(time.Until(start.Add(time.Duration(i) * *interval)))
				select {
				case <-timer.C:
				case <-r.Context().Done():
					return
				}
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
			flush.Flush()
		}
		_, _ = w.Write(last)
	}
	mux.HandleFunc("POST /v1/chat/completions", stream)
	mux.HandleFunc("POST /v1/completions", stream)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// sseClient opens --streams streaming chat requests (the built-in chat
// workload's bodies) with kvroute's own load generator, started evenly over
// --spread so that their tokens are evenly phased, and prints one line:
//
//	SSE label=L streams=N errors=E window_ms=A-B gaps=G itl_p50_ms=... itl_p99_ms=... itl_p999_ms=... itl_max_ms=... ttft_p99_ms=...
//
// The gaps are the intervals between two consecutive content events of a
// stream that end while all streams are open (window_ms, from the start of
// the run), pooled over the streams.
func sseClient(args []string) error {
	fs := flag.NewFlagSet("sse-client", flag.ContinueOnError)
	target := fs.String("target", "", "base URL, e.g. http://127.0.0.1:8080")
	streams := fs.Int("streams", 1000, "streams held at once")
	spread := fs.Duration("spread", time.Second, "the streams start evenly over this time")
	model := fs.String("model", "bench-stream", "model sent in the bodies")
	label := fs.String("label", "run", "name printed with the result")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" || *streams < 1 {
		return errors.New("--target and a positive --streams are required")
	}
	reqs, err := workload.Load("chat", workload.Options{Rate: 1000, Limit: *streams, Seed: 1})
	if err != nil {
		return err
	}
	for i := range reqs {
		reqs[i].At = time.Duration(i) * *spread / time.Duration(len(reqs))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	samples, _, err := bench.Drive(ctx, bench.Config{Target: *target, Model: *model, Requests: reqs, MaxConcurrency: *streams})
	if err != nil {
		return err
	}
	// Only the gaps that end while every stream is open count: from the
	// last stream's first token to the first stream's end. Outside it
	// fewer streams run, and connections are still being set up.
	var lo, hi time.Duration = 0, 1 << 62
	var ttfts []time.Duration
	errs, firstErr := 0, ""
	for _, s := range samples {
		if s.Err != "" {
			if errs == 0 {
				firstErr = s.Err
			}
			errs++
			continue
		}
		lo, hi = max(lo, s.Start+s.TTFT), min(hi, s.Start+s.E2E)
		ttfts = append(ttfts, s.TTFT)
	}
	var gaps []time.Duration
	for _, s := range samples {
		t := s.Start + s.TTFT
		for _, g := range s.ITL {
			if t += g; s.Err == "" && t > lo && t <= hi {
				gaps = append(gaps, g)
			}
		}
	}
	if len(gaps) == 0 {
		return fmt.Errorf("no inter-token gap while all streams were open (%d errors; first: %s; window %v-%v)", errs, firstErr, lo, hi)
	}
	slices.Sort(gaps)
	slices.Sort(ttfts)
	fmt.Printf("SSE label=%s streams=%d errors=%d window_ms=%.0f-%.0f gaps=%d itl_p50_ms=%.3f itl_p99_ms=%.3f itl_p999_ms=%.3f itl_max_ms=%.3f ttft_p99_ms=%.3f\n",
		*label, len(samples), errs, ms(lo), ms(hi), len(gaps), ms(quantile(gaps, 0.50)), ms(quantile(gaps, 0.99)),
		ms(quantile(gaps, 0.999)), ms(gaps[len(gaps)-1]), ms(quantile(ttfts, 0.99)))
	if errs > 0 {
		fmt.Fprintf(os.Stderr, "hopbench sse-client: %s: %d of %d streams failed; first: %s\n", *label, errs, len(samples), firstErr)
	}
	return nil
}

// quantile is the nearest-rank q-quantile of sorted d.
func quantile(d []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(d))+0.5) - 1
	return d[min(len(d)-1, max(0, i))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sentences are the English that bodies are made of. None needs escaping in
// JSON, so a message's length in the body is its length in characters.
var sentences = []string{
	"The deployment finished a few minutes ago, but the latency graphs still show a slow climb after every restart.",
	"Could you explain why the cache hit rate drops when we add a second replica behind the same load balancer?",
	"In short, each replica keeps its own copy of the prompt prefixes it has seen, so spreading requests evenly spreads the cache thin.",
	"We tried pinning every conversation to one server, and the hit rate went back up, but one machine ended up far busier than the others.",
	"A bounded form of consistent hashing keeps most conversations in place while moving the overflow to the least loaded server.",
	"Please summarise the trade-offs in a short table that a product manager could read in a minute.",
	"Long system prompts are shared by every request of an application, which makes them the cheapest part to cache.",
	"The queue on the second server grew to forty requests during the morning peak and took several minutes to drain.",
	"Time to first token matters most for chat, while the total generation time matters most for batch summarisation jobs.",
	"I would start by measuring the prefill rate of each server with a few prompts of known length, then compare the estimates with reality.",
	"Thanks, that helps a lot; now write a short checklist we can follow before the next capacity review.",
	"Make sure the health checks do not take a busy server out of rotation just because its answers are slow.",
	"When a server restarts, its cache is empty, so the router should forget what it believed that server held.",
	"The second table in the report shows the same workload at three levels of offered load, from half to nine tenths of capacity.",
	"If the router itself becomes the bottleneck, the whole fleet slows down, which is why its own overhead has to stay small.",
	"Here is the plan: first reproduce the problem on a test machine, then change one setting at a time and record every result.",
}

// tool outputs are what an agent's tools return: files and logs.
var toolLines = []string{
	"func (s *Server) handle(w http.ResponseWriter, r *http.Request) {",
	"\tif err := s.limiter.Wait(r.Context()); err != nil {",
	"\t\thttp.Error(w, err.Error(), http.StatusTooManyRequests)",
	"\t\treturn",
	"\t}",
	"2026-11-30T08:14:02.118Z INFO  worker-3 processed batch 1834 in 12 ms (queue depth 7)",
	"2026-11-30T08:14:02.204Z WARN  worker-1 retrying upstream request after connection reset (attempt 2 of 3)",
	"2026-11-30T08:14:02.377Z INFO  scheduler moved 4 sessions from gpu-2 to gpu-5 after a failed health check",
	"    assert response.status_code == 200, f\"unexpected status {response.status_code}\"",
	"-rw-r--r-- 1 build build  18342 Nov 30 08:10 internal/proxy/forward.go",
	"ok  \tgithub.com/example/service/internal/cache\t0.412s\tcoverage: 81.4% of statements",
	"| region | requests | p50 ms | p99 ms | errors |",
	"| eu-west | 1,204,331 | 41 | 388 | 12 |",
}

type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatRequest struct {
	Model     string            `json:"model"`
	Messages  []message         `json:"messages"`
	Tools     []json.RawMessage `json:"tools,omitempty"`
	MaxTokens int               `json:"max_tokens"`
	Stream    bool              `json:"stream"`
}

var agentTools = []json.RawMessage{
	json.RawMessage(`{"type":"function","function":{"name":"read_file","description":"Read a file of the repository","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}`),
	json.RawMessage(`{"type":"function","function":{"name":"run_shell","description":"Run a shell command in the repository and return its output","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}`),
}

// rng is a small deterministic generator (xorshift64*): bodies must be the
// same bytes on every machine and Go version.
type rng uint64

func (r *rng) intn(n int) int {
	x := uint64(*r)
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*r = rng(x)
	return int((x * 2685821657736338717) >> 33 % uint64(n))
}

// prose is n sentences drawn from r.
func prose(r *rng, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = sentences[r.intn(len(sentences))]
	}
	return strings.Join(parts, " ")
}

// toolOutput is about n bytes of file and log lines drawn from r.
func toolOutput(r *rng, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(toolLines[r.intn(len(toolLines))])
		sb.WriteByte('\n')
	}
	return sb.String()
}

// chatBody builds the body: turns are added while the body stays under the
// size, and a last user message of prose makes it exactly size bytes.
func chatBody(agent bool, size int, model string) ([]byte, error) {
	if size < 1024 {
		return nil, fmt.Errorf("--bytes %d: at least 1024", size)
	}
	r := rng(0x9e3779b97f4a7c15)
	req := chatRequest{Model: model, MaxTokens: 256, Messages: []message{{Role: "system",
		Content: "You are a careful assistant for the engineers who run an inference fleet. Answer precisely, say when you are unsure, and keep answers short unless asked for detail. " + prose(&r, 3)}}}
	if agent {
		req.Tools = agentTools
		req.Messages = append(req.Messages, message{Role: "user", Content: "Find out why the integration tests of the cache package fail on the build machine and propose a fix. " + prose(&r, 2)})
	}
	encode := func(req chatRequest) []byte {
		b, _ := json.Marshal(req)
		return b
	}
	const room = 300 // what the last user message needs at the least
	for turn := 0; ; turn++ {
		next := req
		next.Messages = slices.Clone(req.Messages)
		if agent {
			call := toolCall{ID: fmt.Sprintf("call_%d", turn), Type: "function"}
			call.Function.Name, call.Function.Arguments = "read_file", fmt.Sprintf(`{"path":"internal/cache/part%d.go"}`, turn)
			if turn%2 == 1 {
				call.Function.Name, call.Function.Arguments = "run_shell", `{"command":"go test ./internal/cache/ -run Integration -v"}`
			}
			next.Messages = append(next.Messages,
				message{Role: "assistant", Content: prose(&r, 1), ToolCalls: []toolCall{call}},
				message{Role: "tool", ToolCallID: call.ID, Content: toolOutput(&r, 8000+r.intn(16000))})
		} else {
			next.Messages = append(next.Messages,
				message{Role: "user", Content: prose(&r, 1+r.intn(3))},
				message{Role: "assistant", Content: prose(&r, 2+r.intn(5))})
		}
		if len(encode(next)) > size-room {
			break
		}
		req = next
	}
	req.Messages = append(req.Messages, message{Role: "user"})
	fill := size - len(encode(req))
	if fill < 0 {
		return nil, fmt.Errorf("--bytes %d: this kind of body needs at least %d", size, size-fill)
	}
	text := prose(&r, 4)
	for len(text) < fill {
		text += " " + prose(&r, 4)
	}
	req.Messages[len(req.Messages)-1].Content = strings.TrimSpace(text[:fill])
	b := encode(req)
	if len(b) != size {
		// Only trimming a trailing space can shorten the fill; pad it back.
		req.Messages[len(req.Messages)-1].Content += strings.Repeat(".", size-len(b))
		b = encode(req)
	}
	return b, nil
}

// goProxy serves a bare httputil.ReverseProxy to --target: no parsing, no
// routing, no metrics, with a transport that keeps as many idle
// connections as kvroute's does. Whatever a hop built on net/http costs
// beyond it is that hop's own work.
func goProxy(args []string) error {
	fs := flag.NewFlagSet("go-proxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on")
	target := fs.String("target", "", "backend base URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--target %q: want a URL", *target)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
