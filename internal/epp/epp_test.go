package epp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/epp"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/server"
)

// engine is a fake inference engine: it answers a chat completion with its
// name, streamed when asked (two token chunks and a usage chunk), and,
// while hold is open, holds a stream after its first chunk.
type engine struct {
	srv  *httptest.Server
	name string
	mu   sync.Mutex
	hold chan struct{}
	n    int
	// onlyMarked holds only the requests whose body has holdMark.
	onlyMarked bool
}

// holdMark marks a request an engine with onlyMarked holds.
const holdMark = "HOLD"

func newEngine(t testing.TB, name string) *engine {
	e := &engine{name: name}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.n++
		hold := e.hold
		e.mu.Unlock()
		if !strings.Contains(string(body), holdMark) && e.onlyMarked {
			hold = nil
		}
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"model":"m","choices":[{"message":{"content":%q}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`, name)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", name)
		w.(http.Flusher).Flush()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"+
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// rig is a router with the picker on over engines.
type rig struct {
	srv     *server.Server
	engines []*engine
	conn    *grpc.ClientConn
	health  *grpc.ClientConn
	byAddr  map[string]*engine
}

func newRig(t testing.TB, n int, edit func(*config.Config)) *rig {
	t.Helper()
	return newRigLog(t, n, edit, slog.New(slog.DiscardHandler))
}

// newRigLog is newRig with the router logging to log.
func newRigLog(t testing.TB, n int, edit func(*config.Config), log *slog.Logger) *rig {
	t.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.EPP = config.EPP{Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"}
	cfg.Health.Path = ""
	rg := &rig{byAddr: map[string]*engine{}}
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		rg.engines = append(rg.engines, e)
		rg.byAddr[strings.TrimPrefix(e.srv.URL, "http://")] = e
		cfg.Backends = append(cfg.Backends, config.Backend{URL: e.srv.URL, Name: e.name, Models: []string{"m"}})
	}
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := server.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	rg.srv = s
	ext, health := s.EPPAddr()
	rg.conn = dial(t, ext)
	rg.health = dial(t, health)
	return rg
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// open opens one request's stream.
func (rg *rig) open(t testing.TB, ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	st, err := extprocv3.NewExternalProcessorClient(rg.conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitIdle waits until every backend's load is back to zero.
func (rg *rig) waitIdle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		idle := true
		for _, b := range rg.srv.Fleet().Snapshot().All {
			if l := b.OwnLoad(); l.InFlight != 0 || l.PendingPrefill != 0 {
				idle = false
			}
		}
		if idle {
			return
		}
		if time.Now().After(deadline) {
			for _, b := range rg.srv.Fleet().Snapshot().All {
				t.Errorf("%s: load %+v, want released", b.Name, b.OwnLoad())
			}
			t.FailNow()
		}
		time.Sleep(time.Millisecond)
	}
}

// envoy is how the test's data planes send a request.
type envoy struct {
	// raw sends header values in raw_value (Envoy); else in value.
	raw bool
	// pseudo sends :path, :method (Envoy); a minimal data plane does not.
	pseudo bool
	// chunk splits the body into messages of this size; 0 sends it whole.
	chunk int
	// subset, when hinted, is the subset hint.
	subset []string
	hinted bool
	// headers are more request headers.
	headers map[string]string
}

func (e envoy) hv(k, v string) *corev3.HeaderValue {
	if e.raw {
		return &corev3.HeaderValue{Key: k, RawValue: []byte(v)}
	}
	return &corev3.HeaderValue{Key: k, Value: v}
}

// sendRequest sends the request's headers and body as e does.
func (e envoy) sendRequest(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, body string) {
	t.Helper()
	hs := []*corev3.HeaderValue{e.hv("content-type", "application/json")}
	if e.pseudo {
		hs = append(hs, e.hv(":path", "/v1/chat/completions"), e.hv(":method", "POST"), e.hv(":authority", "gw"))
	}
	for k, v := range e.headers {
		hs = append(hs, e.hv(k, v))
	}
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}
	req.MetadataContext = subsetMetadata(t, e)
	send(t, st, req)
	b := []byte(body)
	step := e.chunk
	if step <= 0 {
		step = len(b)
	}
	for len(b) > 0 {
		n := min(step, len(b))
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: b[:n], EndOfStream: n == len(b)}}})
		b = b[n:]
	}
}

// subsetMetadata is e's subset hint as a request's metadata context, nil
// without one.
func subsetMetadata(t *testing.T, e envoy) *corev3.Metadata {
	t.Helper()
	if !e.hinted {
		return nil
	}
	list := make([]any, len(e.subset))
	for i, s := range e.subset {
		list[i] = s
	}
	ns, err := structpb.NewStruct(map[string]any{epp.KeySubset: list})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.MetadataSubset: ns}}
}

func send(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, r *extprocv3.ProcessingRequest) {
	t.Helper()
	if err := st.Send(r); err != nil {
		t.Fatal(err)
	}
}

// decision is what the picker answered a request with.
type decision struct {
	dest, metadata, prefiller string
	// requestID is the x-request-id the decision hands the engine.
	requestID string
	body      []byte
	immediate *extprocv3.ImmediateResponse
	// lowercase and raw: every header the picker set had a lowercase key
	// and its value in raw_value.
	lowercase, raw bool
}

// readDecision reads the picker's answer to a request: the headers
// response, then the body passed back; or an immediate response.
func readDecision(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) decision {
	t.Helper()
	d := decision{lowercase: true, raw: true}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			d.immediate = r.ImmediateResponse
			return d
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				k := h.GetHeader().GetKey()
				if k != strings.ToLower(k) {
					d.lowercase = false
				}
				if h.GetHeader().GetValue() != "" || len(h.GetHeader().GetRawValue()) == 0 {
					d.raw = false
				}
				switch k {
				case epp.HeaderDestination:
					d.dest = string(h.GetHeader().GetRawValue())
				case epp.HeaderPrefiller:
					d.prefiller = string(h.GetHeader().GetRawValue())
				case "x-request-id":
					d.requestID = string(h.GetHeader().GetRawValue())
				}
			}
			d.metadata = resp.GetDynamicMetadata().GetFields()[epp.MetadataLB].GetStructValue().GetFields()[epp.HeaderDestination].GetStringValue()
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			d.body = append(d.body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				return d
			}
		default:
			t.Fatalf("unexpected %T before the decision", r)
		}
	}
}

// forward is the data plane's part after the decision, as Envoy does it:
// the request sent to the pick (or to served, when set: a fallback), its
// response's headers with the served endpoint, then its body in the
// chunks the engine wrote, each answered by the picker; the trailers
// with complete. It returns the answer's body.
func forward(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, dest, served string, body string, complete bool) string {
	t.Helper()
	if served == "" {
		served = strings.Split(dest, ",")[0]
	}
	resp, err := http.Post("http://"+served+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	md, _ := structpb.NewStruct(map[string]any{epp.KeyServed: served})
	send(t, st, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte(fmt.Sprint(resp.StatusCode))},
			{Key: "content-type", RawValue: []byte(resp.Header.Get("Content-Type"))},
		}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.MetadataLB: md}},
	})
	expect[*extprocv3.ProcessingResponse_ResponseHeaders](t, st)
	var got strings.Builder
	buf := make([]byte, 64)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			got.Write(buf[:n])
			send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...)}}})
			r := expect[*extprocv3.ProcessingResponse_ResponseBody](t, st)
			if b := r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); string(b) != string(buf[:n]) {
				t.Fatalf("the picker passed back %q for %q", b, buf[:n])
			}
		}
		if err != nil {
			break
		}
	}
	if complete {
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
		expect[*extprocv3.ProcessingResponse_ResponseBody](t, st)
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{}}})
		expect[*extprocv3.ProcessingResponse_ResponseTrailers](t, st)
	}
	return got.String()
}

// expect reads the next response, which must be a T.
func expect[T any](t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) T {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	r, ok := resp.Response.(T)
	if !ok {
		t.Fatalf("got %T, want %T", resp.Response, r)
	}
	return r
}

// closeStream half-closes and waits for the picker to end the stream.
func closeStream(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) {
	t.Helper()
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the half-close: %v, want the end of the stream", err)
	}
}

func chat(session, text string, stream bool) string {
	return fmt.Sprintf(`{"model":"m","stream":%v,"user":%q,"messages":[{"role":"user","content":%q}]}`, stream, session, text)
}

// TestEnvoy: a request as Envoy sends it (pseudo-headers, raw values, the
// body in chunks, FULL_DUPLEX_STREAMED) gets the decision in a lowercase
// header with its value raw and the same value in envoy.lb's metadata,
// its body passed back unchanged; the response phases (served endpoint,
// status, a streamed body, trailers) settle it: its load released, its
// backend credited, its decision logged with its status.
func TestEnvoy(t *testing.T) {
	rg := newRig(t, 2, nil)
	body := chat("s1", strings.Repeat("hello world ", 400), true)
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true, chunk: 1000}.sendRequest(t, st, body)
	d := readDecision(t, st)
	if d.immediate != nil {
		t.Fatalf("immediate response %d: %s", d.immediate.GetStatus().GetCode(), d.immediate.GetBody())
	}
	if rg.byAddr[d.dest] == nil || d.metadata != d.dest || !d.lowercase || !d.raw {
		t.Fatalf("destination %q, metadata %q (lowercase keys %v, raw values %v): want one engine's ip:port in both", d.dest, d.metadata, d.lowercase, d.raw)
	}
	if string(d.body) != body {
		t.Errorf("the body came back changed (%d bytes for %d)", len(d.body), len(body))
	}
	got := forward(t, st, d.dest, "", body, true)
	if !strings.Contains(got, rg.byAddr[d.dest].name) {
		t.Errorf("answer %q", got)
	}
	closeStream(t, st)
	rg.waitIdle(t)
	name := rg.byAddr[d.dest].name
	page := metrics(t, rg)
	for _, want := range []string{
		`kvroute_requests_total{backend="` + name + `",model="m",policy="kvroute",status="200"} 1`,
		// The stream's usage chunk, read by the tally on the response path.
		`kvroute_input_tokens_total{backend="` + name + `",model="m"} 5`,
		`kvroute_output_tokens_total{backend="` + name + `",model="m"} 2`,
		`kvroute_ttft_seconds_count{backend="` + name + `",model="m"} 1`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// metrics is the router's /metrics page.
func metrics(t *testing.T, rg *rig) string {
	t.Helper()
	w := httptest.NewRecorder()
	rg.srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return w.Body.String()
}

// backend is the fleet's backend at addr.
func backend(rg *rig, addr string) *fleet.Backend {
	for _, b := range rg.srv.Fleet().Snapshot().All {
		if b.URL.Host == addr {
			return b
		}
	}
	return nil
}

// TestMinimalDataPlane: a data plane that sends the headers in value, no
// pseudo-headers, the body in one message with end_of_stream and then
// half-closes (NGINX Gateway Fabric's shim) gets the decision and the end
// of the stream; the request, whose response the picker never sees, keeps
// its load on its backend for its predicted length after the stream
// ended (so that the next picks see it), then is released. Once the data
// plane has reported an answer, a stream that ends before its answer's
// releases its request at once (TestCancelled).
func TestMinimalDataPlane(t *testing.T) {
	rg := newRig(t, 2, nil)
	st := rg.open(t, context.Background())
	envoy{}.sendRequest(t, st, chat("s", "hi there", false))
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	d := readDecision(t, st)
	if rg.byAddr[d.dest] == nil {
		t.Fatalf("destination %q", d.dest)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the decision: %v, want the end of the stream", err)
	}
	var inflight int64
	for _, b := range rg.srv.Fleet().Snapshot().All {
		inflight += b.OwnLoad().InFlight
	}
	if inflight != 1 {
		t.Fatalf("%d in flight once the stream ended, want the request held for its predicted length", inflight)
	}
	rg.waitIdle(t)
}

// TestSubset: a subset hint restricts the pick to its endpoints; an empty
// one, or one with no endpoint of the pool, gets a 503 in OpenAI's error
// shape.
func TestSubset(t *testing.T) {
	rg := newRig(t, 3, nil)
	only := strings.TrimPrefix(rg.engines[2].srv.URL, "http://")
	for i := range 4 {
		st := rg.open(t, context.Background())
		envoy{raw: true, pseudo: true, hinted: true, subset: []string{only}}.sendRequest(t, st, chat(fmt.Sprint("s", i), "hi", false))
		d := readDecision(t, st)
		if d.dest != only {
			t.Fatalf("request %d went to %q, want the subset's %s", i, d.dest, only)
		}
		forward(t, st, d.dest, "", chat("s", "hi", false), true)
		closeStream(t, st)
	}
	for _, subset := range [][]string{{}, {"10.255.255.1:8000"}} {
		st := rg.open(t, context.Background())
		envoy{raw: true, pseudo: true, hinted: true, subset: subset}.sendRequest(t, st, chat("s", "hi", false))
		d := readDecision(t, st)
		checkImmediate(t, d, http.StatusServiceUnavailable)
	}
	rg.waitIdle(t)
}

// checkImmediate fails unless d is an immediate response of status with
// an OpenAI error body.
func checkImmediate(t *testing.T, d decision, status int) {
	t.Helper()
	if d.immediate == nil {
		t.Fatalf("decision %q, want an immediate %d", d.dest, status)
	}
	var e struct {
		Error struct{ Message, Type string } `json:"error"`
	}
	if got := int(d.immediate.GetStatus().GetCode()); got != status || json.Unmarshal(d.immediate.GetBody(), &e) != nil || e.Error.Message == "" {
		t.Fatalf("immediate %d %s, want %d in OpenAI's error shape", got, d.immediate.GetBody(), status)
	}
}

// TestFallbacks: epp.fallbacks names further endpoints after the pick;
// when the data plane's pick fails and a fallback serves, the served
// endpoint in the response's metadata moves the request there: the pick
// is charged, the loads released.
func TestFallbacks(t *testing.T) {
	rg := newRig(t, 3, func(c *config.Config) { c.EPP.Fallbacks = 2 })
	st := rg.open(t, context.Background())
	body := chat("s", "hello", true)
	envoy{raw: true, pseudo: true}.sendRequest(t, st, body)
	d := readDecision(t, st)
	list := strings.Split(d.dest, ",")
	if len(list) != 3 || list[0] == list[1] || list[1] == list[2] || d.metadata != d.dest {
		t.Fatalf("destination %q, metadata %q: want the pick and two fallbacks in both", d.dest, d.metadata)
	}
	forward(t, st, d.dest, list[1], body, true)
	closeStream(t, st)
	rg.waitIdle(t)
	if f := rg.srv.Members().Of(backend(rg, list[0])).Breaker().Fails; f != 1 {
		t.Errorf("the pick's breaker has %d failures, want 1", f)
	}
}

// TestNoFallbacksByDefault: one endpoint unless epp.fallbacks says more.
func TestNoFallbacksByDefault(t *testing.T) {
	rg := newRig(t, 3, nil)
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true}.sendRequest(t, st, chat("s", "hello", false))
	if d := readDecision(t, st); strings.Contains(d.dest, ",") || rg.byAddr[d.dest] == nil {
		t.Fatalf("destination %q, want one endpoint", d.dest)
	}
}

// TestCancelled: a stream the client cancels mid-response releases the
// request at once.
func TestCancelled(t *testing.T) {
	rg := newRig(t, 1, nil)
	e := rg.engines[0]
	e.hold = make(chan struct{})
	defer close(e.hold)
	ctx, cancel := context.WithCancel(context.Background())
	st := rg.open(t, ctx)
	body := chat("s", "hello", true)
	envoy{raw: true, pseudo: true}.sendRequest(t, st, body)
	d := readDecision(t, st)
	resp, err := http.Post("http://"+d.dest+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}})
	expect[*extprocv3.ProcessingResponse_ResponseHeaders](t, st)
	if l := rg.srv.Fleet().Snapshot().All[0].OwnLoad(); l.InFlight != 1 {
		t.Fatalf("load %+v mid-response, want one in flight", l)
	}
	cancel()
	rg.waitIdle(t)
}

// TestShed: a request the admission queue sheds gets a 429 in OpenAI's
// error shape.
func TestShed(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config) {
		c.Admission.MaxInFlightPerBackend = 1
		c.Admission.MaxWait = time.Millisecond
	})
	e := rg.engines[0]
	e.hold = make(chan struct{})
	defer close(e.hold)
	first := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true}.sendRequest(t, first, chat("a", "hello", true))
	if d := readDecision(t, first); d.immediate != nil {
		t.Fatalf("the first request got %d", d.immediate.GetStatus().GetCode())
	}
	second := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true}.sendRequest(t, second, chat("b", "hello", true))
	checkImmediate(t, readDecision(t, second), http.StatusTooManyRequests)
}

// TestTooLarge: a body over limits.max_body_bytes gets a 413.
func TestTooLarge(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config) { c.Limits.MaxBodyBytes = 4096 })
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true, chunk: 1000}.sendRequest(t, st, chat("s", strings.Repeat("x", 5000), false))
	checkImmediate(t, readDecision(t, st), http.StatusRequestEntityTooLarge)
}

// TestHealth: liveness serves at once; readiness and the ext_proc service
// once the pool has a healthy backend.
func TestHealth(t *testing.T) {
	rg := newRig(t, 1, nil)
	c := healthpb.NewHealthClient(rg.health)
	for _, svc := range []string{epp.ServiceLiveness, epp.ServiceReadiness, epp.ServiceName} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			r, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v %v, want SERVING", svc, r.GetStatus(), err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "nothing"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("an unknown service: %v, want NotFound", err)
	}
}

// step is one request of TestSameDecisions' trace: its body, and whether
// its answer is held open (its load stays on its engine) until the end.
type step struct {
	what, body, session string
	hold                bool
}

// sameDecisionsTrace exercises what a pick weighs: a conversation's home
// (its second turn), a shared prefix, and load (two long prompts held in
// flight, then a third).
func sameDecisionsTrace() []step {
	system := strings.Repeat("You are a careful assistant who answers in full sentences. ", 60)
	long := func(tag string) string {
		return strings.Repeat(tag+" needs a long answer about distributed systems. ", 80)
	}
	var tr []step
	for _, s := range []string{"s1", "s2", "s3", "s4"} {
		tr = append(tr, step{what: s + " turn 1", session: s, body: chat(s, "first turn of "+s, true)})
	}
	for _, s := range []string{"s1", "s2", "s3", "s4"} {
		tr = append(tr, step{what: s + " turn 2", session: s, body: fmt.Sprintf(`{"model":"m","stream":true,"user":%q,"messages":[{"role":"user","content":"first turn of %s"},{"role":"assistant","content":"ok"},{"role":"user","content":"second"}]}`, s, s)})
	}
	tr = append(tr,
		step{what: "prefix p1", body: fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":"question one"}]}`, system)},
		step{what: "prefix p2", body: fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":"question two"}]}`, system)},
		step{what: "load l1 (held)", body: chat("", holdMark+long("alpha"), true), hold: true},
		step{what: "load l2 (held)", body: chat("", holdMark+long("beta"), true), hold: true},
		step{what: "load l3", body: chat("", long("gamma"), true)},
	)
	return tr
}

