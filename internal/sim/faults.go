package sim

import (
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/migrate"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Engine faults in virtual time, and the moves of the streams they break,
// as kvroute compare's fault scenarios inject them into a live fleet and
// as the live router takes them:
//
//   - kill: engine 0 dies at KillAt. What it runs and queues is lost (the
//     tokens of the step under way never reach a client) and it leaves the
//     fleet at once, its prefix picture forgotten, as the live router's
//     breaker ejects an engine whose streams all broke (the connection
//     errors of the requests sent to it meanwhile, retried before their
//     first byte live, are not modelled).
//   - hang: engine 0 stops at HangAt, its requests kept. A stream is found
//     StreamIdle after its last token (upstream.stream_idle_timeout), a
//     request without a first token StreamIdle after the hang or after it
//     was sent, whichever is later (live, upstream.first_token_timeout,
//     default 2m, finds those); the engine leaves the fleet when the first
//     is found, and takes requests until then.
//   - rolling: from RollingAt, every engine in turn is drained (no new
//     requests), stopped once it holds none or DrainGrace after the drain
//     (its streams moved, its requests without a first token sent again),
//     started EngineStart later with an empty cache, and undrained; the
//     next one is drained then.
//
// A request the failure cut is handled by the live router's rules: a
// stream (its client had tokens) is continued on another engine
// (migrate.Continuation of the original body and the tokens sent, routed
// by the same scheduler away from the engines it failed on, its output
// budget reduced), within migration's limits (migrate.Limits: attempts,
// a drain's first one free, the context's length) and only when
// migrate.Check says it can be; a request with no token yet is sent again
// (retry.attempts, config's default), from scratch. Anything else is an
// error its client sees. One TTFT per request (its first token's), the
// gap counted as added latency, the continuations' prefill counted.

// Faults' engine failures (see Faults: KillAt, HangAt, RollingAt).
const (
	FaultKill    = "kill"
	FaultHang    = "hang"
	FaultRolling = "rolling"
)

// DefaultStreamIdle is the stream idle timeout of a hang when
// Faults.StreamIdle is 0: kvroute compare's for its hang scenario.
const DefaultStreamIdle = time.Second

// nodeFault is a node's failure state.
type nodeFault struct {
	hung, draining, stopped bool
	found                   bool // hung: its first request was found
	// lost are the requests of a hung engine waiting to be found.
	lost []*flight
	// computed and loads are the counters of the engines it was before
	// a restart (result).
	computed, loads int64
}

// cont is the account of a request an engine fault touched, shared by
// its legs.
type cont struct {
	origin *flight // its first leg
	// first and last are when the client had its first and last token
	// (first 0: none yet), firstLeg the leg that sent the first, itl the
	// gaps between its tokens, whatever leg sent them.
	first, last time.Duration
	firstLeg    *flight
	itl         []time.Duration
	// sent is the tokens the client had from the legs before the current
	// one.
	sent int
	// spent are the attempts at moving it counted against
	// migration.max_attempts, resent its re-sends before its first token,
	// tried the engines it failed on, moved its moves.
	spent, resent, moved int
	tried                []int
	// hitAt is when the fault of the engine it was streaming from began
	// (0: it was not streaming then), hitEngine that engine.
	hitAt     time.Duration
	hitEngine int
	// v and body are the original request's (for its continuations).
	v    *request.View
	body []byte
}

// faultState is a run's account of its engine fault.
type faultState struct {
	run           report.FaultRun
	added, bounds []time.Duration
	extra         int64
	streams       int
}

// engineFault is the run's engine fault and when it begins, "" for none.
func (f Faults) engineFault() (string, time.Duration) {
	switch {
	case f.KillAt > 0:
		return FaultKill, f.KillAt
	case f.HangAt > 0:
		return FaultHang, f.HangAt
	case f.RollingAt > 0:
		return FaultRolling, f.RollingAt
	}
	return "", 0
}

// startFaults schedules the run's engine fault.
func (s *sim) startFaults() {
	kind, at := s.cfg.Faults.engineFault()
	if kind == "" {
		return
	}
	s.flt = &faultState{run: report.FaultRun{Kind: kind, AtMs: ms(at)}}
	switch kind {
	case FaultKill:
		s.push(at, evKill, 0)
	case FaultHang:
		s.push(at, evHang, 0)
	case FaultRolling:
		s.push(at, evDrain, 0)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// engineFault handles a fault's event for engine i.
func (s *sim) engineFault(class uint8, i int) {
	n := &s.nodes[i]
	switch class {
	case evKill:
		s.eject(i)
		for _, f := range s.freeze(i) {
			s.hit(f.c, i)
			s.lost(f, i, false)
		}
	case evHang:
		n.down.hung = true
		n.down.lost = s.freeze(i)
		for _, f := range n.down.lost {
			s.hit(f.c, i)
			s.push(s.dueOf(f), evDetect, i)
		}
	case evDetect:
		kept := n.down.lost[:0]
		var due []*flight
		for _, f := range n.down.lost {
			if s.dueOf(f) <= s.now {
				due = append(due, f)
			} else {
				kept = append(kept, f)
			}
		}
		n.down.lost = kept
		if len(due) > 0 && !n.down.found {
			// The breaker judges the first stream found; the engine
			// leaves the fleet.
			n.down.found = true
			s.eject(i)
		}
		for _, f := range due {
			s.lost(f, i, false)
		}
	case evDrain:
		n.down.draining = true
		s.fleet.Drain(n.b, Epoch.Add(s.now))
		for _, r := range n.eng.Requests(nil) {
			f := r.Tag.(*flight)
			if f.c == nil && f.Generated > 0 && f.first <= s.now || f.c != nil && f.c.first > 0 && f.c.first <= s.now {
				s.hit(s.touch(f), i)
			}
		}
		if n.eng.Idle() && !n.busy {
			s.stop(i)
			return
		}
		s.push(s.now+s.cfg.Faults.DrainGrace, evGrace, i)
	case evGrace:
		if !n.down.draining || n.down.stopped {
			return
		}
		for _, f := range s.freeze(i) {
			s.lost(f, i, true)
		}
		s.stop(i)
	case evUp:
		st := n.eng.Stats()
		n.down.computed += st.PrefillTokensComputed
		n.down.loads += st.LoRALoads
		n.eng = engine.New(s.cfg.Engines[i], s.cfg.KVBlocks)
		n.computed, n.loads = 0, fleet.Counters{}
		if s.cfg.KVEvents != nil {
			n.eng.SetKVEvents(true)
			s.sched.Precise().Reset(n.b.ID, true, Epoch.Add(s.now))
		}
		n.busy = false
		since, _ := n.b.DrainingSince()
		n.down.draining, n.down.stopped = false, false
		s.fleet.Undrain(n.b)
		s.flt.run.RestartsMs = append(s.flt.run.RestartsMs, ms(Epoch.Add(s.now).Sub(since)))
		if i+1 < len(s.nodes) {
			s.push(s.now, evDrain, i+1)
		}
	}
}

// hit notes that c's stream, if its client had a token, was streaming
// from engine i when its fault began, now; a stream's first fault counts.
func (s *sim) hit(c *cont, i int) {
	if c.hitAt == 0 && c.first > 0 {
		c.hitAt, c.hitEngine = s.now, i
	}
}

// stop stops draining engine i, which holds no request any more, and
// starts it again EngineStart later.
func (s *sim) stop(i int) {
	n := &s.nodes[i]
	if n.down.stopped {
		return
	}
	n.down.stopped = true
	s.freeze(i)
	s.push(s.now+s.cfg.Faults.EngineStart, evUp, i)
}

// eject takes engine i out of the fleet as the live breaker does when it
// opens: unhealthy, its prefix picture forgotten.
func (s *sim) eject(i int) {
	s.fleet.SetHealthy(s.nodes[i].b, false)
	s.sched.Forget(s.nodes[i].b.ID)
}

// freeze stops engine i at s.now: the step under way never ends and its
// tokens never reach a client. It returns the requests the engine had
// (running, waiting, and those finished in the step under way) but those
// it lost before, each leg's tokens cut back to those its client had by
// now, and the leg gone.
func (s *sim) freeze(i int) []*flight {
	n := &s.nodes[i]
	n.gen++
	n.busy = true
	var out []*flight
	for _, r := range n.eng.Requests(nil) {
		if f := r.Tag.(*flight); !f.gone {
			out = append(out, f)
		}
	}
	for _, d := range n.out {
		if !d.first && !d.f.gone && !slices.Contains(out, d.f) {
			out = append(out, d.f) // finished in the step under way
		}
	}
	clear(n.out)
	n.out = n.out[:0]
	n.itlN, n.itlSum = 0, 0
	for _, f := range out {
		s.cut(f)
	}
	return out
}

// touch returns f's account, making it from f (its first leg) when it has
// none.
func (s *sim) touch(f *flight) *cont {
	if f.c != nil {
		return f.c
	}
	c := &cont{origin: f, itl: f.itl}
	if f.Generated > 0 {
		c.first, c.last, c.firstLeg = f.first, f.last, f
	}
	f.c = c
	return c
}

// cut makes f, a leg of an engine that failed at s.now, a touched one and
// takes back the token of the step under way, which its client never had;
// the leg's tokens are then the client's (cont.sent).
func (s *sim) cut(f *flight) {
	c := s.touch(f)
	got := f.Generated
	if got > 0 && c.last > s.now {
		got--
		if got == 0 && c.sent == 0 {
			c.first, c.last, c.firstLeg = 0, 0, nil
		} else if k := len(c.itl); k > 0 {
			c.last -= c.itl[k-1]
			c.itl = c.itl[:k-1]
		}
	}
	c.sent += got
	f.gone = true
}

// dueOf is when the router finds f, a request of a hung engine: its
// stream's idle timeout after its last token, or after it was sent.
func (s *sim) dueOf(f *flight) time.Duration {
	idle := s.cfg.Faults.StreamIdle
	if idle <= 0 {
		idle = DefaultStreamIdle
	}
	_, hangAt := s.cfg.Faults.engineFault()
	if c := f.c; c != nil && c.first > 0 {
		return max(c.last+idle, hangAt)
	}
	return max(f.Arrival, hangAt) + idle
}

// hungOn notes f, just added to hung engine i, among the requests to find.
func (s *sim) hungOn(f *flight, i int) {
	n := &s.nodes[i]
	s.touch(f)
	f.gone = true
	n.down.lost = append(n.down.lost, f)
	s.push(s.dueOf(f), evDetect, i)
}

// lost handles f, a leg engine i lost at s.now (drain: the router cut it
// after the drain's grace): its load released, its stream moved or its
// request sent again, or its client's error.
func (s *sim) lost(f *flight, i int, drain bool) {
	c := f.c
	if f.a == nil {
		return // bypassed the router: not this run's traffic
	}
	f.a.Done(Epoch.Add(s.now))
	if !drain {
		c.tried = append(c.tried, i)
	}
	if c.v == nil {
		r := &s.reqs[f.k]
		c.body = r.Body(s.model)
		v, _, perr := s.view(r)
		if perr != nil {
			s.faultError(c, "parse: "+perr.Message)
			return
		}
		c.v = v
	}
	if c.sent == 0 {
		s.resend(c, drain)
		return
	}
	if err := migrate.Check(c.v, c.body); err != nil {
		s.flt.run.Refused++
		s.faultError(c, "backend_stream_broken: "+err.Error())
		return
	}
	for free := drain; s.cfg.Migration.Attempt(&c.spent, free); free = false {
		_, nv, err := migrate.Continuation(c.v, c.body, answer(c.sent), c.sent, s.cfg.Request)
		if err == nil {
			err = s.cfg.Migration.Fits(nv.PromptTokens)
		}
		if err != nil {
			s.flt.run.Refused++
			s.faultError(c, "backend_stream_broken: "+err.Error())
			return
		}
		var hashes []uint64
		if s.shareHashes {
			hashes = s.hash(nv.Prompt, s.sched.Salt(nv))
		}
		a, err := s.route(s.sched, nv, hashes, c.tried)
		if err != nil {
			break // nowhere to go
		}
		nf := s.leg(c, a, nv.Prompt, hashes, max(1, c.origin.OutputTokens-c.sent), nv.MaxTokens)
		nf.contd = true
		if !s.add(nf, a) {
			c.tried = append(c.tried, a.Backend.ID)
			continue // refused (the context): the next attempt counts
		}
		if c.moved == 0 {
			s.flt.streams++
		}
		c.moved++
		s.flt.run.Moved++
		return
	}
	s.flt.run.Refused++
	s.faultError(c, "backend_stream_broken: not moved")
}

// resend sends c's request, which had no token yet, again from scratch,
// as the live router retries a request before its first byte (a drain's
// re-send not counted).
func (s *sim) resend(c *cont, drain bool) {
	o := c.origin
	for drain || c.resent < config.DefaultRetryAttempts {
		if !drain {
			c.resent++
		}
		drain = false
		a, err := s.route(s.sched, c.v, o.PromptHashes, c.tried)
		if err != nil {
			break
		}
		nf := s.leg(c, a, o.Prompt, o.PromptHashes, o.OutputTokens, o.MaxTokens)
		if s.add(nf, a) {
			s.flt.run.Resent++
			return
		}
		c.tried = append(c.tried, a.Backend.ID)
	}
	s.faultError(c, "no backend answered")
}

// leg is a new leg of c on a's engine.
func (s *sim) leg(c *cont, a *scheduler.Assignment, prompt string, hashes []uint64, out, maxTokens int) *flight {
	o := c.origin
	e := a.Backend.ID
	s.nextID++
	f := &flight{arrival: o.arrival, backend: int32(e), k: o.k, oracle: o.oracle, c: c}
	f.ID = s.nextID
	f.Prompt, f.Adapter = prompt, o.Adapter
	if o.PromptHashes != nil {
		f.PromptHashes = hashes // else the router's are not the engine's
	}
	f.OutputTokens, f.MaxTokens = out, maxTokens
	f.Tag = f
	return f
}

// add queues leg f, routed by a, on its engine; false when the engine
// refused it (its load released).
func (s *sim) add(f *flight, a *scheduler.Assignment) bool {
	f.a = a
	e := a.Backend.ID
	if err := s.nodes[e].eng.Add(&f.Request, s.now); err != nil {
		a.Done(Epoch.Add(s.now))
		return false
	}
	s.started(f, e)
	return true
}

// faultError records c's request as failed by the fault.
func (s *sim) faultError(c *cont, msg string) {
	o := c.origin
	s.flt.run.Errors++
	s.fail(o.k, o.PromptTokens, int(o.backend), msg)
}

// answer is the text of the first n tokens of an answer: what a
// continuation appends to the prompt. The engine model's output has no
// text; any of n tokens of its tokenizer serves (no engine caches an
// answer's blocks), and the same n always gives the same text.
func answer(n int) string { return strings.Repeat(" tok", n) }

// tokenMoved is Token for a leg of a touched request: the client's
// tokens, whatever leg sends them.
func (s *sim) tokenMoved(f *flight, r *engine.Request, at time.Duration) {
	c := f.c
	n := &s.nodes[s.cur]
	if r.Generated == 1 {
		f.first = at
		n.out = append(n.out, delivery{f: f, first: true})
		if f.contd {
			s.flt.extra += int64(r.PromptTokens - r.CachedTokens)
		}
	}
	f.last = at
	if c.first == 0 {
		c.first, c.last, c.firstLeg = at, at, f
		return
	}
	gap := at - c.last
	if len(c.itl) < cap(c.itl) {
		c.itl = append(c.itl, gap)
	}
	if r.Generated > 1 {
		// An engine's inter-token gap; a move's is not.
		n.itlN++
		n.itlSum += gap
	}
	c.last = at
}

// recordMoved completes the sample of a touched request from its
// account: one TTFT (its first token's), the prompt and routing of the
// leg that sent it, every token and gap the client had.
func (s *sim) recordMoved(f *flight, smp *report.Sample) {
	c := f.c
	o, l := c.origin, c.firstLeg // l sent the first token: its response is the client's
	smp.ITL = c.itl
	smp.PromptTokens, smp.CachedTokens = l.PromptTokens, l.CachedTokens
	smp.OutputTokens = c.sent + f.Generated
	smp.Backend = s.nodes[l.backend].b.Name
	smp.MatchedTokens, smp.Route = l.a.MatchedTokens, l.a.Reason
	smp.PredTTFT, smp.PredITL = l.a.Pred.TTFT, l.a.Pred.ITL
	smp.TTFT = c.first - f.arrival
	smp.Held = o.Arrival - o.arrival
	smp.Queued = max(0, l.ScheduledAt-l.Arrival)
	if c.hitAt == 0 {
		return
	}
	added, before, ok := report.AddedLatency(c.first, c.itl, c.hitAt)
	if !ok {
		return
	}
	p := s.cfg.Engines[c.hitEngine]
	bound := report.MoveBound(p.StepOverhead, p.PerPrefillToken, o.PromptTokens+before)
	if added > bound {
		s.flt.run.Over++
	}
	s.flt.added = append(s.flt.added, added)
	s.flt.bounds = append(s.flt.bounds, bound)
}

// faultResult sums the run's fault up, nil without one.
func (s *sim) faultResult() *report.FaultRun {
	if s.flt == nil {
		return nil
	}
	r := s.flt.run
	r.Streams = s.flt.streams
	r.ExtraPrefillTokens = s.flt.extra
	r.Hit = len(s.flt.added)
	r.Added50, r.Added99 = ms(quantile(s.flt.added, 0.5)), ms(quantile(s.flt.added, 0.99))
	r.Bound99 = ms(quantile(s.flt.bounds, 0.99))
	return &r
}

// quantile is q of ds (sorted in place), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
