package kvevents

import (
	"bufio"
	"io"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The interoperability tests run a peer built on libzmq and msgpack, not
// on this package: Debian's python3-zmq and python3-msgpack, under
// /usr/bin/python3 (.ci/run installs them).

const python = "/usr/bin/python3"

// PyPeer is a python script of testdata/ running as a peer; its stdout is
// read line by line. It is exported for the emulator's interop test in
// package kvevents_test.
type PyPeer struct {
	stdin io.WriteCloser
	lines chan string
}

// StartPython runs testdata/script with args, or skips the test when
// /usr/bin/python3 lacks zmq or msgpack. The peer is killed when the test
// ends.
func StartPython(t *testing.T, script string, args ...string) *PyPeer {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Skipf("no libzmq peer: %s cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): %v %s", python, err, out)
	}
	cmd := exec.Command(python, append([]string{"testdata/" + script}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &PyPeer{stdin: stdin, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if s := stderr.String(); s != "" {
			t.Logf("%s stderr:\n%s", script, s)
		}
	})
	return p
}

// Line returns the peer's next line, failing the test after 10 s.
func (p *PyPeer) Line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("the python peer exited")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no line from the python peer in 10 s")
	}
	return ""
}

// TryLine returns the peer's next line if one comes within d.
func (p *PyPeer) TryLine(d time.Duration) (string, bool) {
	select {
	case l, ok := <-p.lines:
		return l, ok
	case <-time.After(d):
		return "", false
	}
}

// Send writes a line to the peer's stdin.
func (p *PyPeer) Send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// TestInteropPythonPublisher: testdata/publisher.py publishes both event
// encodings, a map-shaped batch, int and bytes hashes and garbage, and
// keeps one batch off the PUB socket; Subscribe decodes each exactly,
// replays the missing one from python's ROUTER and skips the garbage.
func TestInteropPythonPublisher(t *testing.T) {
	py := StartPython(t, "publisher.py", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv@pod@model")
	f := strings.Fields(py.Line(t))
	if len(f) != 3 || f[0] != "ready" {
		t.Fatalf("publisher said %q", f)
	}
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: f[1], ReplayEndpoint: f[2], Topic: "kv@pod"}, r)
	if l := py.Line(t); l != "published" {
		t.Fatalf("publisher said %q", l)
	}
	r.wait(t, "batch 6", func() bool { return len(r.seqs) > 0 && r.seqs[len(r.seqs)-1] == 6 })

	h := make([]byte, 32)
	for i := range h {
		h[i] = byte(i)
	}
	hb := xxhash.Sum64(h)
	ids := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(i)
		}
		return out
	}
	minus5 := uint64(math.MaxUint64 - 4)
	want := map[uint64]Batch{
		0: {TS: 1.5, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{math.MaxUint64, minus5}, TokenIDs: ids(32), BlockSize: 16, Medium: "GPU",
			ExtraKeys: [][]byte{{0x91, 0xa4, 's', 'a', 'l', 't'}, nil}}}},
		1: {TS: 2.5, Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{hb}, Parent: 7, HasParent: true, TokenIDs: ids(16), BlockSize: 16, Medium: "GPU", LoraName: "adapter"},
			{Kind: BlockRemoved, BlockHashes: []uint64{hb}, Medium: "GPU"}}},
		2: {TS: 3.5, DPRank: -1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{minus5}, Medium: "GPU"}}},
		3: {TS: 4.5, DPRank: -1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{9}}}},
		4: {TS: 5.5, DPRank: -1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{1, 2}, BlockSize: 2}, {Kind: AllBlocksCleared}}},
		6: {TS: 6.5},
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.seqs; len(got) != 6 || got[0] != 0 || got[3] != 3 || got[4] != 4 || got[5] != 6 {
		t.Fatalf("delivered %v, want 0 1 2 3 4 6", got)
	}
	for i, seq := range r.seqs {
		if !equalBatch(r.batches[i], want[seq]) {
			t.Errorf("batch %d:\n got  %+v\n want %+v", seq, r.batches[i], want[seq])
		}
	}
	if r.counts[Gaps] != 1 || r.counts[Replays] != 1 || r.counts[DecodeErrors] != 1 || len(r.resets) != 0 {
		t.Errorf("counts %v resets %v, want one gap replayed and one decode error", r.counts, r.resets)
	}
	if l := py.Line(t); l != "replayed from 3" {
		t.Errorf("publisher said %q", l)
	}
}
