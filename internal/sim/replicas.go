package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/replica"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Router replicas (Config.Replicas > 1): each replica is a scheduler of
// its own, with its own fleet accounting, prefix index and policy, in
// front of the same engines, as N kvroute serve replicas are. Each arrival
// enters a replica drawn at random (from Config.Seed); its first token and
// end are reported to the replica that routed it. With sync on, what each
// replica's scheduler accounts goes through a replica.Outbox, as live, and
// is handed to every other replica's replica.Peers.Apply, the code a live
// replica runs on what it receives over NATS, Config.SyncDelay later in
// virtual time. Every replica reads every engine's state (each one scrapes
// the engines' metrics).

// replicaSet is the run's router replicas; replica 0 is sim.sched.
type replicaSet struct {
	scheds []*scheduler.Scheduler
	// backends[r][i] is replica r's backend for node i.
	backends [][]*fleet.Backend
	outboxes []*replica.Outbox
	peers    []*replica.Peers
	seqs     []uint64
	rng      *rand.Rand
	delay    time.Duration
	// pending are batches on their way, in order of delivery time (the
	// delay is constant).
	pending []inTransit
	scratch []replica.Event
}

type inTransit struct {
	at    time.Duration
	from  int
	batch replica.Batch
}

// newReplicas builds replicas 1..n-1 beside s's scheduler (replica 0).
func (s *sim) newReplicas(f0 *fleet.Fleet) error {
	n := s.cfg.Replicas
	rs := &replicaSet{rng: rand.New(rand.NewPCG(uint64(s.cfg.Seed), 0x5e91ca5)), delay: s.cfg.SyncDelay}
	for r := range n {
		f, sched := f0, s.sched
		if r > 0 {
			p, err := policy.New(s.cfg.Policy, policy.Options{Seed: s.cfg.Seed + int64(r)})
			if err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			f = fleet.New()
			for i := range s.nodes {
				f.Add(s.nodes[i].b.Name, nil, nil)
			}
			sched = scheduler.New(f, p, s.cfg.Scheduler)
			for i := range s.nodes {
				sched.SetKVCapacity(i, int64(s.nodes[i].eng.Preset().KVBlocks)*engine.BlockSize)
			}
		}
		rs.scheds = append(rs.scheds, sched)
		rs.backends = append(rs.backends, f.Snapshot().All)
		if !s.cfg.NoSync {
			o := replica.NewOutbox(1 << 16)
			sched.SetEvents(o)
			rs.outboxes = append(rs.outboxes, o)
			// Nobody goes silent in a simulation: no timeout applies.
			rs.peers = append(rs.peers, replica.NewPeers(replicaName(r), f, sched, time.Duration(1<<62)))
			rs.seqs = append(rs.seqs, 0)
		}
	}
	s.rep = rs
	return nil
}

func replicaName(r int) string { return "replica-" + strconv.Itoa(r) }

// route picks the replica an arrival enters.
func (rs *replicaSet) route() *scheduler.Scheduler {
	return rs.scheds[rs.rng.IntN(len(rs.scheds))]
}

// collect sends what every replica queued, as one batch each, to arrive
// delay after now.
func (rs *replicaSet) collect(now time.Duration) {
	for r, o := range rs.outboxes {
		rs.scratch = o.Drain(rs.scratch[:0], 1<<16)
		if len(rs.scratch) == 0 {
			continue
		}
		rs.seqs[r]++
		rs.pending = append(rs.pending, inTransit{at: now + rs.delay, from: r, batch: replica.Batch{
			Kind: replica.Events, Replica: replicaName(r), Incarnation: 1, Seq: rs.seqs[r],
			SentAt: Epoch.Add(now).UnixNano(), BlockChars: rs.scheds[r].BlockChars(),
			Events: append([]replica.Event(nil), rs.scratch...),
		}})
	}
}

// deliverUntil applies the batches due by at to every replica but their
// sender.
func (rs *replicaSet) deliverUntil(at time.Duration) {
	k := 0
	for ; k < len(rs.pending) && rs.pending[k].at <= at; k++ {
		t := &rs.pending[k]
		for r, p := range rs.peers {
			if r != t.from {
				p.Apply(&t.batch, Epoch.Add(t.at))
			}
		}
	}
	if k > 0 {
		clear(rs.pending[:k])
		rs.pending = rs.pending[k:]
	}
}
