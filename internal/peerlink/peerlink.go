// Package peerlink is a kvroute replica's link to its peers over NATS:
// it sends what package replica queues (the Outbox) in batches, a
// heartbeat with this replica's whole load every sync.heartbeat, and its
// recent decisions to a peer that asks; it receives its peers' batches and
// applies them (replica.Peers), and forgets a silent peer's load after
// sync.peer_timeout.
//
// Routing never waits for it: the scheduler's events go into a bounded
// queue, and everything here runs on its own goroutines (the sender, and
// nats.go's subscription handlers). When NATS is unreachable the replica
// routes on its own state; nats.go reconnects by itself, and on every
// (re)connection the replica reports its load and asks its peers for
// their history, as it does of any peer it hears from for the first time.
//
// Subjects, under sync.subject (S) and this replica's ID (ID):
//
//	S.events.ID      this replica's event and heartbeat batches (ordered)
//	S.snapshot       "send me your history", to every replica
//	S.snapshot.ID    the same, to this replica only
//	S.inbox.ID       the answers: snapshot batches
//
// It must not route, and it keeps no state of its own beyond the
// connection: the peers' state is replica.Peers', this replica's history
// replica.History's.
package peerlink

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/replica"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// maxBatchBytes bounds a batch well under NATS's default 1 MiB payload
// limit; one event (a prompt's hashes) may exceed it alone.
const maxBatchBytes = 256 << 10

// Config is what a Link needs.
type Config struct {
	Sync      config.Sync
	Fleet     *fleet.Fleet
	Scheduler *scheduler.Scheduler
	Log       *slog.Logger
	// Registerer takes the link's metrics; nil for none.
	Registerer prometheus.Registerer
}

// Link is one replica's connection to its peers.
type Link struct {
	cfg         config.Sync
	id          string
	incarnation uint64
	fleet       *fleet.Fleet
	blockChars  int
	log         *slog.Logger
	outbox      *replica.Outbox
	peers       *replica.Peers
	history     *replica.History
	// key tags every message and checks every peer's; nil: none.
	key *replica.Key
	// limited is the peers' limit counters last logged, and when.
	limited   replica.Stats
	limitedAt time.Time

	nc *nats.Conn
	// connected wakes the sender after each (re)connection; snapReq
	// carries the reply subjects of peers' snapshot requests to it.
	connected chan struct{}
	snapReq   chan string
	// asked is when each peer was last asked for a snapshot.
	askMu sync.Mutex
	asked map[string]time.Time
	stop  context.CancelFunc
	done  sync.WaitGroup

	// published and failed count events sent and not sent; streamed and
	// taken the events sent on the events subject, and those of them
	// taken from the outbox.
	published, failed, streamed, taken atomic.Uint64
	lag                                prometheus.Histogram
}