// TestSameDecisions: the same trace through the HTTP front and through the
// picker (the test as the gateway's data plane) is routed alike: the
// conversations' homes, the prefix's engine and the load's spread match
// request by request, shown side by side.
func TestSameDecisions(t *testing.T) {
	trace := sameDecisionsTrace()
	viaHTTP := routeHTTP(t, trace)
	viaEPP := routeEPP(t, trace)
	t.Logf("%-16s %-10s %-10s", "request", "HTTP front", "picker")
	for i, s := range trace {
		t.Logf("%-16s %-10s %-10s", s.what, viaHTTP[i], viaEPP[i])
		if viaHTTP[i] != viaEPP[i] {
			t.Errorf("%s: the HTTP front routed it to %s, the picker to %s", s.what, viaHTTP[i], viaEPP[i])
		}
	}
	// The trace says something: turns stay home, the prefix stays, the
	// held load is avoided.
	for i := range 4 {
		if viaEPP[i] != viaEPP[4+i] {
			t.Errorf("%s left its home %s for %s", trace[4+i].what, viaEPP[i], viaEPP[4+i])
		}
	}
	if viaEPP[8] != viaEPP[9] {
		t.Errorf("the shared prefix went to %s, then %s", viaEPP[8], viaEPP[9])
	}
	if viaEPP[12] == viaEPP[10] || viaEPP[12] == viaEPP[11] || viaEPP[10] == viaEPP[11] {
		t.Errorf("load: held on %s and %s, then %s", viaEPP[10], viaEPP[11], viaEPP[12])
	}
}

