// Package bench is kvroute's open-loop load generator: it replays a
// workload against an OpenAI-compatible endpoint, starting every request at
// its arrival time whatever the latency of earlier ones (no coordinated
// omission), reads the SSE stream, and records per-request samples (TTFT,
// inter-token gaps, end-to-end latency, usage with cached tokens, and the
// serving backend from X-Kvroute-Backend).
//
// It knows nothing of routing or engines; report summarises what it measures.
package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/workload"
)

// DefaultMaxConcurrency is the default cap on requests in flight.
const DefaultMaxConcurrency = 4096

// BackendHeader names the backend that served a request through kvroute.
const BackendHeader = "X-Kvroute-Backend"

// ReasonHeader is the router's account of its choice, whose
// "prefix=<matched>/<blocks>" is its predicted hit (see predicted).
const ReasonHeader = "X-Kvroute-Reason"

// SessionHeader carries a request's conversation id.
const SessionHeader = "X-Session-ID"

// Config describes one run.
type Config struct {
	// Target is the base URL of the OpenAI-compatible server, e.g.
	// http://127.0.0.1:8080 (a trailing /v1 is accepted).
	Target string
	// Spread, when not empty, are more targets (router replicas): each
	// request goes to Target or one of them, drawn at random from
	// SpreadSeed, so that a conversation's turns enter any replica. A
	// request whose connection its target refuses (the target is down and
	// nothing was sent) goes to the next target in order, as a load
	// balancer in front of replicas retries a refused connection; a
	// request a target accepted and then failed is an error, as it is
	// behind a load balancer (a stream cannot be replayed).
	Spread     []string
	SpreadSeed int64
	// Model is sent in every body; empty asks GET /v1/models and takes the
	// first model.
	Model string
	// Requests are sent at their arrival times (At from the start of the run).
	Requests []workload.Request
	// Policy labels the run in the report.
	Policy string
	// Duration, if positive, drops requests arriving at or after it.
	// Requests already sent are waited for.
	Duration time.Duration
	// Progress, if not nil, says where the run reports its progress (see
	// StderrProgress).
	Progress *Progress
	// MaxConcurrency caps requests in flight (default
	// DefaultMaxConcurrency). A request arriving at the cap is not sent and
	// counts as an error: an open-loop generator must not wait, and an
	// unbounded one could exhaust file descriptors.
	MaxConcurrency int
	// Client overrides the HTTP client; nil uses one tuned for many
	// concurrent streams to one host.
	Client *http.Client
}

// Progress is where and how a run reports its progress.
type Progress struct {
	// W receives it.
	W io.Writer
	// Every, when positive, writes one line every Every instead of a bar
	// redrawn in place: a log or a CI job keeps each line, where a bar's
	// carriage returns would make one endless line.
	Every time.Duration
}

// LogProgressEvery is how often a run's progress line is written when its
// output is not a terminal.
const LogProgressEvery = 5 * time.Second

// StderrProgress reports on os.Stderr: a bar redrawn in place when it is a
// terminal, else a line every LogProgressEvery, so that a piped or CI run
// is not silent for a minute.
func StderrProgress() *Progress {
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return &Progress{W: os.Stderr}
	}
	return &Progress{W: os.Stderr, Every: LogProgressEvery}
}

// Run replays cfg.Requests against cfg.Target and summarises the samples.
// On cancellation of ctx it stops sending, aborts requests in flight, and
// returns the partial run with ctx's error.
func Run(ctx context.Context, cfg Config) (report.Run, error) {
	samples, wall, err := Drive(ctx, cfg)
	if samples == nil && err != nil {
		return report.Run{Policy: cfg.Policy}, err
	}
	return report.Summarize(cfg.Policy, samples, wall), err
}

