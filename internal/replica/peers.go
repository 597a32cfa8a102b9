package replica

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// DefaultPeerTimeout is how long a peer may stay silent before its load is
// forgotten: five heartbeats at the default interval (DefaultHeartbeat).
const (
	DefaultHeartbeat   = time.Second
	DefaultPeerTimeout = 5 * time.Second
)

// Peers is what this replica knows of the others: for each live peer, the
// load it holds on each backend (the sum of its events since its last
// heartbeat, on top of that heartbeat's report), which the fleet adds to
// every backend's Load. A peer silent for longer than the timeout is
// forgotten: its load is subtracted at once. Safe for concurrent use (the
// receiver applies, a ticker expires, metrics read).
type Peers struct {
	self       string
	blockChars int
	timeout    time.Duration
	fleet      *fleet.Fleet
	sched      *scheduler.Scheduler

	mu    sync.Mutex
	peers map[string]*peer
	// maxPeers caps len(peers) (limits.go).
	maxPeers int
	// names resolves backend names, rebuilt when the fleet's snapshot
	// changes.
	names     map[string]*fleet.Backend
	namesSnap *fleet.Snapshot
	stats     Stats
	// lag is the moving average of the peers' batches' delay, lagN how
	// many of the first batches it has seen (observeLag).
	lag  time.Duration
	lagN int
	// catch is the catch-up after a reconnection (see CatchUp).
	catch catchUp
}

// catchUp is what a replica waits for after it was cut off from its
// peers: a heartbeat (their load) and a snapshot (their decisions) from
// every peer it knew when the connection dropped.
type catchUp struct {
	// want are the peers live at the cut, each with what has arrived of it
	// since the reconnection (wantHeartbeat | wantSnapshot when all has).
	want map[string]uint8
	// gen numbers the catch-ups, so that the end of an old one's bound
	// does not end a newer one.
	gen uint64
	// epoch is the reconnection the last catch-up began after (CatchUp).
	epoch uint64
	// done is closed while no catch-up is under way.
	done chan struct{}
	// quiet is want == nil, for Quiet to read without p.mu: no cut
	// awaits its catch-up and none is under way.
	quiet atomic.Bool
}

const (
	wantHeartbeat uint8 = 1 << iota
	wantSnapshot
)

// peer is one live peer replica.
type peer struct {
	incarnation uint64
	seq         uint64
	heard       time.Time
	load        map[*fleet.Backend]fleet.Load
	// pins are its requests in flight whose blocks are pinned here, by
	// its request number; held the same per backend, oldest first, and
	// serial numbers them (limits.go).
	pins   map[uint64]pin
	held   map[*fleet.Backend]*held
	serial uint64
}

// pin is a peer's request in flight: its blocks pinned in the prefix index.
type pin struct {
	b      *fleet.Backend
	hashes []uint64
	nodes  []int32
	at     time.Time
	serial uint64
}

// MaxPin is how long a peer's request may keep its blocks pinned: its end
// may have been lost on the way (a full queue, a dropped connection).
const MaxPin = 10 * time.Minute

// Stats count what Peers applied.
type Stats struct {
	// Batches and Events received from peers (own messages excluded).
	Batches, Events uint64
	// Streamed counts the events of Events and Heartbeat batches, and
	// Snapshots the Snapshot batches.
	Streamed, Snapshots uint64
	// Unknown counts events naming a backend this replica does not have.
	Unknown uint64
	// Gaps counts batches whose sequence number skipped some: lost on the
	// way (the sender's queue was full, or the connection dropped).
	Gaps uint64
	// Mismatched counts batches whose block size differs from this
	// replica's: their hashes are ignored, their load is not.
	Mismatched uint64
	// Expired counts peers forgotten for their silence.
	Expired uint64
	// Malformed counts messages Decode refused (counted by the receiver).
	Malformed uint64
	// Unauthenticated counts messages without a valid tag, or too old to
	// be anything but a replay, when peers must authenticate (counted by
	// the receiver).
	Unauthenticated uint64
	// Refused counts batches from new replica IDs beyond the cap on live
	// peers (SetMaxPeers), ignored.
	Refused uint64
	// Evicted counts the blocks of peers' pins released early so that the
	// pinned blocks stay within a backend's capacity (limits.go).
	Evicted uint64
	// Clamped counts peers' load changes that would have taken a peer's
	// load on a backend beyond ClaimBound.
	Clamped uint64
	// CatchUpsCut counts catch-ups after a reconnection that their bound
	// ended before every peer had sent its load and decisions.
	CatchUpsCut uint64
}

