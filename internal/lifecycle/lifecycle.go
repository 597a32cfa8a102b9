// Package lifecycle is one client request's life in the router, whatever
// carries it: read, admit, tokenize, route, one or more legs each with its own
// attempt loop (try, classify, retry on another backend before the first
// byte), and one settle that records the outcome exactly once. It owns
// every piece of per-request state that outlives a step (Request, Leg) and
// the rules that judge a backend by a request's outcome (judge).
//
// A front drives it: the HTTP data plane (package proxy) reads the body
// within its budgets, hands it to Plane.Read (parse, the transport's
// session and the tenant's salt, the context check, the prompt's hashes:
// one rule for every front), calls Plane.Route, hands Plane.RoundTrip to the standard
// library's reverse proxy as its transport, and calls Plane.Settle once
// when its handler returns. A front without a response writer (a
// prefill/decode exchange, an Envoy external processor) drives the same
// steps through the same Front interface: how to admit (the transport
// carries the priority), how to answer with an error, how to hand a
// response over, and how its body ended.
//
//	front: read ─▶ Read: parse, check ─▶ Route: tokenize ─▶ admit ─▶ route every leg ─▶ release the grant
//	                          RoundTrip: for each leg ─▶ attempt ─▶ first byte? ─no─▶ judge, reroute ─┐
//	                                                       ▲                                         │
//	                                                       └─────────────────────────────────────────┘
//	                          (an earlier leg: its answer read, its load released at once;
//	                           a Beside leg and the next: a pair, sent again together, pair.go)
//	                          front relays the last leg's body
//	                          Settle: status, breaker (each leg's last attempt), release, wake,
//	                                  metrics (per leg for a split request), decision log,
//	                                  then the front's own records
//
// It must not know the client's transport (no http.ResponseWriter), make
// routing decisions (package scheduler does) or keep per-backend state
// (packages fleet and members do).
package lifecycle

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// StatusClientGone is the status of a request whose client went away
// before the response started (nginx's convention).
const StatusClientGone = 499

// Front is what carries a request to and from the client. The lifecycle
// calls it on the goroutine that drives the request.
type Front interface {
	// Admit waits for the request's admission (the front reads its
	// priority and tenant from what the transport carries). On success
	// release must be called once every leg is routed; otherwise the
	// error is the answer.
	Admit(r *Request) (release func(), e *openai.Error)
	// Tokenize returns the precise index's keys of the request's prompt,
	// or nil to route approximately. It is called before admission,
	// never while the request holds a grant.
	Tokenize(r *Request) []uint64
	// WriteError answers the client with a router-made error (never
	// called for StatusClientGone: nobody to answer).
	WriteError(e *openai.Error)
	// Respond makes resp, the last leg's response, the client's; head
	// and headErr are what the lifecycle already read of its body. The
	// front relays the rest and reports how it ended through Ended.
	Respond(l *Leg, resp *http.Response, head []byte, headErr error)
	// Hold takes room for n more bytes the lifecycle buffers for the
	// request (an earlier leg's answer) in the front's budget of buffered
	// bytes, given back when the request settles; false when there is
	// none.
	Hold(n int64) bool
	// Ended is how the response's body ended, read once by Settle.
	Ended() BodyEnd
	// Settled is the front's own records, once, at the end of Settle
	// (its access log line, the end of its trace, buffers it holds).
	Settled(r *Request)
}

// Trace is told of a request's steps for its trace; the front supplies it
// (a no-op with tracing off).
type Trace interface {
	// RouteStart starts a routing decision's span; RouteEnd ends it with
	// what was decided.
	RouteStart()
	RouteEnd(a *scheduler.Assignment, err error)
	// Attempt starts an upstream attempt's span, out being what is sent.
	Attempt(r *Request, l *Leg, out *http.Request)
	// AttemptFailed ends the current attempt's spans with err.
	AttemptFailed(err error)
	// FirstByte ends the current attempt's first-byte span.
	FirstByte()
	// LegStart starts the span of a leg of a split request (the legs of
	// a request of one leg are not traced apart); the attempts that
	// follow are its children, until LegEnd ends it with what became of
	// the leg. A leg still open when the request ends is ended by the
	// front.
	LegStart(l *Leg)
	LegEnd(l *Leg)
}