// New builds the link and makes it hear of every routing of
// cfg.Scheduler; it does no I/O until Start.
func New(cfg Config) (*Link, error) {
	id := cfg.Sync.ReplicaID
	if id == "" {
		id = defaultID()
	}
	var inc [8]byte
	_, _ = rand.Read(inc[:])
	l := &Link{
		cfg: cfg.Sync, id: id, fleet: cfg.Fleet, blockChars: cfg.Scheduler.BlockChars(), log: cfg.Log,
		incarnation: binary.LittleEndian.Uint64(inc[:]),
		outbox:      replica.NewOutbox(cfg.Sync.QueueSize),
		peers:       replica.NewPeers(id, cfg.Fleet, cfg.Scheduler, cfg.Sync.PeerTimeout),
		history:     replica.NewHistory(0, 0),
		connected:   make(chan struct{}, 1),
		snapReq:     make(chan string, 16),
		asked:       map[string]time.Time{},
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_sync_lag_seconds",
			Help:    "Time from a peer sending a batch of events to this replica applying it (across hosts, includes their clock offset).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	secret, err := cfg.Sync.ResolveKey()
	if err != nil {
		return nil, err
	}
	if secret != nil {
		if l.key, err = replica.NewKey(secret); err != nil {
			return nil, err
		}
	}
	l.peers.SetMaxPeers(cfg.Sync.MaxPeers)
	cfg.Scheduler.SetEvents(l.outbox)
	if cfg.Registerer != nil {
		if err := l.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// defaultID is the host name with a random suffix.
func defaultID() string {
	host, _ := os.Hostname()
	host = strings.NewReplacer(".", "-", " ", "-", "*", "-", ">", "-").Replace(host)
	if host == "" {
		host = "kvroute"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// ID is this replica's ID among its peers.
func (l *Link) ID() string { return l.id }

// Peers is the peers' state.
func (l *Link) Peers() *replica.Peers { return l.peers }

// Counts is what a Link has sent.
type Counts struct {
	// Queued is the events the scheduler queued; Taken those of them
	// that the sender has since published (or failed to).
	Queued, Taken uint64
	// Streamed is the events published on the events subject, heartbeat
	// reports included.
	Streamed uint64
}

// Counts returns what the link has sent.
func (l *Link) Counts() Counts {
	return Counts{Queued: l.outbox.Queued(), Taken: l.taken.Load(), Streamed: l.streamed.Load()}
}

// Connected reports whether the link is connected to NATS now.
func (l *Link) Connected() bool { return l.nc != nil && l.nc.IsConnected() }

// CaughtUp returns a channel that is closed while this replica is not
// catching up with its peers after a reconnection (replica.Peers.CatchUp).
// nats.go reports the connection up before it runs the reconnection's
// handler, on another goroutine: a request that finds the connection
// back after a cut starts the catch-up itself, so that none is routed in
// between on this replica's own state.
func (l *Link) CaughtUp() <-chan struct{} {
	if l.peers.Quiet() {
		return closed
	}
	if l.peers.Pending() && l.Connected() {
		l.catchUp(l.nc)
	}
	return l.peers.CaughtUp()
}

// closed is a closed channel: CaughtUp's answer when no catch-up is due.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// catchUp starts the catch-up after nc's latest reconnection, unless it
// has started already: requests wait until the peers known before the
// cut have sent their load and decisions, at most a peer timeout (after
// which a peer not heard from is presumed gone).
func (l *Link) catchUp(nc *nats.Conn) {
	if gen, ok := l.peers.CatchUp(nc.Stats().Reconnects); ok {
		time.AfterFunc(l.cfg.PeerTimeout, func() { l.peers.EndCatchUp(gen) })
	}
}

func (l *Link) subject(parts ...string) string {
	return l.cfg.Subject + "." + strings.Join(parts, ".")
}

// Start connects to NATS (or keeps trying in the background, if it is
// unreachable) and starts sending and receiving.
func (l *Link) Start(ctx context.Context) error {
	opts := []nats.Option{
		nats.Name("kvroute " + l.id),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(min(l.cfg.Heartbeat, 2*time.Second)),
		// While disconnected, publishing fails at once rather than
		// buffering stale events for later: the heartbeat and the
		// snapshot after the reconnection bring the peers up to date.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(nc *nats.Conn) { l.wake(nc, "connected") }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.catchUp(nc)
			l.wake(nc, "reconnected")
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			l.peers.Cut()
			l.log.Warn("sync: disconnected from NATS; routing on this replica's own state", "err", err)
		}),
	}
	s := l.cfg
	if s.CredentialsFile != "" {
		opts = append(opts, nats.UserCredentials(s.CredentialsFile))
	}
	if s.User != "" {
		opts = append(opts, nats.UserInfo(s.User, s.Password))
	}
	if s.Token != "" {
		opts = append(opts, nats.Token(s.Token))
	}
	if s.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.TLS.CAFile))
	}
	if s.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(s.TLS.CertFile, s.TLS.KeyFile))
	}
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	l.nc = nc
	subs := []struct {
		subj string
		h    nats.MsgHandler
	}{
		{l.subject("events", "*"), l.receive},
		{l.subject("inbox", l.id), l.receive},
		{l.subject("snapshot"), l.askedSnapshot},
		{l.subject("snapshot", l.id), l.askedSnapshot},
	}
	for _, sb := range subs {
		if _, err := nc.Subscribe(sb.subj, sb.h); err != nil {
			nc.Close()
			return fmt.Errorf("sync: subscribe %s: %w", sb.subj, err)
		}
	}
	ctx, l.stop = context.WithCancel(ctx)
	l.done.Add(1)
	go l.send(ctx)
	l.log.Info("sync: started", "url", s.URL, "subject", s.Subject, "replica", l.id)
	return nil
}

