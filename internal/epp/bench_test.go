package epp_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/server"
)

// benchRig is a router with the picker on over n engines that are never
// sent anything (the benchmark is the picker's: the data plane forwards),
// its fleet healthy, its engines unscraped.
func benchRig(b testing.TB, n int) *rig {
	b.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.EPP = config.EPP{Listen: "127.0.0.1:0"}
	cfg.Health.Path = ""
	cfg.Engines.Enabled = false
	rg := &rig{byAddr: map[string]*engine{}}
	for i := range n {
		addr := fmt.Sprintf("10.%d.%d.%d:8000", i/65536, i/256%256, i%256+1)
		cfg.Backends = append(cfg.Backends, config.Backend{URL: "http://" + addr, Name: fmt.Sprintf("e%d", i), Models: []string{"m"}})
		rg.byAddr[addr] = &engine{name: fmt.Sprintf("e%d", i)}
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	s, err := server.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	rg.srv = s
	ext, _ := s.EPPAddr()
	rg.conn = dial(b, ext)
	return rg
}

// benchBody is the i-th request's chat body of about size bytes: one of 8
// system prompts (a shared prefix), then a user turn of its own.
func benchBody(i, size int) []byte {
	system := strings.Repeat(fmt.Sprintf("system prompt %d of the fleet's agents. ", i%8), size/2/40+1)
	user := strings.Repeat(fmt.Sprintf("question %d about the request at hand. ", i), size/2/40+1)
	return fmt.Appendf(nil, `{"model":"m","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
}

// envoyChunk is the size of the body's messages, as Envoy's buffers cut
// them in FULL_DUPLEX_STREAMED mode.
const envoyChunk = 16 << 10

// decideOnce is one request through the picker as Envoy sends it: headers,
// the body in chunks, the decision and the body passed back, then the
// response's headers and a one-chunk body, and the half-close. It returns
// the time from the first message sent to the decision read.
func decideOnce(rg *rig, body []byte) (time.Duration, error) {
	st, err := extprocv3.NewExternalProcessorClient(rg.conn).Process(context.Background())
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: ":method", RawValue: []byte("POST")}, {Key: "content-type", RawValue: []byte("application/json")},
			{Key: "content-length", RawValue: strconv.AppendInt(nil, int64(len(body)), 10)}}}}}}); err != nil {
		return 0, err
	}
	for b := body; len(b) > 0; {
		n := min(envoyChunk, len(b))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: b[:n], EndOfStream: n == len(b)}}}); err != nil {
			return 0, err
		}
		b = b[n:]
	}
	var took time.Duration
	for {
		resp, err := st.Recv()
		if err != nil {
			return 0, err
		}
		if _, ok := resp.Response.(*extprocv3.ProcessingResponse_RequestHeaders); ok {
			took = time.Since(start)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			return 0, fmt.Errorf("immediate response %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
		}
		if resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")}}}}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			return 0, err
		}
		if _, err := st.Recv(); err != nil {
			return 0, err
		}
	}
	if err := st.CloseSend(); err != nil {
		return 0, err
	}
	if _, err := st.Recv(); err != io.EOF {
		return 0, fmt.Errorf("after the half-close: %v", err)
	}
	return took, nil
}

// childEnv makes the test binary the benchmarks' picker process
// (TestPickerProcess): its value is the fleet's size.
const childEnv = "KVROUTE_EPP_BENCH_ENGINES"

// TestPickerProcess is the benchmarks' picker, in a process of its own so
// that its CPU time is its own: a router with the picker on over the
// number of engines childEnv gives, on one core (GOMAXPROCS=1 in its
// environment); it prints its address and serves until its stdin closes.
// Without childEnv it is skipped.
func TestPickerProcess(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv(childEnv))
	if err != nil {
		t.Skip("the benchmarks' picker process: run by BenchmarkDecisions")
	}
	rg := benchRig(t, n)
	ext, _ := rg.srv.EPPAddr()
	fmt.Printf("ADDR %s\n", ext)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// child is the picker process.
type child struct{ pid int }

// picker starts the picker process over n engines and dials it.
func picker(b *testing.B, n int) (*rig, child) {
	b.Helper()
	args := []string{"-test.run=^TestPickerProcess$"}
	if prof := os.Getenv("KVROUTE_EPP_BENCH_PROFILE"); prof != "" {
		// The picker's CPU profile, written when it ends.
		args = append(args, "-test.cpuprofile="+prof)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(n), "GOMAXPROCS=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			rg := &rig{conn: dial(b, addr)}
			return rg, child{pid: cmd.Process.Pid}
		}
	}
	b.Fatalf("the picker process printed no address: %v", sc.Err())
	return nil, child{}
}

// cpu is the process's user and system CPU time so far
// (/proc/<pid>/stat's utime and stime, in clock ticks of 10 ms).
func (c child) cpu(b *testing.B) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// streams is the benchmarks' concurrency: requests in flight at once.
const streams = 150

// BenchmarkDecisions is the picker's decisions through the ext_proc
// protocol, 150 streams at once, by body size and fleet size, the picker
// in a process of its own on one core (TestPickerProcess). It reports
// decisions per CPU-second of the picker's process, the time from a
// request's first message to its decision as the data plane sees it (p50,
// p99: the picker's added latency), and decisions per wall-clock second.
// docs/benchmarks.md, "The Endpoint Picker".
func BenchmarkDecisions(b *testing.B) {
	for _, size := range []int{4 << 10, 200 << 10, 220 << 10} {
		for _, engines := range []int{8, 256} {
			if size == 220<<10 && engines != 8 {
				continue
			}
			b.Run(fmt.Sprintf("body=%dKB/engines=%d", size>>10, engines), func(b *testing.B) {
				rg, child := picker(b, engines)
				bodies := make([][]byte, 64)
				for i := range bodies {
					bodies[i] = benchBody(i, size)
				}
				// Warm the connection and the pools.
				for i := range 4 {
					if _, err := decideOnce(rg, bodies[i]); err != nil {
						b.Fatal(err)
					}
				}
				var (
					next atomic.Int64
					mu   sync.Mutex
					lat  []time.Duration
					wg   sync.WaitGroup
					fail atomic.Pointer[error]
				)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0, wall0 := child.cpu(b), time.Now()
				for range streams {
					wg.Go(func() {
						var mine []time.Duration
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								break
							}
							d, err := decideOnce(rg, bodies[i%int64(len(bodies))])
							if err != nil {
								fail.Store(&err)
								return
							}
							mine = append(mine, d)
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
				}
				wg.Wait()
				cpu, wall := child.cpu(b)-cpu0, time.Since(wall0)
				b.StopTimer()
				if err := fail.Load(); err != nil {
					b.Fatal(*err)
				}
				slices.Sort(lat)
				b.ReportMetric(float64(b.N)/cpu.Seconds(), "decisions/cpu-s")
				b.ReportMetric(float64(b.N)/wall.Seconds(), "decisions/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			})
		}
	}
}

// holdOpen opens a request's stream and takes it to its decision, leaving
// it open before its response (a request in flight at the gateway); close
// ends it.
func holdOpen(rg *rig, body []byte) (close func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := extprocv3.NewExternalProcessorClient(rg.conn).Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			cancel()
			return nil, err
		}
	}
	for range 2 { // the decision, the body passed back
		if _, err := st.Recv(); err != nil {
			cancel()
			return nil, err
		}
	}
	return cancel, nil
}

// BenchmarkAddedLatency is the time a request's decision adds, as the data
// plane sees it (from its first message to the decision), at 220 KB, with
// 150 requests in flight on other streams (decided, their responses
// pending, their load on the engines), the requests measured one after
// another. It reports p50 and p99. docs/benchmarks.md, "The Endpoint
// Picker".
func BenchmarkAddedLatency(b *testing.B) {
	rg, _ := picker(b, 8)
	var open []func()
	b.Cleanup(func() {
		for _, c := range open {
			c()
		}
	})
	for i := range streams {
		c, err := holdOpen(rg, benchBody(i, 4<<10))
		if err != nil {
			b.Fatal(err)
		}
		open = append(open, c)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		body := benchBody(i, 220<<10)
		d, err := decideOnce(rg, body)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, d)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