// BodyEnd is how a relayed response body ended.
type BodyEnd struct {
	// Complete: the backend's body reached its end. Broken: the error of
	// a body the backend broke (neither: the client left first).
	Complete bool
	Broken   error
	// Counted: a 2xx body read for its tokens, In and Out.
	Counted bool
	In, Out int
	// Cached is the prompt tokens the engine reported reusing, when
	// HasCached (see scheduler.Report).
	Cached    int
	HasCached bool
	// Decoding is the time from the stream's first token chunk to its
	// last as relayed (the Out-1 tokens after its first), 0 for a JSON
	// body or a stream of one chunk.
	Decoding time.Duration
}

// Request is one client request's state, owned by the goroutine that
// drives it from its parse to its one settle. A front embeds it.
type Request struct {
	// Start is the request's arrival; ID its request id ("" for none).
	Start time.Time
	ID    string
	// View is the request's routing view, once parsed; Model its model
	// as a metric label; Body its bytes, as the client sent them.
	View  *request.View
	Model string
	Body  []byte
	// Hashes are the prompt's block hashes, for every attempt; Keys its
	// token-block keys for the precise index, or nil.
	Hashes, Keys []uint64
	// Passthrough marks a request to another endpoint than the
	// completions: no prompt, no tokens, never retried unless
	// Idempotent (an embedding, a rerank, a tokenization: sent again to
	// another engine, before its first byte, as a completion is).
	Passthrough, Idempotent bool
	// Legs are the backends the decision names, in the order they run;
	// the last one's response is the client's. One leg but for a
	// disaggregated request (prefill, then decode).
	Legs []Leg
	// TTFT is the time from arrival to the last leg's first content byte,
	// 0 until it comes.
	TTFT time.Duration
	// Whole, when set, is why a request that could have been split over
	// a prefill and a decode engine is served whole (its one leg's
	// reason says so): by the split decision, or by Route when a later
	// leg found no backend.
	Whole string
	// Status is the request's outcome, set by Settle: the status the
	// client got, or 499 when it left first. Code is the error code of a
	// request the router answered itself.
	Status int
	Code   string

	// answered is the status answered so far (answer is its only
	// writer), 0 for none.
	answered int
	// cur is the index of the leg being run (the last once all ran).
	cur int
	// out and base are the reverse proxy's outbound request and its URL
	// as it came, from which a continuation's request is made
	// (Continue).
	out   *http.Request
	base  url.URL
	front Front
	trace Trace
	one   [1]Leg
	// unreported marks a request whose data plane reported nothing of its
	// answer (Unreported): its settle records no attainment.
	unreported bool
}

// Leg is one backend's part of a request: its assignment, its attempts and
// the outcome of its last attempt, judged by Settle.
type Leg struct {
	// Role names the leg ("" for the one leg of a plain request,
	// "prefill", "decode").
	Role string
	// Rewrite makes the body this leg sends from the request's and prev,
	// the body of the earlier leg's answer (nil for the first leg, or
	// when the earlier leg was skipped); nil sends the request's bytes
	// untouched.
	Rewrite func(body, prev []byte) []byte
	// View, when set, is the leg's own routing view (its Role set, say);
	// nil routes it on the request's.
	View *request.View
	// Optional marks a leg the request can do without: when it cannot be
	// routed, or fails on every attempt, it is skipped and the next leg
	// runs without its answer (a prefill leg whose request falls back to
	// being served whole by the decode leg's engine).
	Optional bool
	// Answer is the body of the leg's response when a later leg follows
	// (at most maxAnswer bytes), handed to that leg's Rewrite.
	Answer []byte
	// Whole, set by the leg's Rewrite, is why the last leg of a split
	// request serves it whole although the earlier leg answered (its
	// answer unusable, say); "" when it does not.
	Whole string
	// Beside marks a leg sent at once with the next one rather than
	// before it (SGLang's prefill, which waits for its decode engine to
	// connect): one attempt on a goroutine of its own, never retried, its
	// answer read and dropped; the next leg's Rewrite gets no answer.
	// Settle waits for it, or ends it when the request is over.
	Beside bool
	// A is the current attempt's assignment; Target its backend.
	A      *scheduler.Assignment
	Target *members.Member
	// Tried are the IDs of backends that failed this leg; Retries how
	// many times it was sent again.
	Tried   []int
	Retries int
	// failed is the failure of the last attempt (a connection error, a
	// timeout, a 5xx passed through), judged by Settle; responded is set
	// once a response of this leg was handed on, with its status; end is
	// how an earlier leg's body ended (the last leg's is the front's).
	failed    error
	responded bool
	skipped   bool
	// done is closed when a Beside leg's attempt has ended; stop ends it.
	done   chan struct{}
	stop   context.CancelFunc
	status int
	end    BodyEnd
	// sent is when the leg was first sent (retries included in its time),
	// first when its answering attempt's first content byte came, ended
	// when an earlier leg's answer was read to its end; zero until then
	// (times.go).
	sent, first, ended time.Time
}