// Drive is Run without the summary: the samples of the requests it sent
// (in arrival order) and the run's wall time, from the start to the last
// completion.
func Drive(ctx context.Context, cfg Config) ([]report.Sample, time.Duration, error) {
	base, err := baseURL(cfg.Target)
	if err != nil {
		return nil, 0, err
	}
	client := cfg.Client
	if client == nil {
		client = newClient(cfg.maxConcurrency())
		defer client.CloseIdleConnections()
	}
	model := cfg.Model
	if model == "" {
		if model, err = FirstModel(ctx, client, base); err != nil {
			return nil, 0, err
		}
	}
	reqs := make([]*workload.Request, 0, len(cfg.Requests))
	for i := range cfg.Requests {
		if cfg.Duration <= 0 || cfg.Requests[i].At < cfg.Duration {
			reqs = append(reqs, &cfg.Requests[i])
		}
	}
	slices.SortStableFunc(reqs, func(a, b *workload.Request) int { return cmp.Compare(a.At, b.At) })

	r := &runner{client: client, base: base, model: model, samples: make([]report.Sample, len(reqs)), turns: newTurns(reqs)}
	if err := r.spread(cfg, len(reqs)); err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopProgress := r.progress(cfg.Progress, cfg.Policy, len(reqs))
	limit := int64(cfg.maxConcurrency())
	r.start = time.Now()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	<-timer.C
	sent := 0
dispatch:
	for i, req := range reqs {
		if d := time.Until(r.start.Add(req.At)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				break dispatch
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break
		}
		sent = i + 1
		s := &r.samples[i]
		s.Start = req.At
		if r.inflight.Add(1) > limit {
			r.inflight.Add(-1)
			s.Err = fmt.Sprintf("not sent: %d requests already in flight (max concurrency)", limit)
			r.errors.Add(1)
			r.done.Add(1)
			r.turns.end(i, "")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.doTurn(ctx, req, s, i)
			r.inflight.Add(-1)
			if s.Err != "" {
				r.errors.Add(1)
			}
			r.done.Add(1)
		}()
	}
	wg.Wait()
	wall := time.Since(r.start)
	stopProgress()
	samples := r.samples[:sent]
	if err := ctx.Err(); err != nil {
		return samples, wall, fmt.Errorf("run interrupted after %d of %d requests: %w", sent, len(reqs), err)
	}
	return samples, wall, nil
}

// spread draws each of n requests' target from cfg.Target and cfg.Spread.
func (r *runner) spread(cfg Config, n int) error {
	r.bases = []string{r.base}
	if len(cfg.Spread) == 0 {
		return nil
	}
	for _, t := range cfg.Spread {
		b, err := baseURL(t)
		if err != nil {
			return err
		}
		r.bases = append(r.bases, b)
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.SpreadSeed), 0x59ead))
	r.via = make([]int, n)
	for i := range r.via {
		r.via[i] = rng.IntN(len(r.bases))
	}
	return nil
}

// entry is the index in bases of the target request i goes to first.
func (r *runner) entry(i int) int {
	if r.via == nil {
		return 0
	}
	return r.via[i]
}

func (c *Config) maxConcurrency() int {
	if c.MaxConcurrency > 0 {
		return c.MaxConcurrency
	}
	return DefaultMaxConcurrency
}

func baseURL(target string) (string, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("target %q is not an http(s) URL such as http://127.0.0.1:8080", target)
	}
	return strings.TrimSuffix(strings.TrimSuffix(target, "/"), "/v1"), nil
}

// newClient is an HTTP client for many concurrent streams to one host:
// enough idle connections to reuse, no compression to undo, no proxy from
// the environment (a benchmark measures the target, not a proxy on the way),
// and no overall timeout (streams are as long as their outputs).
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		TLSHandshakeTimeout: 10 * time.Second,
	}}
}

// FirstModel asks base's GET /v1/models and returns the first model's id.
func FirstModel(ctx context.Context, client *http.Client, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models: GET %s/v1/models: %s", base, httpError(resp.StatusCode, body))
	}
	var ml openai.ModelList
	if err := json.Unmarshal(body, &ml); err != nil {
		return "", fmt.Errorf("list models: malformed response: %w", err)
	}
	if len(ml.Data) == 0 || ml.Data[0].ID == "" {
		return "", fmt.Errorf("list models: %s/v1/models lists no model; pass one with --model", base)
	}
	return ml.Data[0].ID, nil
}

