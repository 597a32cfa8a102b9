// Package emulator is the real-time, HTTP face of the engine model: a
// vLLM-compatible server (chat and text completions, streaming or not,
// /v1/models, /health, and /metrics in vLLM's own metric names) whose
// answers come from package engine driven on the wall clock.
//
// It owns the driver loop, the wire format and the metrics; it must not
// decide anything about scheduling, caching, timing or output length: those
// belong to package engine, which the simulator drives in virtual time. If
// a rule of the engine model appears here, one of the two copies is wrong.
package emulator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// Config configures a Server.
type Config struct {
	// Preset is the hardware and model setup whose timing the engine models.
	Preset engine.Preset
	// KVBlocks, when positive, overrides the preset's KV cache capacity in
	// blocks of engine.BlockSize tokens.
	KVBlocks int
	// TimeScale is emulated seconds per real second: 10 runs the engine ten
	// times faster than the hardware it models. Zero means 1.
	TimeScale float64
	// Model is the served model name; empty means the preset's.
	Model string
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// KVEvents, when not nil, publishes the engine's KV cache events as
	// vLLM does (kvevents.ParseConfig reads vLLM's --kv-events-config):
	// one batch per engine step that stored or evicted blocks, sent when
	// the step ends.
	KVEvents *kvevents.PublisherConfig
	// LoRAModules are the LoRA adapters served (vLLM's --lora-modules),
	// which needs Preset.MaxLoras > 0 (--max-loras); lora.go.
	LoRAModules []LoRAModule
	// Role is the engine's part in a disaggregated fleet (kvtransfer.go):
	// prefill, decode, or both ("" too), which takes either leg.
	Role string
	// EngineID names the engine in its prefill answers' remote_engine_id
	// (vLLM's kv_transfer_config.engine_id); empty means a random UUID.
	EngineID string
	// SideChannel is the "host:port" its prefill answers name as
	// remote_host and remote_port (vLLM's NIXL side channel); empty means
	// Start's listening address, or localhost:5600 (vLLM's defaults).
	SideChannel string
}

// Server is one emulated engine behind its HTTP handler.
type Server struct {
	model  string
	preset engine.Preset // the engine's, fixed at New
	scale  float64
	log    *slog.Logger
	start  time.Time // emulated time 0

	// mu guards eng and every field of pending marked "driver" below: the
	// engine is not safe for concurrent use and handlers add and abort
	// requests while the driver steps it.
	mu  sync.Mutex
	eng *engine.Engine
	// lastAdd is the emulated time of the latest Add.
	lastAdd time.Duration
	// maxCatchUp bounds how far back in emulated time a late step may
	// start (see drive).
	maxCatchUp time.Duration
	// sink buffers the events of the step in flight until the emulated
	// clock reaches the step's end.
	sink sink
	// kv publishes KV cache events, nil when they are off; kvEvents are
	// the events of the step in flight, published with its tokens.
	kv       *kvevents.Publisher
	kvEvents []kvevents.Event

	wake      chan struct{} // capacity 1: work arrived
	done      chan struct{} // closed by Close
	driverEnd chan struct{} // closed when the driver returns
	closeOnce sync.Once

	nextID atomic.Uint64
	// steps, lagSum and lagMax say how late, in real time, the driver got
	// around to delivering steps (see DriverStats).
	steps, lagSum, lagMax atomic.Int64
	// slip is the emulated time lost between consecutive busy steps.
	slip atomic.Int64
	reg  *prometheus.Registry
	// loras are the served adapters by name, loraOrder as configured,
	// loraInfo the vllm:lora_requests_info series (lora.go).
	loras     map[string]LoRAModule
	loraOrder []LoRAModule
	loraInfo  *loraHistory
	ttft      prometheus.Observer
	itl       prometheus.Observer
	requests  *requestMetrics // metrics.go
	handler   http.Handler
	// role, engineID, sideHost and sidePort: the engine's part in a
	// disaggregated fleet (kvtransfer.go), fixed at New.
	role, engineID, sideHost string
	sidePort                 int
	// stored are the Responses API's stored responses (agents.go).
	stored responseStore
}

