package fleet

import (
	"net/url"
	"slices"
	"time"
)

// Slots. A backend's ID is its slot in the fleet, and everything kept per
// ID elsewhere (the prefix index, package members' records and metric
// series, a policy's per-backend windows) is kept per slot. Pods come and
// go all day, so slots are reused rather than issued afresh:
//
//   - A removed backend keeps its slot for the rejoin grace (SetGrace,
//     DefaultGrace) from its Remove. A backend of the same Name added
//     within it takes the slot back, and with it the prefix index and
//     the learned prefill rates: a pod missing from one DNS answer, or a
//     Kubernetes pod restarted under its name, is the same backend.
//   - Once the grace has passed and the backend is retired (its last
//     request ended), Release hands the slot back to the caller, who
//     forgets what it kept for the ID, and the slot is free: the next
//     newcomer takes the lowest free slot (its own old one first, if
//     free), and free slots at the end are dropped. Snapshot.IDs, the size
//     of every slice indexed by ID, so stays at the fleet's largest size
//     plus the backends in their grace, however long the fleet churns.
//
// A request that read a snapshot before its backend was removed may start
// on it after its retirement, and so, after the grace, touch per-ID state
// of the slot's next backend (pin its prompt's blocks there until it
// ends). The grace makes that rare, and its effect is one request's blocks
// held for its life.

// DefaultGrace is the rejoin grace unless SetGrace says otherwise: three
// DNS intervals (config.DefaultDNSInterval), so that a backend missing from
// one or two DNS answers keeps its index and rate, while one gone for
// longer (an engine restarted with an empty cache, after minutes of
// loading weights) starts afresh.
const DefaultGrace = 30 * time.Second

// MinGrace is the shortest rejoin grace: a request that read the fleet's
// snapshot just before its backend was removed may start on it, and look
// its record up (package members), microseconds later; a slot released
// (its record deleted) within that time would leave the request without
// one.
const MinGrace = time.Second

// SetGrace sets the rejoin grace, at least MinGrace.
func (f *Fleet) SetGrace(d time.Duration) {
	f.mu.Lock()
	f.grace = max(d, MinGrace)
	f.mu.Unlock()
}

// rejoin returns the backend named name back in its slot when one was
// removed less than the grace ago, nil otherwise. The caller holds f.mu
// and publishes.
func (f *Fleet) rejoin(name string, u *url.URL, models []string, now time.Time) *Backend {
	for _, i := range f.named[name] {
		old := f.slots[i]
		if !old.removing.Load() || now.Sub(old.removedAt) >= f.grace {
			continue
		}
		if !old.retired.Load() && sameURL(old.URL, u) && slices.Equal(old.Models, models) {
			// Still finishing requests where it was: it simply stays.
			old.removing.Store(false)
			if old.draining.Swap(false) {
				old.drainEnded()
			}
			return old
		}
		if !old.retired.Load() {
			// Elsewhere now, while its old self drains: a slot of its
			// own, as two Backends cannot share one.
			return nil
		}
		b := &Backend{ID: i, Name: name, Arc: old.Arc, URL: u, Models: slices.Clone(models), fleet: f, added: now}
		b.healthy.Store(true)
		b.engineRate.Store(old.engineRate.Load())
		b.cost.Store(old.cost.Load())
		f.slots[i] = b
		return b
	}
	return nil
}

// sameURL reports whether a and b are the same URL (both nil in the
// simulator).
func sameURL(a, b *url.URL) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.String() == b.String()
}

// slotFor returns a free slot for a newcomer named name, growing the
// table when none is free: the slot name last held, else the lowest. The
// caller holds f.mu and fills the slot.
func (f *Fleet) slotFor(name string) int {
	if i, ok := f.freedAt[name]; ok {
		f.take(i)
		return i
	}
	for ; f.below < len(f.slots); f.below++ {
		if f.slots[f.below] == nil {
			f.take(f.below)
			return f.below
		}
	}
	f.slots = append(f.slots, nil)
	f.freed = append(f.freed, "")
	return len(f.slots) - 1
}

// take marks free slot i as given.
func (f *Fleet) take(i int) {
	if n := f.freed[i]; n != "" && f.freedAt[n] == i {
		delete(f.freedAt, n)
	}
	f.freed[i] = ""
}

// Release frees the slots of the retired backends whose grace has passed
// by now and returns them: the caller forgets what it keeps for their IDs
// (a later backend may be given them) before it adds a backend. Free slots
// at the end of the table are dropped, so that Snapshot.IDs shrinks.
func (f *Fleet) Release(now time.Time) []*Backend {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Backend
	for i, b := range f.slots {
		if b == nil || !b.retired.Load() || now.Sub(b.removedAt) < f.grace {
			continue
		}
		f.slots[i], f.freed[i] = nil, b.Name
		f.unname(b.Name, i)
		if j, ok := f.freedAt[b.Name]; !ok || i < j {
			f.freedAt[b.Name] = i
		}
		f.below = min(f.below, i)
		out = append(out, b)
	}
	if out == nil {
		return nil
	}
	n := len(f.slots)
	for n > 0 && f.slots[n-1] == nil {
		n--
		f.take(n)
	}
	clear(f.slots[n:])
	clear(f.freed[n:])
	f.slots, f.freed = f.slots[:n], f.freed[:n]
	f.publish()
	return out
}

// unname takes slot i off name's slots (named).
func (f *Fleet) unname(name string, i int) {
	ids := slices.DeleteFunc(f.named[name], func(j int) bool { return j == i })
	if len(ids) == 0 {
		delete(f.named, name)
		return
	}
	f.named[name] = ids
}

// Slots returns how many slots are in use: members, and removed backends
// in their grace.
func (f *Fleet) Slots() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, b := range f.slots {
		if b != nil {
			n++
		}
	}
	return n
}

// Grace returns the rejoin grace.
func (f *Fleet) Grace() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.grace
}