// Init starts r at start, carried by front, traced by trace: one leg with
// the request's own body.
func (r *Request) Init(start time.Time, front Front, trace Trace) {
	r.Start, r.front, r.trace = start, front, trace
	r.Legs = r.one[:]
}

// Leg is the request's current leg: the one being run, the last (whose
// response is the client's) once all ran.
func (r *Request) Leg() *Leg { return &r.Legs[r.cur] }

// Retries is how many times the request was sent again, over all legs.
func (r *Request) Retries() int {
	n := 0
	for i := range r.Legs {
		n += r.Legs[i].Retries
	}
	return n
}

// Skipped reports whether the leg was skipped (an Optional leg that could
// not be routed or failed).
func (l *Leg) Skipped() bool { return l.skipped }

// SetLegs replaces the request's legs before it is routed: a decision
// that names several backends (a prefill and a decode leg).
func (r *Request) SetLegs(legs ...Leg) { r.Legs, r.cur = legs, 0 }

// Reject answers with a router-made error.
func (r *Request) Reject(e *openai.Error) {
	r.answer(e.Status, e.Code)
	if e.Status != StatusClientGone {
		r.front.WriteError(e)
	}
}

// answer notes the status the client gets and the router's error code:
// the one writer of the request's status before Settle.
func (r *Request) answer(status int, code string) {
	r.answered, r.Code = status, code
}

// Plane is what every request's lifecycle shares: the scheduler, the
// backends' breakers and series, the upstream transport and the records.
// Built once by the composition root.
type Plane struct {
	Sched    *scheduler.Scheduler
	Set      *members.Set
	Upstream http.RoundTripper
	Log      *slog.Logger
	// Attempts is retry.attempts; HeaderTimeout
	// upstream.response_header_timeout (also bounding the first body
	// byte); FirstTokenTimeout upstream.first_token_timeout;
	// StreamIdleTimeout upstream.stream_idle_timeout (bounding an earlier
	// leg's answer, drain).
	Attempts                                            int
	HeaderTimeout, FirstTokenTimeout, StreamIdleTimeout time.Duration
	// With ResendDrained, an attempt still waiting for its first byte
	// DrainGrace (fleet.drain_grace; 0: at once) after its backend
	// started draining is sent elsewhere (drain.go); without, it waits.
	ResendDrained bool
	DrainGrace    time.Duration
	// Wake wakes the admission queue (a first byte or a settle freed
	// room); nil: none.
	Wake func()
	// Routed counts a routed request once (its prompt tokens, and the
	// tokens matched on the engine of its first leg); Retried a retry; Unrouted a request the router answered itself. Nil: none.
	Routed   func(v *request.View, a *scheduler.Assignment)
	Retried  func()
	Unrouted func(policy, model string, status int)
	// Decisions keeps each settled routed request's decision (the admin
	// API's log, which the composition root adapts); nil: none.
	Decisions Recorder
	// Bind gives a routed request's legs the bodies that name each
	// other's engines (SGLang's bootstrap fields): after routing, and
	// again each time a pair of legs is sent anew. Nil: none.
	Bind func(r *Request)
	// Split observes a settled split request's per-leg timings (its
	// first leg the prefill, its last the decode); nil: none.
	Split func(r *Request, t LegTimes)
	// Attained records what a settled request with latency objectives
	// attained (objectives.go), whatever front carried it; nil: none.
	Attained func(a Attainment)
	// Reading is how Read parses and checks a completion's body.
	Reading Reading
}

// Recorder keeps the decisions of settled requests. The lifecycle reports
// through it rather than writing a log of its own, so that it knows
// neither the admin API nor the metrics' library: the composition root
// (or the data plane it builds) implements it.
type Recorder interface {
	// Decided is told of a routed request once it settled (its View set),
	// on the goroutine that settled it; it reads r, and must not keep it.
	Decided(r *Request)
}

// policy is the scheduler's policy name, a metric label.
func (p *Plane) policy() string { return p.Sched.Policy().Name() }

// wake wakes the admission queue.
func (p *Plane) wake() {
	if p.Wake != nil {
		p.Wake()
	}
}
