package compare

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/server"
)

// Kill is what happened when a replica run lost its last replica (see
// Config.KillReplicaAt). Durations are wall clock.
type Kill struct {
	// Replica is the index of the killed replica (the last), and At when
	// it was killed, after the run's start.
	Replica int
	At      time.Duration
	// InFlight is the requests it had in flight when it was killed.
	InFlight int64
	// Lost is the requests that entered it and failed; FailedOver those
	// it refused after the kill, which entered another replica.
	Lost, FailedOver int
	// Survivors summarises the requests that entered the other replicas
	// (failed-over ones included), in emulated time.
	Survivors report.Run
	// Forgotten is how long after the kill the last survivor stopped
	// counting the killed replica as a live peer, and with it its load;
	// 0 when one had not within PeerTimeout and three heartbeats.
	Forgotten time.Duration
	// PeerLoadLeft is the in-flight requests the survivors still counted
	// for their peers once every request had ended and the killed replica
	// was forgotten (or the wait was over): 0 unless a load outlived the
	// requests that made it.
	PeerLoadLeft int64
}

// killer kills the last of a run's routers at a wall-clock offset and
// watches the others forget it.
type killer struct {
	at        time.Duration
	routers   []*server.Server
	sync      config.Sync
	timer     *time.Timer
	watched   sync.WaitGroup
	inFlight  int64
	forgotten time.Duration
}

// arm starts the clock of the kill: the run starts now.
func (k *killer) arm() {
	k.watched.Add(1)
	k.timer = time.AfterFunc(k.at, func() {
		defer k.watched.Done()
		dead := k.routers[len(k.routers)-1]
		for _, b := range dead.Fleet().Snapshot().All {
			k.inFlight += b.OwnLoad().InFlight
		}
		killed := time.Now()
		dead.Kill()
		k.forgotten = k.watch(killed)
	})
}

// watch waits until every survivor counts one peer fewer than it had, or
// the peer timeout and three heartbeats have passed, and returns how long
// that took after killed (0 if it did not happen).
func (k *killer) watch(killed time.Time) time.Duration {
	survivors := k.routers[:len(k.routers)-1]
	deadline := killed.Add(k.sync.PeerTimeout + 3*k.sync.Heartbeat)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for now := range tick.C {
		gone := 0
		for _, s := range survivors {
			if s.Peers().Peers().Live() < len(survivors) {
				gone++
			}
		}
		if gone == len(survivors) {
			return now.Sub(killed)
		}
		if now.After(deadline) {
			return 0
		}
	}
	return 0
}

// result waits for the watch to end (or cancels a kill that never
// came), and sums up the run's samples (wall clock, as Drive returns
// them) for the killed replica and its survivors.
func (k *killer) result(samples []report.Sample, label string, timeScale float64) Kill {
	if k.timer.Stop() {
		k.watched.Done() // the run ended before the kill
	}
	k.watched.Wait()
	dead := len(k.routers) - 1
	res := Kill{Replica: dead, At: k.at, InFlight: k.inFlight, Forgotten: k.forgotten}
	var survived []report.Sample
	for _, s := range samples {
		switch {
		case s.Entry == dead && s.Err != "":
			res.Lost++
		case s.Entry != dead:
			s.ITL = slices.Clone(s.ITL) // toEmulated scales in place
			survived = append(survived, s)
			if s.Refused > 0 {
				res.FailedOver++
			}
		}
	}
	// The last ends reach the peers within a batching interval; a killed
	// replica's load, forgotten or not, stays.
	settle := time.Now().Add(k.sync.FlushInterval + 500*time.Millisecond)
	for {
		res.PeerLoadLeft = 0
		for _, s := range k.routers[:dead] {
			for _, b := range s.Fleet().Snapshot().All {
				res.PeerLoadLeft += b.PeerLoad().InFlight
			}
		}
		if res.PeerLoadLeft == 0 || time.Now().After(settle) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var elapsed time.Duration
	for _, s := range survived {
		elapsed = max(elapsed, s.Start+s.E2E)
	}
	res.Survivors = report.Summarize(label+" survivors", toEmulated(survived, timeScale), scale(elapsed, timeScale))
	return res
}
