package main

import (
	"flag"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
)

// syncBuffer is a strings.Builder that progress goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logProgress stubs progressOut with lines every every into the returned
// buffer, as on a CI log.
func logProgress(t *testing.T, every time.Duration) *syncBuffer {
	t.Helper()
	var buf syncBuffer
	old := progressOut
	progressOut = func() *bench.Progress { return &bench.Progress{W: &buf, Every: every} }
	t.Cleanup(func() { progressOut = old })
	return &buf
}

// TestDemoShortRun runs the demo on a short span: with its output not on a
// terminal it writes progress lines (no bar), and its report opens with the
// verdict and a kvroute compare command that reproduces the run: parsed
// with compare's flags, it gives the same run.
func TestDemoShortRun(t *testing.T) {
	progress := logProgress(t, 50*time.Millisecond)
	var out strings.Builder
	o := demoOptions{timeScale: 10, seed: 3, out: t.TempDir(), span: 4 * time.Second}
	if err := demoMain(t.Context(), &out, o); err != nil {
		t.Fatal(err)
	}
	p := progress.String()
	if strings.Contains(p, "\r") {
		t.Errorf("progress off a terminal redraws a bar:\n%q", p)
	}
	for _, pol := range strings.Split(demoPolicies, ",") {
		n := 0
		for _, l := range strings.Split(p, "\n") {
			if strings.HasPrefix(l, pol+": ") && strings.Contains(l, " done, ") {
				n++
			}
		}
		if n < 2 {
			t.Errorf("%d progress lines for %s, want one per tick and a last one:\n%s", n, pol, p)
		}
	}

	lines := strings.Split(out.String(), "\n")
	if len(lines) < 4 || !strings.HasPrefix(lines[0], "kvroute demo: ") || lines[1] != "" {
		t.Fatalf("demo output does not open with its header and a blank line:\n%s", out.String())
	}
	if !strings.HasPrefix(lines[2], "Verdict: ") || !strings.HasSuffix(lines[2], ".") {
		t.Errorf("the report opens with %q, want a verdict sentence", lines[2])
	}
	i := 3
	if strings.HasPrefix(lines[i], "warning: the emulated engines fell behind") {
		i++ // the clock warning, when there was one, comes right after it
	} else if strings.Contains(out.String(), "warning: the emulated engines fell behind") {
		t.Errorf("the clock warning is not in the report's opening:\n%s", out.String())
	}
	cmd, ok := strings.CutPrefix(lines[i], "reproduce: ")
	if !ok {
		t.Fatalf("line %d is %q, want the command that reproduces the run", i, lines[i])
	}
	args, ok := strings.CutPrefix(cmd, "kvroute compare ")
	if !ok {
		t.Fatalf("reproduce line %q does not give a kvroute compare command", cmd)
	}
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var w fleetFlags
	ts := compareFlags(fs, &w)
	if err := fs.Parse(strings.Fields(args)); err != nil || fs.NArg() > 0 {
		t.Fatalf("kvroute compare does not accept %q: %v", args, err)
	}
	if w.engines != demoEngines || w.preset != demoPreset || w.workload != demoWorkload || w.policies != demoPolicies ||
		w.load != demoLoad || w.duration != o.span || w.kvBlocks != demoKVBlocks || w.seed != o.seed || *ts != o.timeScale {
		t.Errorf("%q is not the run: %+v, time scale %g", cmd, w, *ts)
	}
	if got := w.compareCommand(*ts); got != cmd {
		t.Errorf("the command does not round-trip: %q, then %q", cmd, got)
	}
}

// TestDemoFlags: demo accepts --time-scale, which its clock warning
// recommends, and refuses a stray argument.
func TestDemoFlags(t *testing.T) {
	if code := run([]string{"demo", "--time-scale", "0"}); code != 1 {
		t.Errorf("demo --time-scale 0: exit %d, want 1 (accepted, then refused as not positive)", code)
	}
	if code := run([]string{"demo", "extra"}); code != 2 {
		t.Errorf("demo extra: exit %d, want 2", code)
	}
}

// TestSimProgress: kvroute sim reports progress on its progress writer.
func TestSimProgress(t *testing.T) {
	progress := logProgress(t, time.Millisecond)
	w := fleetFlags{engines: "2", preset: "h100-llama3-8b", workload: "chat", policies: "round-robin,kvroute,least-request",
		rate: 40, duration: 60 * time.Second, seed: 1}
	var out strings.Builder
	if err := simMain(&out, &w, &kvFlags{}, &lateFlags{}, "", 1); err != nil {
		t.Fatal(err)
	}
	if p := progress.String(); !strings.Contains(p, "sim: ") || !strings.Contains(p, "requests routed over 3 runs") {
		t.Errorf("sim wrote no progress line:\n%q", p)
	}
}