// New builds a Server and starts its driver; Close stops it.
func New(cfg Config) (*Server, error) {
	if cfg.Preset.Name == "" {
		return nil, errors.New("emulator: config has no preset")
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("emulator: time scale %g is negative", cfg.TimeScale)
	}
	if cfg.KVBlocks < 0 {
		return nil, fmt.Errorf("emulator: KV blocks %d is negative", cfg.KVBlocks)
	}
	s := &Server{
		model:     cfg.Model,
		scale:     cfg.TimeScale,
		log:       cfg.Logger,
		eng:       engine.New(cfg.Preset, cfg.KVBlocks),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		driverEnd: make(chan struct{}),
	}
	s.preset = s.eng.Preset()
	if s.model == "" {
		s.model = cfg.Preset.Model
	}
	if s.scale == 0 {
		s.scale = 1
	}
	s.maxCatchUp = time.Duration(float64(MaxCatchUp) * s.scale)
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.KVEvents != nil {
		kv, err := kvevents.NewPublisher(context.Background(), *cfg.KVEvents)
		if err != nil {
			return nil, fmt.Errorf("emulator: %w", err)
		}
		s.kv = kv
		s.eng.SetKVEvents(true)
	}
	if err := s.checkLoRA(cfg.LoRAModules); err != nil {
		return nil, err
	}
	var err error
	if s.role, err = checkRole(cfg.Role); err != nil {
		return nil, err
	}
	s.engineID = cmp.Or(cfg.EngineID, uuid.NewString())
	if s.sideHost, s.sidePort, err = splitHostPort(cmp.Or(cfg.SideChannel, "localhost:5600")); err != nil {
		return nil, err
	}
	s.loraOrder = cfg.LoRAModules
	s.initMetrics()
	s.handler = s.routes()
	s.start = time.Now()
	go s.drive()
	return s, nil
}

// Model is the served model name.
func (s *Server) Model() string { return s.model }

// Preset is the engine's preset, with KVBlocks as overridden (and
// MaxModelLen as the engine bounds it).
func (s *Server) Preset() engine.Preset { return s.preset }

// Stats returns the engine's counters.
func (s *Server) Stats() engine.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Stats()
}

// LoRA returns the adapters of the engine's running and waiting requests.
func (s *Server) LoRA() engine.LoRAInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.LoRA()
}

// Handler is the HTTP handler serving the vLLM API.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the driver; requests still waiting get a 503 or a cut stream.
// It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	<-s.driverEnd
	if s.kv != nil {
		return s.kv.Close()
	}
	return nil
}

// MaxCatchUp is how far behind the real clock, in real time, the driver
// may start a step to make up for waking late.
const MaxCatchUp = 50 * time.Millisecond

// DriverStats say how well the driver keeps up with the emulated clock.
type DriverStats struct {
	// Steps is the number of steps run.
	Steps int64
	// MeanLate and WorstLate are how late, in real time, the driver
	// delivered steps' tokens after their scheduled end.
	MeanLate, WorstLate time.Duration
	// Slip is the emulated time lost between busy steps (the engine
	// model has none): near zero when the machine keeps up.
	Slip time.Duration
}

// Driver reports how well the driver keeps up with the emulated clock.
func (s *Server) Driver() DriverStats {
	st := DriverStats{Steps: s.steps.Load(), WorstLate: time.Duration(s.lagMax.Load()), Slip: time.Duration(s.slip.Load())}
	if st.Steps > 0 {
		st.MeanLate = time.Duration(s.lagSum.Load() / st.Steps)
	}
	return st
}

// now is the emulated clock: real time since start, times the scale.
func (s *Server) now() time.Duration {
	return time.Duration(float64(time.Since(s.start)) * s.scale)
}