// NewPeers returns the peer state of replica self, applying to f and s;
// peers are forgotten after timeout of silence (DefaultPeerTimeout if <= 0).
// It tells s the replica's ID, which its session claims carry.
func NewPeers(self string, f *fleet.Fleet, s *scheduler.Scheduler, timeout time.Duration) *Peers {
	if timeout <= 0 {
		timeout = DefaultPeerTimeout
	}
	s.SetReplicaID(self)
	done := make(chan struct{})
	close(done)
	p := &Peers{self: self, blockChars: s.BlockChars(), timeout: timeout, fleet: f, sched: s, peers: map[string]*peer{},
		catch: catchUp{done: done}}
	p.catch.quiet.Store(true)
	return p
}

// Cut records that this replica has lost its connection to its peers:
// the peers live now are the ones it will wait for when it reconnects
// (CatchUp). Routing goes on meanwhile, on this replica's own state.
func (p *Peers) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.catch.want != nil {
		return // cut again before the last catch-up ended: keep waiting for those
	}
	p.catch.want = make(map[string]uint8, len(p.peers))
	p.catch.quiet.Store(false)
	for id := range p.peers {
		p.catch.want[id] = 0
	}
}

// CatchUp starts the catch-up after reconnection epoch (the connection
// numbers its reconnections): until every peer live at the Cut has sent a
// heartbeat and a snapshot since, CaughtUp's channel stays open (requests
// wait for it, so that this replica does not route new conversations on
// a picture without its peers' load and sessions). A second call for the
// same epoch does nothing and returns false: the first to see the
// connection back (the reconnection's handler, or a request, see
// Pending) starts it. The caller bounds a catch-up it started with
// EndCatchUp(gen). Without a Cut before, or with no peer to wait for, it
// ends at once.
func (p *Peers) CatchUp(epoch uint64) (gen uint64, started bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if epoch != 0 && epoch == p.catch.epoch {
		return 0, false
	}
	p.catch.epoch = epoch
	p.catch.gen++
	if len(p.catch.want) == 0 {
		p.catch.want = nil
		p.catch.quiet.Store(true)
		return p.catch.gen, true
	}
	for id := range p.catch.want {
		p.catch.want[id] = 0
	}
	select {
	case <-p.catch.done:
		p.catch.done = make(chan struct{})
	default:
	}
	return p.catch.gen, true
}

// Quiet reports, without taking the lock that applying peers' batches
// holds, that no cut awaits its catch-up and none is under way
// (CaughtUp's channel is closed then): every request asks, and a
// snapshot being applied must not hold it up.
func (p *Peers) Quiet() bool { return p.catch.quiet.Load() }

// Pending reports whether a Cut awaits its catch-up: the connection
// dropped, and no CatchUp has begun since.
func (p *Peers) Pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.catch.want == nil {
		return false
	}
	select {
	case <-p.catch.done:
		return true
	default:
		return false
	}
}

// EndCatchUp ends catch-up gen if it is still under way: its bound has
// passed, and a peer not heard from by then is presumed gone.
func (p *Peers) EndCatchUp(gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen != p.catch.gen {
		return
	}
	select {
	case <-p.catch.done:
	default:
		p.stats.CatchUpsCut++
		p.endCatchUp()
	}
}

// endCatchUp ends the catch-up under way, if any. The caller holds p.mu.
func (p *Peers) endCatchUp() {
	p.catch.want = nil
	p.catch.quiet.Store(true)
	select {
	case <-p.catch.done:
	default:
		close(p.catch.done)
	}
}

// caughtUpWith notes that batch kind k arrived from peer id during a
// catch-up, and ends the catch-up when every peer waited for has sent
// both. The caller holds p.mu.
func (p *Peers) caughtUpWith(id string, k BatchKind) {
	got, ok := p.catch.want[id]
	if !ok {
		return
	}
	select {
	case <-p.catch.done:
		return // cut, not yet reconnected: what arrives now is before the catch-up
	default:
	}
	switch k {
	case Heartbeat:
		got |= wantHeartbeat
	case Snapshot:
		got |= wantSnapshot
	}
	p.catch.want[id] = got
	for _, g := range p.catch.want {
		if g != wantHeartbeat|wantSnapshot {
			return
		}
	}
	p.endCatchUp()
}