// Close stops the link; in-flight batches are flushed first.
func (l *Link) Close() {
	if l.stop == nil {
		return
	}
	l.stop()
	l.done.Wait()
	if l.nc.IsConnected() {
		_ = l.nc.FlushTimeout(time.Second)
	}
	l.nc.Close()
}

// Abort stops the link as a crash would: the connection closes first,
// unflushed, so that peers hear nothing more (not even the ends of the
// requests still in flight) and must time this replica out.
func (l *Link) Abort() {
	if l.stop == nil {
		return
	}
	l.nc.Close()
	l.stop()
	l.done.Wait()
}

func (l *Link) wake(nc *nats.Conn, what string) {
	l.log.Info("sync: "+what+" to NATS", "url", nc.ConnectedUrlRedacted())
	select {
	case l.connected <- struct{}{}:
	default:
	}
}

// receive applies a peer's events, heartbeat or snapshot.
func (l *Link) receive(m *nats.Msg) {
	data, ok := l.open(m)
	if !ok {
		return
	}
	var b replica.Batch
	if err := replica.Decode(data, &b); err != nil {
		l.peers.CountMalformed()
		l.log.Debug("sync: dropped a malformed message", "subject", m.Subject, "err", err)
		return
	}
	now := time.Now()
	if l.key != nil && now.Sub(time.Unix(0, b.SentAt)).Abs() > l.cfg.PeerTimeout {
		// Tagged, but sent longer ago than a live peer is silent: a
		// replay (or a clock a peer timeout off).
		l.peers.CountUnauthenticated()
		l.log.Debug("sync: dropped a stale message", "subject", m.Subject, "peer", b.Replica)
		return
	}
	a := l.peers.Apply(&b, now)
	if a.Own || a.Refused {
		return
	}
	if b.Kind != replica.Snapshot {
		l.lag.Observe(max(now.Sub(time.Unix(0, b.SentAt)).Seconds(), 0))
	}
	if a.New {
		l.log.Info("sync: peer joined", "peer", b.Replica)
	}
	// Ask a new peer for what it routed before we heard it, and one whose
	// batches were lost (it or we were cut off from NATS) for what they
	// held; at most once a peer timeout per peer.
	if a.New || a.Gap {
		l.askMu.Lock()
		ask := a.New || now.Sub(l.asked[b.Replica]) >= l.cfg.PeerTimeout
		if ask {
			l.asked[b.Replica] = now
		}
		l.askMu.Unlock()
		if ask {
			l.askSnapshot(l.subject("snapshot", b.Replica))
		}
	}
}

// open returns m's message, checking its tag when peers must
// authenticate; false (counted) when it has no valid one.
func (l *Link) open(m *nats.Msg) ([]byte, bool) {
	data, err := l.key.Open(m.Subject, m.Reply, m.Data)
	if err != nil {
		l.peers.CountUnauthenticated()
		l.log.Debug("sync: dropped an unauthenticated message", "subject", m.Subject)
		return nil, false
	}
	return data, true
}

// askSnapshot asks subj for a snapshot, answered to this replica's inbox.
func (l *Link) askSnapshot(subj string) {
	reply := l.subject("inbox", l.id)
	_ = l.nc.PublishRequest(subj, reply, l.key.Seal(nil, subj, reply))
}

// askedSnapshot hands a peer's snapshot request to the sender, which owns
// the history. A request to every replica comes from a peer that has just
// (re)connected: what it routed while it was away is missing here too, so
// it is asked back for its own.
func (l *Link) askedSnapshot(m *nats.Msg) {
	own := l.subject("inbox", l.id)
	if m.Reply == "" || m.Reply == own {
		return
	}
	if _, ok := l.open(m); !ok {
		return
	}
	select {
	case l.snapReq <- m.Reply:
	default: // a burst of requests: the others will ask again when they see us anew
	}
	if m.Subject == l.subject("snapshot") {
		if peer, ok := strings.CutPrefix(m.Reply, l.subject("inbox", "")); ok && peer != "" {
			l.askSnapshot(l.subject("snapshot", peer))
		}
	}
}