// realAt is the wall-clock instant at which the emulated clock reads t.
func (s *Server) realAt(t time.Duration) time.Time {
	return s.start.Add(time.Duration(float64(t) / s.scale))
}

// pending is one request's state shared by its handler and the driver.
type pending struct {
	r engine.Request // driver: only touched under Server.mu

	// Driver fields, under Server.mu.
	stepGen    int  // r.Generated as of the buffered step
	stepFin    bool // the buffered step finished r
	buffered   bool // r is in the sink's buffer
	engineDone bool // the engine has finished r (no Abort needed)
	sawFirst   bool // TTFT observed
	// lastTok is the emulated time of r's last token, and stepITL the gap
	// to it from the buffered step's token (0 for none or a first token).
	lastTok, stepITL time.Duration

	// Published by the driver when the emulated clock reaches the end of
	// the step that produced them; the handler reads them without the
	// lock. promptTokens and cachedTokens are written before finished is
	// set and read only after it is seen.
	delivered    atomic.Int64
	finished     atomic.Bool
	promptTokens int
	cachedTokens int
	// kvBlocks are the blocks a finished prefill leg (HoldKV) keeps for
	// the decode engine, written with finished like the two above.
	kvBlocks []int
	notify   chan struct{} // capacity 1: something was delivered
	// finish is the response's finish reason, set before the request is
	// added.
	finish string
}

// sink buffers a step's events; the driver delivers them after sleeping
// until the step's end, so that no client sees a token before its time.
type sink struct{ buf []*pending }

func (k *sink) touch(p *pending) {
	if !p.buffered {
		p.buffered = true
		k.buf = append(k.buf, p)
	}
}

// Token implements engine.Sink.
func (k *sink) Token(r *engine.Request, at time.Duration) {
	p := r.Tag.(*pending)
	p.stepGen = r.Generated
	if r.Generated > 1 {
		p.stepITL = at - p.lastTok
	}
	p.lastTok = at
	k.touch(p)
}

// Finished implements engine.Sink.
func (k *sink) Finished(r *engine.Request, _ time.Duration) {
	p := r.Tag.(*pending)
	p.stepGen = r.Generated
	p.stepFin = true
	p.engineDone = true
	if r.HoldKV {
		p.kvBlocks = r.BlockIDs(nil)
	}
	k.touch(p)
}

// drive is the engine's only clock: it steps the engine at the emulated
// time, sleeps (in real time) for the step's emulated duration, then lets
// the step's events out. When there is nothing to do it waits for a request.
func (s *Server) drive() {
	defer close(s.driverEnd)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// prevEnd is the emulated end of the previous step while the engine
	// stays busy, -1 after it went idle.
	prevEnd := time.Duration(-1)
	for {
		s.mu.Lock()
		idle := s.eng.Idle()
		var d, end time.Duration
		if !idle {
			now := s.now()
			if prevEnd >= 0 {
				// A GPU starts its next step when the last one ends, not
				// when the host got around to it: when the driver woke
				// late, the step starts back at prevEnd, so that host
				// jitter delays delivery without slowing the emulated
				// engine down. It never starts before a request that is
				// already queued arrived, nor further back than
				// maxCatchUp (a stalled process resynchronises).
				start := max(prevEnd, s.lastAdd, now-s.maxCatchUp)
				if start < now {
					s.slip.Add(int64(start - prevEnd))
					now = start
				} else {
					s.slip.Add(int64(now - prevEnd))
				}
			}
			d = s.eng.Step(now, &s.sink)
			end = now + d
			prevEnd = end
		} else {
			// Nothing queued, but blocks held for a decode engine may
			// have timed out.
			s.eng.Step(s.now(), &s.sink)
		}
		if s.kv != nil {
			s.kvEvents = s.eng.TakeKVEvents(s.kvEvents)
		}
		wakeAt, pending := s.eng.Wake()
		flush := len(s.sink.buf) > 0 || len(s.kvEvents) > 0
		s.mu.Unlock()

		if idle || d == 0 {
			prevEnd = -1
			// Nothing runnable: only a new request (or an abort that frees
			// room), a KV transfer ending or a hold timing out can change
			// that.
			if flush {
				s.deliver()
			}
			var timeout <-chan time.Time
			if pending {
				timer.Reset(max(time.Until(s.realAt(wakeAt)), 0))
				timeout = timer.C
			}
			select {
			case <-s.wake:
				timer.Stop()
				continue
			case <-timeout:
				continue
			case <-s.done:
				return
			}
		}
		if wait := time.Until(s.realAt(end)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-s.done:
				timer.Stop()
				return
			}
		}
		late := int64(time.Since(s.realAt(end)))
		s.steps.Add(1)
		s.lagSum.Add(late)
		if late > s.lagMax.Load() {
			s.lagMax.Store(late)
		}
		s.deliver()
	}
}