// CaughtUp returns a channel that is closed while this replica is not
// catching up with its peers after a reconnection (see CatchUp).
func (p *Peers) CaughtUp() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.catch.done
}

// Applied is what Apply found out about the sender.
type Applied struct {
	// New: the sender was not live (first heard, back after its timeout,
	// or restarted): the receiver should ask it for a snapshot.
	New bool
	// Own: the batch is this replica's own, and was ignored.
	Own bool
	// Gap: batches of the sender's stream were lost before this one
	// (its decisions in them are missing here): ask it for a snapshot.
	Gap bool
	// Refused: the sender is not live and the live peers are at the cap
	// (SetMaxPeers): the batch was ignored.
	Refused bool
}

// Apply applies a peer's batch received at now.
func (p *Peers) Apply(b *Batch, now time.Time) Applied {
	if b.Replica == p.self {
		return Applied{Own: true}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var a Applied
	pr := p.peers[b.Replica]
	if pr != nil && pr.incarnation != b.Incarnation {
		p.forget(b.Replica, pr)
		pr = nil
	}
	if pr == nil {
		if !p.admit() {
			return Applied{Refused: true}
		}
		pr = &peer{incarnation: b.Incarnation, load: map[*fleet.Backend]fleet.Load{}, pins: map[uint64]pin{}}
		p.peers[b.Replica] = pr
		a.New = true
		p.place()
	}
	pr.heard = now
	if b.Kind == Events {
		p.observeLag(now.Sub(time.Unix(0, b.SentAt)))
	}
	p.stats.Batches++
	p.stats.Events += uint64(len(b.Events))
	if b.Kind == Snapshot {
		p.stats.Snapshots++
	} else {
		p.stats.Streamed += uint64(len(b.Events))
		if pr.seq != 0 && b.Seq != pr.seq+1 {
			p.stats.Gaps++
			a.Gap = true
		}
		pr.seq = b.Seq
	}
	hashesOK := b.BlockChars == p.blockChars
	if !hashesOK {
		p.stats.Mismatched++
	}
	names := p.resolver()
	// After the batch is applied (deferred calls run before the unlock):
	// a request the end of a catch-up releases reads the peer's load.
	defer p.caughtUpWith(b.Replica, b.Kind)
	if b.Kind == Heartbeat {
		p.report(pr, b.Events, names)
		return a
	}
	for i := range b.Events {
		e := &b.Events[i]
		be := names[e.Backend]
		if be == nil {
			p.stats.Unknown++
			continue
		}
		if b.Kind == Events && (e.Kind == Routed || e.Kind == Changed) {
			p.add(pr, be, e.Load)
		}
		switch {
		case e.Kind == Routed && b.Kind == Events:
			hashes := e.Hashes
			if !hashesOK {
				hashes = nil
			}
			// Its own copy: the batch's hashes share one array, which a
			// pin must not keep alive.
			hashes = slices.Clone(hashes)
			nodes := p.sched.Pin(be, hashes, e.Claim)
			if len(hashes) > 0 {
				p.hold(pr, e.Request, pin{b: be, hashes: hashes, nodes: nodes, at: now})
			}
		case e.Kind == Changed && e.Load.InFlight < 0:
			p.release(pr, e.Request)
		case e.Kind == Stored:
			p.sched.LearnResponse(be, e.Claim.Session, e.Claim.At)
		case e.Kind == Learned && (hashesOK || e.Claim.Session != 0):
			hashes := e.Hashes
			if !hashesOK {
				hashes = nil
			}
			p.sched.Learn(be, hashes, e.Claim)
		}
	}
	return a
}

// report replaces pr's load with a heartbeat's.
func (p *Peers) report(pr *peer, events []Event, names map[string]*fleet.Backend) {
	seen := make(map[*fleet.Backend]bool, len(events))
	for i := range events {
		e := &events[i]
		be := names[e.Backend]
		if e.Kind != Report || be == nil {
			if be == nil {
				p.stats.Unknown++
			}
			continue
		}
		seen[be] = true
		p.add(pr, be, e.Load.Add(pr.load[be].Neg()))
	}
	for be, l := range pr.load {
		if !seen[be] {
			p.add(pr, be, l.Neg())
		}
	}
}

// add changes pr's load on b by d, within ClaimBound, and the fleet's sum
// with it. The caller holds p.mu.
func (p *Peers) add(pr *peer, b *fleet.Backend, d fleet.Load) {
	old := pr.load[b]
	l, clamped := clampClaim(old, d, ClaimBound(b))
	if clamped {
		p.stats.Clamped++
	}
	if l.IsZero() {
		delete(pr.load, b)
	} else {
		pr.load[b] = l
	}
	b.AddPeerLoad(l.Add(old.Neg()))
}

// forget removes pr, its load and its pins.
func (p *Peers) forget(id string, pr *peer) {
	for b, l := range pr.load {
		b.AddPeerLoad(l.Neg())
	}
	for _, pn := range pr.pins {
		p.unpin(pn)
	}
	delete(p.peers, id)
	p.place()
}

// MaxBlindWindow bounds the sync delay a replica presumes its peers'
// decisions take (scheduler.SetBlindWindow): a lag beyond it is a clock
// skew between hosts or a stalled receiver, not a delay to plan picks by.
const MaxBlindWindow = 100 * time.Millisecond

// observeLag folds one batch's lag, from its sender's clock to this
// replica's, into the blind window the scheduler presumes peers' decisions
// for: a moving average over about 8 batches. The caller holds p.mu.
func (p *Peers) observeLag(d time.Duration) {
	d = min(max(d, 0), MaxBlindWindow)
	p.lag += (d - p.lag) / 8
	if p.lagN < 8 {
		// The first batches set it outright: an average from 0 would
		// presume too little at the start.
		p.lagN++
		p.lag = max(p.lag, d)
	}
	p.sched.SetBlindWindow(p.lag)
}

// BlindWindow returns the lag this replica presumes its peers' decisions
// take (see observeLag).
func (p *Peers) BlindWindow() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lag
}