// routeHTTP sends the trace through the HTTP front and returns the engine
// of each request (X-Kvroute-Backend).
func routeHTTP(t *testing.T, trace []step) []string {
	rg := newRig(t, 3, nil)
	hold := make(chan struct{})
	for _, e := range rg.engines {
		e.hold, e.onlyMarked = hold, true
	}
	defer close(hold)
	var got []string
	held := 0
	for _, s := range trace {
		req, _ := http.NewRequest(http.MethodPost, "http://"+rg.srv.Addr()+"/v1/chat/completions", strings.NewReader(s.body))
		req.Header.Set("Content-Type", "application/json")
		if s.session != "" {
			req.Header.Set("X-Session-ID", s.session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.Header.Get("X-Kvroute-Backend"))
		if s.hold {
			t.Cleanup(func() { resp.Body.Close() })
			// The first chunk is relayed: the prefill is done.
			if _, err := resp.Body.Read(make([]byte, 16)); err != nil {
				t.Fatal(err)
			}
			held++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		waitOwn(t, rg, int64(held))
	}
	return got
}

// routeEPP sends the trace through the picker, the test forwarding as the
// gateway does, and returns the engine of each request.
func routeEPP(t *testing.T, trace []step) []string {
	rg := newRig(t, 3, nil)
	hold := make(chan struct{})
	for _, e := range rg.engines {
		e.hold, e.onlyMarked = hold, true
	}
	defer close(hold)
	var got []string
	held := 0
	for _, s := range trace {
		st := rg.open(t, t.Context())
		hs := map[string]string{}
		if s.session != "" {
			hs["x-session-id"] = s.session
		}
		envoy{raw: true, pseudo: true, chunk: 4096, headers: hs}.sendRequest(t, st, s.body)
		d := readDecision(t, st)
		e := rg.byAddr[d.dest]
		if e == nil {
			t.Fatalf("%s: destination %q", s.what, d.dest)
		}
		got = append(got, e.name)
		if !s.hold {
			forward(t, st, d.dest, "", s.body, true)
			closeStream(t, st)
			waitOwn(t, rg, int64(held))
			continue
		}
		forwardFirst(t, st, d.dest, s.body)
		held++
	}
	return got
}

// forwardFirst forwards the request to dest and relays the response's
// headers and first chunk to the picker, leaving the rest unread.
func forwardFirst(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, dest, body string) {
	resp, err := http.Post("http://"+dest+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	t.Cleanup(func() { resp.Body.Close() })
	md, _ := structpb.NewStruct(map[string]any{epp.KeyServed: dest})
	send(t, st, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")}}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.MetadataLB: md}},
	})
	expect[*extprocv3.ProcessingResponse_ResponseHeaders](t, st)
	buf := make([]byte, 256)
	n, _ := resp.Body.Read(buf)
	send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: buf[:n]}}})
	expect[*extprocv3.ProcessingResponse_ResponseBody](t, st)
}

