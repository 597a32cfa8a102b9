package fleet

import (
	"net/url"
	"slices"
	"time"
)

// Membership changes. A fleet that serves while it changes needs three
// moves besides Add:
//
//   - Drain: the backend keeps its in-flight requests (streams finish) but
//     gets no new ones; Undrain takes it back.
//   - Remove: drain, and retire the backend once its last request ends.
//     A retired backend leaves the snapshot; its slot (its ID) is kept
//     for it through the rejoin grace, and given to a newcomer only after
//     Release has handed it back to the caller, who forgets the per-ID
//     state it keeps elsewhere (prefix index, records, metric series).
//     See slots.go.
//   - Warm-up: a backend added to a serving fleet starts with an empty
//     cache and an unknown prefill rate, and a load-aware policy would
//     pour every request onto its empty queue at once. Its weight ramps
//     linearly from 0 to 1 over its warm-up period, and the scheduler
//     offers it only to that fraction of requests (see WarmupWeight).
//
// Time is passed in, never read, so that the simulator can add backends in
// virtual time.

// AddWarm adds a healthy backend that ramps up over warmup starting at now,
// and returns it with its ID. A warmup of 0 is Add. A backend named like
// one removed less than the grace ago returns to its slot (slots.go): the
// same Backend, undrained, if it is still finishing requests at the same
// URL, else a new one with the learned prefill rates carried over, which
// starts without warm-up (its cache is known).
func (f *Fleet) AddWarm(name string, u *url.URL, models []string, now time.Time, warmup time.Duration) *Backend {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.rejoin(name, u, models, now); b != nil {
		f.publish()
		return b
	}
	b := &Backend{ID: f.slotFor(name), Name: name, Arc: arcOf(name), URL: u, Models: slices.Clone(models), fleet: f, added: now, warmup: max(warmup, 0)}
	b.healthy.Store(true)
	f.slots[b.ID] = b
	ids := f.named[name]
	at, _ := slices.BinarySearch(ids, b.ID)
	f.named[name] = slices.Insert(ids, at, b.ID) // in ID order, as rejoin reads them
	f.publish()
	return b
}

// WarmupWeight is the share of requests b is offered at now: 0 when it was
// just added, rising linearly to 1 at the end of its warm-up period, and 1
// for a backend without one.
func (b *Backend) WarmupWeight(now time.Time) float64 {
	if b.warmup <= 0 {
		return 1
	}
	el := now.Sub(b.added)
	if el >= b.warmup {
		return 1
	}
	if el <= 0 {
		return 0
	}
	return float64(el) / float64(b.warmup)
}

// Draining reports whether b gets no new requests (drained or being
// removed).
func (b *Backend) Draining() bool { return b.draining.Load() }

// Retired reports whether b was removed and its last request has ended.
func (b *Backend) Retired() bool { return b.retired.Load() }

// Drain stops new requests to b from now; its in-flight requests go on.
// It does nothing to a backend draining or being removed already.
func (f *Fleet) Drain(b *Backend, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b.startDrain(now) {
		f.publish()
	}
}

// Undrain lets b receive new requests again. It reports false, and does
// nothing, when b is being removed or retired: removal is final.
func (f *Fleet) Undrain(b *Backend) bool {
	f.mu.Lock()
	if b.removing.Load() {
		f.mu.Unlock()
		return false
	}
	was := b.draining.Swap(false)
	if was {
		b.drainEnded()
		f.publish()
	}
	f.mu.Unlock()
	if was && f.Undrained != nil {
		f.Undrained(b)
	}
	return true
}

// Remove drains b and retires it once its in-flight count reaches 0 (at
// once if it is idle). It reports whether b was retired right away. A
// request that read the snapshot just before the drain may still start on
// b; its Done retires b in turn. now starts b's rejoin grace.
func (f *Fleet) Remove(b *Backend, now time.Time) (retired bool) {
	f.mu.Lock()
	b.startDrain(now)
	if !b.removing.Swap(true) {
		b.removedAt = now
	}
	f.publish()
	f.mu.Unlock()
	if b.inflight.Load() == 0 {
		f.retire(b)
	}
	return b.retired.Load()
}

// retire takes a removed, idle backend out of the snapshot. Done calls it
// when a removed backend's last request ends; repeated calls do nothing.
func (f *Fleet) retire(b *Backend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b.inflight.Load() != 0 || b.retired.Load() || !b.removing.Load() {
		return // busy, retired already, or back (rejoin)
	}
	b.retired.Store(true)
	f.publish()
}

// Named returns bs with one backend per name, in bs's order: of two that
// share a name (a backend drains while its copy under the same name, at
// another address, takes its place), the one not draining. A metric
// labelled by backend name then has one series per name.
func Named(bs []*Backend) []*Backend {
	at := make(map[string]int, len(bs))
	for _, b := range bs {
		if _, dup := at[b.Name]; dup {
			return named(bs)
		}
		at[b.Name] = 0
	}
	return bs
}

func named(bs []*Backend) []*Backend {
	at := make(map[string]int, len(bs))
	out := make([]*Backend, 0, len(bs))
	for _, b := range bs {
		if j, dup := at[b.Name]; dup {
			if out[j].Draining() && !b.Draining() {
				out[j] = b
			}
			continue
		}
		at[b.Name] = len(out)
		out = append(out, b)
	}
	return out
}