// place tells the scheduler how many replicas are live and where this one
// stands among them, in the order of their IDs, which every replica sees
// alike: they then spread their picks over the fleet instead of all
// preferring the same backend while they do not yet see each other's
// (scheduler.SetReplicas). The caller holds p.mu.
func (p *Peers) place() {
	rank := 0
	for id := range p.peers {
		if id < p.self {
			rank++
		}
	}
	p.sched.SetReplicas(rank, len(p.peers)+1)
}

func (p *Peers) unpin(pn pin) {
	if pn.b != nil {
		p.sched.Unpin(pn.b, pn.hashes, pn.nodes)
	}
}

// Expire forgets the peers not heard from since now minus the timeout,
// and returns how many are left.
func (p *Peers) Expire(now time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pr := range p.peers {
		if now.Sub(pr.heard) > p.timeout {
			p.forget(id, pr)
			p.stats.Expired++
			continue
		}
		for n, pn := range pr.pins {
			if now.Sub(pn.at) > MaxPin {
				p.release(pr, n)
			}
		}
	}
	return len(p.peers)
}

// Live returns the number of live peers.
func (p *Peers) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.peers)
}

// CountMalformed counts a message the receiver could not decode.
func (p *Peers) CountMalformed() {
	p.mu.Lock()
	p.stats.Malformed++
	p.mu.Unlock()
}

// CountUnauthenticated counts a message the receiver refused for its tag
// (see Key) or its age.
func (p *Peers) CountUnauthenticated() {
	p.mu.Lock()
	p.stats.Unauthenticated++
	p.mu.Unlock()
}

// Stats returns the counters.
func (p *Peers) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// resolver returns the backends by name for the fleet's current snapshot.
// The caller holds p.mu.
func (p *Peers) resolver() map[string]*fleet.Backend {
	snap := p.fleet.Snapshot()
	if snap != p.namesSnap {
		m := make(map[string]*fleet.Backend, len(snap.All))
		for _, b := range snap.All {
			m[b.Name] = b
		}
		p.names, p.namesSnap = m, snap
	}
	return p.names
}