// send is the sender goroutine: it batches the outbox, sends heartbeats,
// answers snapshot requests and expires silent peers.
func (l *Link) send(ctx context.Context) {
	defer l.done.Done()
	hb := time.NewTicker(l.cfg.Heartbeat)
	defer hb.Stop()
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	var (
		seq   uint64
		buf   []byte
		batch = replica.Batch{Kind: replica.Events, Replica: l.id, Incarnation: l.incarnation, BlockChars: l.blockChars}
		size  int
	)
	publish := func(b *replica.Batch, subj string) {
		if b.Kind != replica.Snapshot {
			seq++
			b.Seq = seq
		}
		b.SentAt = time.Now().UnixNano()
		buf = l.key.Seal(replica.Append(buf[:0], b), subj, "")
		err := l.nc.Publish(subj, buf)
		n := uint64(len(b.Events))
		switch {
		case err != nil:
			l.failed.Add(n)
		case b.Kind == replica.Snapshot:
			l.published.Add(n)
		default:
			l.published.Add(n)
			l.streamed.Add(n)
		}
		if b.Kind == replica.Events {
			l.taken.Add(n)
		}
	}
	events := l.subject("events", l.id)
	flushEvents := func() {
		if len(batch.Events) > 0 {
			publish(&batch, events)
			clear(batch.Events)
			batch.Events, size = batch.Events[:0], 0
		}
	}
	add := func(e replica.Event) {
		if len(batch.Events) == 0 && l.cfg.FlushInterval > 0 {
			flush.Reset(l.cfg.FlushInterval)
		}
		l.history.Add(e)
		batch.Events = append(batch.Events, e)
		if size += replica.Size(&e); size >= maxBatchBytes {
			flushEvents()
		}
	}
	heartbeat := func() {
		// What is queued now was counted in the load the heartbeat
		// reports: send it first, so that receivers do not add it twice.
		for _, e := range l.outbox.Drain(nil, l.cfg.QueueSize) {
			add(e)
		}
		flushEvents()
		hbBatch := replica.Batch{Kind: replica.Heartbeat, Replica: l.id, Incarnation: l.incarnation, BlockChars: l.blockChars,
			Events: replica.OwnReport(l.fleet, nil)}
		publish(&hbBatch, events)
	}
	snapshot := func(reply string) {
		b := replica.Batch{Kind: replica.Snapshot, Replica: l.id, Incarnation: l.incarnation, BlockChars: l.blockChars}
		n, sent := 0, false
		for _, e := range l.history.Events(nil) {
			b.Events = append(b.Events, e)
			if n += replica.Size(&e); n >= maxBatchBytes {
				publish(&b, reply)
				b.Events, n, sent = b.Events[:0], 0, true
			}
		}
		if len(b.Events) > 0 || !sent {
			publish(&b, reply) // an empty history is an answer too
		}
	}
	for {
		select {
		case <-ctx.Done():
			flushEvents()
			return
		case e := <-l.outbox.C():
			add(e)
			for _, e := range l.outbox.Drain(nil, 256) {
				add(e)
			}
			if l.cfg.FlushInterval == 0 {
				flushEvents()
			}
		case <-flush.C:
			flushEvents()
		case now := <-hb.C:
			heartbeat()
			l.peers.Expire(now)
			l.logLimits(now)
		case <-l.connected:
			heartbeat()
			// Catch up on what the peers routed while we were away.
			l.askSnapshot(l.subject("snapshot"))
		case reply := <-l.snapReq:
			snapshot(reply)
		}
	}
}

// limitLogEvery is the shortest time between two log lines about the
// peers' limits.
const limitLogEvery = 10 * time.Second

