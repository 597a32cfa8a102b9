package fault

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
)

// Result is how a run took its fault. Latencies are emulated time.
type Result struct {
	Kind string
	At   time.Duration
	// Errors are the requests whose client saw an error (a status other
	// than 200, an error event, a broken stream); Requests all of them;
	// Why the first few distinct errors. Refused are the requests the
	// router refused cleanly (an admission queue's 429 or 503), which are
	// not errors, when the run said how to tell them (Injector.Refused):
	// the soak's overload, not the fault.
	Errors, Requests, Refused int
	Why                       []string
	// Moved is the streams the router moved to another engine
	// (kvroute_migrations_total, outcome moved); -1 when it could not be
	// read.
	Moved int
	// Hit is the completed streams that were streaming from a faulted
	// engine when the fault began (Restart: when the restart began);
	// Added their added latency at the median and p99 (their longest gap
	// between two tokens after that moment less their median gap: the
	// move's wait), and Bound99 the p99 of its bound, the prefill time of
	// the stream's context on an idle engine plus 100 ms; Over the
	// streams whose added latency was over their own bound.
	Hit              int
	Added50, Added99 time.Duration
	Bound99          time.Duration
	Over             int
	// Restarts are each engine's restart (drain to undrain), wall clock,
	// for Restart; Started how long an engine took to start at most;
	// RestartErr why the restart stopped before the last engine.
	Restarts   []time.Duration
	Started    time.Duration
	RestartErr string
}

// MoveSlack is what a moved stream's added latency may exceed its
// context's prefill on an idle engine by.
const MoveSlack = 100 * time.Millisecond

// SetRefused tells the injector, before the run ends, which requests the
// router refused cleanly (see Result.Refused); they are neither errors
// nor the fault's.
func (in *Injector) SetRefused(refused func(*report.Sample) bool) { in.refused = refused }

// Result waits for the fault to be over (or cancels one that never
// came) and sums up the run's samples (wall clock, as bench.Drive
// returns them; timeScale emulated seconds per wall-clock second).
func (in *Injector) Result(samples []report.Sample, timeScale float64) Result {
	if in.timer == nil { // never armed: the run did not start
		return Result{Kind: in.f.Kind, At: in.f.At, Moved: -1}
	}
	if in.timer.Stop() {
		in.done.Done() // the run ended before the fault
	}
	in.done.Wait()
	in.mu.Lock()
	defer in.mu.Unlock()
	res := in.res
	res.Moved = -1
	if n, err := in.router.Moved(); err == nil {
		res.Moved = n
	}
	return sum(res, samples, in.faulted, in.preset, timeScale, in.refused)
}

// Blame reports whether s failed because of the fault: a failure (not a
// clean refusal) of a request not over before the fault began, on an
// engine the fault hit or with no engine known. An error status counts
// by the request's arrival (it has no measured end; it comes at once); a
// stream read to its break by its measured end; any other failure (an
// error event, no answer at all) has no measured end and may have come
// after the fault began.
func (in *Injector) Blame(s *report.Sample) bool {
	if !failed(s) || in.refused != nil && in.refused(s) {
		return false
	}
	switch {
	case s.Status != 0 && s.Status != http.StatusOK:
		if s.Start < in.f.At {
			return false
		}
	case s.E2E > 0:
		if s.Start+s.E2E < in.f.At {
			return false
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.faulted) > 0 && (s.Backend == "" || in.faulted[s.Backend])
}

func failed(s *report.Sample) bool { return s.Err != "" || s.Status != http.StatusOK }

// sum adds samples to res: its errors (refused telling the clean
// refusals apart, when not nil) and the streams that were on a faulted
// engine when the fault began, with the latency the fault added to them
// against their bound on engines of preset p.
func sum(res Result, samples []report.Sample, faulted map[string]bool, p engine.Preset, timeScale float64, refused func(*report.Sample) bool) Result {
	res.Requests = len(samples)
	var added, bounds []time.Duration
	for i := range samples {
		s := &samples[i]
		if failed(s) {
			if refused != nil && refused(s) {
				res.Refused++
				continue
			}
			res.Errors++
			why := fmt.Sprintf("%d %s", s.Status, s.Err)
			if len(res.Why) < 3 && !slices.Contains(res.Why, why) {
				res.Why = append(res.Why, why)
			}
			continue
		}
		if !faulted[s.Backend] {
			continue
		}
		// The gap the fault made, in a stream that had started before
		// it (one that did not had nothing to move).
		gap, before, ok := report.AddedLatency(s.Start+s.TTFT, s.ITL, res.At)
		if !ok {
			continue
		}
		res.Hit++
		a := scale(gap, timeScale)
		// The context to compute again: the prompt and the tokens sent
		// before the gap.
		bound := p.StepOverhead + time.Duration(s.PromptTokens+before)*p.PerPrefillToken + MoveSlack
		if a > bound {
			res.Over++
		}
		added, bounds = append(added, a), append(bounds, bound)
	}
	res.Added50, res.Added99 = quantile(added, 0.5), quantile(added, 0.99)
	res.Bound99 = quantile(bounds, 0.99)
	return res
}

// quantile is q of ds (sorted in place), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

func scale(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * f)
}