// waitOwn waits until the fleet holds exactly n requests in flight.
func waitOwn(t *testing.T, rg *rig, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var sum int64
		for _, b := range rg.srv.Fleet().Snapshot().All {
			sum += b.OwnLoad().InFlight
		}
		if sum == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight, want %d", sum, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPrefiller: with prefill and decode engines, a split request's
// decision is its decode engine, and x-prefiller-host-port names its
// prefill engine (for the decode engine's P/D sidecar); both legs are
// released when the request ends.
func TestPrefiller(t *testing.T) {
	rg := newRig(t, 2, func(c *config.Config) {
		c.Backends[0].Role, c.Backends[1].Role = config.RolePrefill, config.RoleDecode
		c.Disaggregation.Split = "always"
	})
	pre, dec := strings.TrimPrefix(rg.engines[0].srv.URL, "http://"), strings.TrimPrefix(rg.engines[1].srv.URL, "http://")
	st := rg.open(t, context.Background())
	body := chat("s", strings.Repeat("a long prompt ", 300), true)
	envoy{raw: true, pseudo: true}.sendRequest(t, st, body)
	d := readDecision(t, st)
	if d.dest != dec || d.prefiller != pre {
		t.Fatalf("destination %q, prefiller %q; want the decode engine %s and the prefill engine %s", d.dest, d.prefiller, dec, pre)
	}
	forward(t, st, d.dest, "", body, true)
	closeStream(t, st)
	rg.waitIdle(t)
}

// TestBodiless: a request without a body (GET /v1/models through the
// gateway) goes to an engine of the pool, unaccounted; with none in the
// subset hint it gets a 503.
func TestBodiless(t *testing.T) {
	rg := newRig(t, 2, nil)
	for _, tt := range []struct {
		name   string
		e      envoy
		status int
	}{
		{"no hint", envoy{raw: true, pseudo: true}, 0},
		{"nothing in the hint", envoy{raw: true, pseudo: true, hinted: true, subset: []string{}}, http.StatusServiceUnavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := rg.open(t, context.Background())
			send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/models")}, {Key: ":method", RawValue: []byte("GET")}}},
				EndOfStream: true}}, MetadataContext: subsetMetadata(t, tt.e)})
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if tt.status != 0 {
				if ir := resp.GetImmediateResponse(); ir == nil || int(ir.GetStatus().GetCode()) != tt.status {
					t.Fatalf("got %v, want an immediate %d", resp, tt.status)
				}
				return
			}
			var dest string
			for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == epp.HeaderDestination {
					dest = string(h.GetHeader().GetRawValue())
				}
			}
			if rg.byAddr[dest] == nil {
				t.Fatalf("destination %q, want an engine of the pool", dest)
			}
			closeStream(t, st)
		})
	}
}