// logLimits logs what the peers' limits refused, evicted or clamped since
// the last time it did, at most once every limitLogEvery; it also forgets
// the snapshot requests older than a peer timeout, which would not hold
// back a new one. Run by the sender.
func (l *Link) logLimits(now time.Time) {
	l.askMu.Lock()
	for id, at := range l.asked {
		if now.Sub(at) >= l.cfg.PeerTimeout {
			delete(l.asked, id)
		}
	}
	l.askMu.Unlock()
	if now.Sub(l.limitedAt) < limitLogEvery {
		return
	}
	s, was := l.peers.Stats(), l.limited
	if s.Unauthenticated == was.Unauthenticated && s.Refused == was.Refused && s.Evicted == was.Evicted && s.Clamped == was.Clamped {
		return
	}
	l.log.Warn("sync: peers' messages limited", "unauthenticated", s.Unauthenticated-was.Unauthenticated,
		"peers_refused", s.Refused-was.Refused, "pinned_blocks_evicted", s.Evicted-was.Evicted,
		"load_clamped", s.Clamped-was.Clamped, "live_peers", l.peers.Live())
	l.limited, l.limitedAt = s, now
}

// register adds the link's metrics to r.
func (l *Link) register(r prometheus.Registerer) error {
	stat := func(f func(replica.Stats) uint64) func() float64 {
		return func() float64 { return float64(f(l.peers.Stats())) }
	}
	cs := []prometheus.Collector{
		l.lag,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_sync_peers", Help: "Live peer replicas: heard from within sync.peer_timeout."},
			func() float64 { return float64(l.peers.Live()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_sync_blind_window_seconds", Help: "How long this replica presumes its peers' decisions take to arrive (a moving average of their batches' lag), during which it presumes each peer routes as it does."},
			func() float64 { return l.peers.BlindWindow().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_sync_connected", Help: "1 while the replica is connected to NATS."},
			func() float64 {
				if l.Connected() {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_events_published_total", Help: "Events (decisions, load changes, heartbeat reports, snapshot entries) this replica sent to NATS."},
			func() float64 { return float64(l.published.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_events_received_total", Help: "Events received from peer replicas and applied."},
			stat(func(s replica.Stats) uint64 { return s.Events })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_events_dropped_total", Help: "Events this replica did not send: its queue was full, or NATS was unreachable."},
			func() float64 { return float64(l.outbox.Dropped() + l.failed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_gaps_total", Help: "Peer batches that arrived after a gap in their sequence (some were lost)."},
			stat(func(s replica.Stats) uint64 { return s.Gaps })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_malformed_total", Help: "Messages on the sync subjects that did not decode, ignored."},
			stat(func(s replica.Stats) uint64 { return s.Malformed })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_peers_expired_total", Help: "Peers forgotten, with their load, after sync.peer_timeout of silence."},
			stat(func(s replica.Stats) uint64 { return s.Expired })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvroute_sync_catchups_cut_total", Help: "Catch-ups after a reconnection to NATS that sync.peer_timeout ended before every peer known at the cut had sent its load and decisions."},
			stat(func(s replica.Stats) uint64 { return s.CatchUpsCut })),
	}
	// The peers' limits (replica/limits.go), each hit counted.
	for _, m := range []struct {
		name, help string
		f          func(replica.Stats) uint64
	}{
		{"kvroute_sync_unauthenticated_total", "Messages on the sync subjects dropped, with a sync key set, for a missing or wrong tag or for being older than sync.peer_timeout.",
			func(s replica.Stats) uint64 { return s.Unauthenticated }},
		{"kvroute_sync_peers_refused_total", "Batches from new replica IDs ignored because sync.max_peers peers were live.",
			func(s replica.Stats) uint64 { return s.Refused }},
		{"kvroute_sync_pinned_blocks_evicted_total", "Blocks of peers' requests in flight unpinned early (oldest first, from the peer pinning the most) to keep a backend's prefix index within its capacity.",
			func(s replica.Stats) uint64 { return s.Evicted }},
		{"kvroute_sync_load_clamped_total", "Peers' load changes that would have taken a peer's load on a backend beyond what its engine can hold, clamped.",
			func(s replica.Stats) uint64 { return s.Clamped }},
	} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help}, stat(m.f)))
	}
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("sync metrics: %w", err)
		}
	}
	return nil
}