// deliver publishes the buffered events to the waiting handlers without
// ever blocking on them: each gets at most one pending notification and
// reads how far it got from its counters.
func (s *Server) deliver() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publishKV()
	for i, p := range s.sink.buf {
		p.buffered = false
		if !p.sawFirst && p.stepGen > 0 {
			p.sawFirst = true
			s.ttft.Observe((p.r.FirstTokenAt - p.r.Arrival).Seconds())
		}
		if p.stepITL > 0 {
			// On the real clock, as the engine's clients see it: the router
			// weighs it against the TTFTs it measures itself, so an engine
			// run at --time-scale 10 must look ten times faster in both.
			s.itl.Observe(p.stepITL.Seconds() / s.scale)
			p.stepITL = 0
		}
		if p.stepFin {
			p.promptTokens = p.r.PromptTokens
			p.cachedTokens = p.r.CachedTokens
			s.finished(p)
		}
		p.delivered.Store(int64(p.stepGen))
		if p.stepFin {
			p.finished.Store(true)
		}
		select {
		case p.notify <- struct{}{}:
		default:
		}
		s.sink.buf[i] = nil
	}
	s.sink.buf = s.sink.buf[:0]
}

// publishKV publishes the KV cache events taken from the engine so far as
// one batch; the caller holds s.mu, which keeps batches in the engine's
// order. Publish only encodes and queues, so the lock is held briefly.
func (s *Server) publishKV() {
	if s.kv == nil || len(s.kvEvents) == 0 {
		return
	}
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: s.kvEvents, DPRank: 0}
	if _, err := s.kv.Publish(b); err != nil {
		s.log.Warn("emulator: publish kv events", "err", err)
	}
	clear(s.kvEvents)
	s.kvEvents = s.kvEvents[:0]
}

// resetPrefixCache empties the engine's prefix cache, publishing what the
// step in flight stored first, then the AllBlocksCleared.
func (s *Server) resetPrefixCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eng.ResetPrefixCache()
	if s.kv != nil {
		s.kvEvents = s.eng.TakeKVEvents(s.kvEvents)
		s.publishKV()
	}
}

// KVEventsAddr is the KV event publisher's bound address, nil when events
// are off or the publisher connects.
func (s *Server) KVEventsAddr() net.Addr {
	if s.kv == nil {
		return nil
	}
	return s.kv.Addr()
}

// KVEventsReplayAddr is the replay socket's bound address, nil without one.
func (s *Server) KVEventsReplayAddr() net.Addr {
	if s.kv == nil {
		return nil
	}
	return s.kv.ReplayAddr()
}

// add queues a request in the engine and wakes the driver.
func (s *Server) add(p *pending) error {
	s.mu.Lock()
	s.lastAdd = s.now()
	err := s.eng.Add(&p.r, s.lastAdd)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// abort removes p from the engine unless the engine already finished it.
func (s *Server) abort(p *pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.engineDone {
		return
	}
	p.engineDone = true
	s.eng.Abort(&p.r)
	// The freed blocks may let a waiting request in.
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