// TestRejectedCounted: a request the router answers itself (here a body
// it refuses) is counted as the HTTP front counts it, once its stream
// ends.
func TestRejectedCounted(t *testing.T) {
	rg := newRig(t, 1, nil)
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true}.sendRequest(t, st, `{"model":"m","messages":"not a list"}`)
	checkImmediate(t, readDecision(t, st), http.StatusBadRequest)
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the immediate response: %v, want the end of the stream", err)
	}
	want := `kvroute_requests_total{backend="none",model="",policy="kvroute",status="400"} 1`
	if page := metrics(t, rg); !strings.Contains(page, want) {
		t.Errorf("/metrics has no %s", want)
	}
}

// TestPassthrough: a request to another endpoint (embeddings) is routed by
// its model, as the HTTP front routes it; one to an endpoint outside
// passthrough.allow gets a 404.
func TestPassthrough(t *testing.T) {
	rg := newRig(t, 2, nil)
	for _, tt := range []struct {
		path   string
		status int
	}{
		{"/v1/embeddings", 0},
		{"/v1/not-an-endpoint", http.StatusNotFound},
	} {
		st := rg.open(t, context.Background())
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte(tt.path)}, {Key: ":method", RawValue: []byte("POST")},
				{Key: "content-type", RawValue: []byte("application/json")}}}}}})
		send(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(`{"model":"m","input":"hello"}`), EndOfStream: true}}})
		d := readDecision(t, st)
		if tt.status != 0 {
			checkImmediate(t, d, tt.status)
			continue
		}
		if rg.byAddr[d.dest] == nil || d.immediate != nil {
			t.Fatalf("%s: destination %q (%v), want an engine of the pool", tt.path, d.dest, d.immediate)
		}
		closeStream(t, st)
	}
	rg.waitIdle(t)
}