// httpError describes a non-200 response, with the message of an OpenAI
// error body when there is one.
func httpError(status int, body []byte) string {
	var eb openai.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error.Message != "" {
		return fmt.Sprintf("HTTP %d: %s", status, eb.Error.Message)
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return fmt.Sprintf("HTTP %d: %s", status, msg)
}

type runner struct {
	client *http.Client
	base   string
	// bases are base and the targets of Spread, and via[i] the one
	// request i goes to first (an index into bases); nil without Spread.
	bases   []string
	via     []int
	model   string
	start   time.Time
	samples []report.Sample

	inflight, done, errors atomic.Int64
	// turns are the agent loops' dependencies (agents.go), nil without.
	turns *turns
}

// send sends one request, to bases[entry] or, when that refuses the
// connection, the next target, and fills s. Latencies count from the
// request's intended start (start: its arrival, or its previous turn's
// end), so time lost by a late client (or a refused connection) is
// charged to the request. prev is the id of the stored response it
// continues, if any; it returns the answer's Responses API id.
func (r *runner) send(ctx context.Context, wr *workload.Request, s *report.Sample, entry int, start time.Time, prev string) string {
	body := wr.BodyFor(r.model, prev)
	s.Objective = wr.Objective
	var resp *http.Response
	for k := range r.bases {
		s.Entry, s.Refused = (entry+k)%len(r.bases), k
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.bases[s.Entry]+wr.Kind.Path(), bytes.NewReader(body))
		if err != nil {
			s.Err = err.Error()
			return ""
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		if wr.Session != "" {
			req.Header.Set(cmp.Or(wr.SessionHeader, SessionHeader), wr.Session)
		}
		wr.Objective.SetHeaders(req.Header)
		resp, err = r.client.Do(req)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || k == len(r.bases)-1 {
			s.Err = err.Error()
			return ""
		}
	}
	defer resp.Body.Close()
	s.Backend = resp.Header.Get(BackendHeader)
	s.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		s.Err = httpError(resp.StatusCode, b)
		// Refused for its objectives (a sheddable request no backend
		// could serve in time).
		s.Shed = resp.StatusCode == http.StatusTooManyRequests && bytes.Contains(b, []byte(`"slo_unattainable"`))
		if !isErrorBody(b) {
			s.Err = errNotOpenAI + s.Err
		}
		return ""
	}
	var st streamStats
	var err error
	if wr.Kind == request.Responses || wr.Kind == request.Messages {
		st, err = readAgentStream(resp.Body, start)
	} else {
		st, err = readStream(resp.Body, start)
	}
	s.TTFT, s.E2E, s.ITL = st.ttft, st.e2e, st.itl
	s.PromptTokens, s.CachedTokens, s.OutputTokens = st.prompt, st.cached, st.output
	s.MatchedTokens = predicted(resp.Header.Get(ReasonHeader), st.prompt)
	if err != nil {
		s.Err = err.Error()
	}
	return st.responseID
}

// progress starts reporting on p: a bar redrawn every 200 ms, or a line
// every p.Every; the returned function reports the final state and stops.
func (r *runner) progress(p *Progress, label string, total int) func() {
	if p == nil || p.W == nil {
		return func() {}
	}
	w, every := p.W, 200*time.Millisecond
	if p.Every > 0 {
		every = p.Every
	}
	if label != "" {
		label += ": "
	}
	draw := func() {
		done, errs, in := r.done.Load(), r.errors.Load(), r.inflight.Load()
		el := time.Duration(0)
		if !r.start.IsZero() {
			el = time.Since(r.start).Round(100 * time.Millisecond)
		}
		if p.Every > 0 {
			fmt.Fprintf(w, "%s%d/%d done, %d errors, %d in flight, %v\n", label, done, total, errs, in, el)
			return
		}
		const width = 30
		fill := 0
		if total > 0 {
			fill = int(done) * width / total
		}
		fmt.Fprintf(w, "\r%s[%s%s] %d/%d done, %d errors, %d in flight, %v   ",
			label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), done, total, errs, in, el)
	}
	stop := tick(every, draw)
	return func() {
		stop()
		draw()
		if p.Every <= 0 {
			fmt.Fprintln(w)
		}
	}
}

// Lines writes line(elapsed) on p every p.Every (or every LogProgressEvery
// when p draws a bar on a terminal) until the returned function is
// called: for a command with no bar of its own (kvroute sim). A run
// shorter than that writes nothing. A nil p reports nothing.
func (p *Progress) Lines(line func(elapsed time.Duration) string) (stop func()) {
	if p == nil || p.W == nil {
		return func() {}
	}
	every := p.Every
	if every <= 0 {
		every = LogProgressEvery
	}
	start := time.Now()
	return tick(every, func() { fmt.Fprintln(p.W, line(time.Since(start).Round(100*time.Millisecond))) })
}

// tick calls fn every interval on a goroutine of its own until the
// returned function is called, which waits for a call under way.
func tick(every time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// errNoDone is a stream that ended without "data: [DONE]".
var errNoDone = errors.New("stream ended without [DONE]")

// predicted is the router's predicted hit of a request of prompt tokens,
// by the engine's count, read from its reason ("policy=kvroute
// prefix=812/1024 ..."): the share of the prompt's blocks it matched on
// the chosen backend. 0 when the reason gives none, or is malformed.
func predicted(reason string, prompt int) int {
	_, rest, ok := strings.Cut(reason, "prefix=")
	if !ok {
		return 0
	}
	rest, _, _ = strings.Cut(rest, " ")
	m, n, ok := strings.Cut(rest, "/")
	if !ok {
		return 0
	}
	matched, err1 := strconv.Atoi(m)
	blocks, err2 := strconv.Atoi(n)
	if err1 != nil || err2 != nil || blocks <= 0 || matched < 0 || matched > blocks {
		return 0
	}
	return int(int64(prompt) * int64(matched) / int64(blocks))
}
