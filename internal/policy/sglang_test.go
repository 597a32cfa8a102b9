package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// peerT0 is the fixed start of the peers' tests' clocks.
var peerT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// peerFleet returns n fresh backends, peer-0 ... peer-(n-1).
func peerFleet(t testing.TB, n int) []*fleet.Backend {
	t.Helper()
	f := fleet.New()
	bs := make([]*fleet.Backend, n)
	for i := range bs {
		bs[i] = f.Add(fmt.Sprintf("peer-%d", i), nil, nil)
	}
	return bs
}

// peerLoad starts n requests on b (each with the given uncached prompt
// tokens and output budget) and, if decoding, marks their first byte; the
// tickets are ended when the test ends.
func peerLoad(t testing.TB, b *fleet.Backend, n int, uncached, budget int64, decoding bool) {
	t.Helper()
	for range n {
		tk := b.Start(uncached, uncached, budget, peerT0)
		if decoding {
			tk.FirstByte(peerT0.Add(time.Second))
		}
		t.Cleanup(func() { tk.Done(peerT0) })
	}
}

// peerInput builds the input for prompt over cands, with matched blocks
// (nil means none).
func peerInput(t testing.TB, prompt string, cands []*fleet.Backend, matched []int32) *Input {
	t.Helper()
	if matched == nil {
		matched = make([]int32, len(cands))
	}
	return fxTokens(&Input{
		View:       &request.View{Kind: request.Completion, Prompt: prompt, PromptTokens: request.EstimateTokens(prompt)},
		Hashes:     prefix.Hash(nil, prompt, prefix.DefaultBlockChars),
		BlockChars: prefix.DefaultBlockChars,
		Candidates: cands,
		Matched:    matched,
		Now:        peerT0,
	})
}

// peerRoute picks and reports the pick to the policy if it observes.
func peerRoute(p Policy, in *Input) Decision {
	d := p.Pick(in)
	if o, ok := p.(Observer); ok {
		o.Routed(in, d)
	}
	return d
}

func TestSGLangBranches(t *testing.T) {
	sys := strings.Repeat("system prompt shared by everyone. ", 30) // 1,020 bytes
	tests := []struct {
		name string
		// seed routes these prompts to these candidates first (by forcing
		// the pick through a one-candidate input).
		seed     map[int]string
		load     []int // in-flight per backend
		prompt   string
		want     int
		wantNote string
	}{
		{
			name:   "imbalanced goes to the least loaded despite a full match",
			seed:   map[int]string{0: sys + "question A"},
			load:   []int{100, 30, 20},
			prompt: sys + "question A",
			want:   2, wantNote: "imbalanced",
		},
		{
			name:   "gap over 64 but under 1.5x is balanced: cache wins",
			seed:   map[int]string{0: sys + "question A"},
			load:   []int{300, 220, 230},
			prompt: sys + "question B",
			want:   0, wantNote: "cache-match",
		},
		{
			name:   "over 1.5x but gap under 64 is balanced: cache wins",
			seed:   map[int]string{1: sys},
			load:   []int{10, 60, 0},
			prompt: sys + "more",
			want:   1, wantNote: "cache-match",
		},
		{
			name:   "weak match does not pull to the holder",
			seed:   map[int]string{1: sys[:200]},
			load:   []int{0, 3, 1},
			prompt: sys[:200] + strings.Repeat("unrelated tail ", 40),
			want:   0, wantNote: "least-loaded",
		},
		{
			name:   "the longest match wins among holders",
			seed:   map[int]string{0: sys[:400], 2: sys + "question"},
			load:   []int{0, 0, 5},
			prompt: sys + "question 2",
			want:   2, wantNote: "cache-match",
		},
		{
			name:   "nothing cached: least loaded, first among equals",
			load:   []int{4, 2, 2},
			prompt: "fresh prompt",
			want:   1, wantNote: "least-loaded",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := peerFleet(t, 3)
			p := NewSGLang(SGLangConfig{})
			for id, text := range tc.seed {
				peerRoute(p, peerInput(t, text, bs[id:id+1], nil))
			}
			for i, n := range tc.load {
				peerLoad(t, bs[i], n, 10, 10, false)
			}
			d := p.Pick(peerInput(t, tc.prompt, bs, nil))
			if d.Index != tc.want || d.Note != tc.wantNote {
				t.Fatalf("pick = %d (%s), want %d (%s)", d.Index, d.Note, tc.want, tc.wantNote)
			}
		})
	}
}

func TestSGLangThresholdIsStrict(t *testing.T) {
	// 30 of 100 bytes matched is not more than 0.3: least loaded (1).
	// 31 of 100 is: the holder (0).
	for _, tc := range []struct {
		shared int
		want   int
	}{{30, 1}, {31, 0}} {
		bs := peerFleet(t, 2)
		p := NewSGLang(SGLangConfig{})
		peerRoute(p, peerInput(t, strings.Repeat("a", tc.shared)+"X", bs[:1], nil))
		peerLoad(t, bs[0], 1, 1, 1, false)
		prompt := strings.Repeat("a", tc.shared) + strings.Repeat("b", 100-tc.shared)
		if d := p.Pick(peerInput(t, prompt, bs, nil)); d.Index != tc.want {
			t.Errorf("shared %d/100: pick %d, want %d", tc.shared, d.Index, tc.want)
		}
	}
}

func TestSGLangTreeSizesAndSplit(t *testing.T) {
	bs := peerFleet(t, 2)
	p := NewSGLang(SGLangConfig{})
	peerRoute(p, peerInput(t, "hello world", bs[:1], nil))
	peerRoute(p, peerInput(t, "hello there", bs[:1], nil)) // splits "hello " off
	peerRoute(p, peerInput(t, "hello", bs[1:], nil))
	if got, want := p.TreeSize(0), len("hello world")+len("there"); got != want {
		t.Errorf("worker 0 holds %d chars, want %d", got, want)
	}
	if got, want := p.TreeSize(1), len("hello"); got != want {
		t.Errorf("worker 1 holds %d chars, want %d", got, want)
	}
	var set peerSet
	set.fill(bs)
	if n, h := p.root.match("hello thermos", &set); n != len("hello ther") || h != 0 {
		t.Errorf("match = %d by %d, want %d by 0", n, h, len("hello ther"))
	}
	set = peerSet{}
	set.fill(bs[1:])
	if n, h := p.root.match("hello thermos", &set); n != len("hello") || h != 1 {
		t.Errorf("match among {1} = %d by %d, want %d by 1", n, h, len("hello"))
	}
}

func TestSGLangEvictsLRULeavesOnInterval(t *testing.T) {
	bs := peerFleet(t, 1)
	p := NewSGLang(SGLangConfig{MaxTreeSize: 10, EvictionInterval: time.Minute})
	route := func(text string, at time.Duration) {
		in := peerInput(t, text, bs, nil)
		in.Now = peerT0.Add(at)
		peerRoute(p, in)
	}
	route("aaaa-old", 0)              // 8 chars; first call arms the timer
	route("aaaa-new", 10*time.Second) // +3: "aaaa-" splits from "old", "new" added
	route("bbbbbbbb", 20*time.Second) // +8 = 19 chars, over 10 but not yet due
	if got := p.TreeSize(0); got != 19 {
		t.Fatalf("size before eviction = %d, want 19", got)
	}
	route("bbbbbbbb", 61*time.Second) // due: evict LRU leaves until <= 10
	// Leaves by last access: "old"(0s) then "new"(10s), then "bbbbbbbb"(61s).
	// Removing "old" (3) and "new" (3) leaves "aaaa-" a leaf (10s): 5 more.
	if got := p.TreeSize(0); got != 8 {
		t.Fatalf("size after eviction = %d, want 8", got)
	}
	var set peerSet
	set.fill(bs)
	if n, _ := p.root.match("aaaa-new", &set); n != 0 {
		t.Errorf("evicted prefix still matches %d chars", n)
	}
	if n, _ := p.root.match("bbbbbbbb", &set); n != 8 {
		t.Errorf("recent prompt matches %d chars, want 8", n)
	}
}

func TestPeerSetSpillsPastStack(t *testing.T) {
	f := fleet.New()
	var cands []*fleet.Backend
	for i := range 1500 {
		b := f.Add(fmt.Sprint(i), nil, nil)
		if i%7 == 0 || i == 1499 {
			cands = append(cands, b)
		}
	}
	var s peerSet
	s.fill(cands)
	for i := range 1500 {
		if want := i%7 == 0 || i == 1499; s.has(i) != want {
			t.Fatalf("has(%d) = %v, want %v", i, s.has(i), want)
		}
	}
}

// peerBenchPrompt is a 32,000-character prompt; peerBenchInput routes
// variants of it so that the policy's state is warm, then returns the
// input of a pick over 64 candidates.
func peerBenchInput(b *testing.B, p Policy) *Input {
	b.Helper()
	bs := peerFleet(b, 64)
	base := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 712)[:32000]
	for i, be := range bs {
		peerLoad(b, be, i%5, 100, 100, i%2 == 0)
		prompt := fmt.Sprintf("%04d", i) + base[4:]
		peerRoute(p, peerInput(b, prompt, bs[i:i+1], nil))
	}
	in := peerInput(b, "0007"+base[4:], bs, nil)
	in.Matched[7] = int32(len(in.Hashes))
	return fxTokens(in)
}

func BenchmarkSGLangPick(b *testing.B) {
	p := NewSGLang(SGLangConfig{})
	in := peerBenchInput(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}

func BenchmarkSGLangRouted(b *testing.B) {
	p := NewSGLang(SGLangConfig{})
	in := peerBenchInput(b, p)
	d := Decision{Index: 7}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Routed(in, d)
	}
}

// TestPeersConcurrentUse routes from several goroutines at once through
// every peer, for the race detector: picks and observations share state.
func TestPeersConcurrentUse(t *testing.T) {
	for _, name := range []string{"sglang-cache-aware", "llmd-default", "dynamo-kv", "kubeai-chwbl", "preble-e2"} {
		t.Run(name, func(t *testing.T) {
			p, err := New(name, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			bs := peerFleet(t, 8)
			done := make(chan struct{})
			for g := range 4 {
				go func() {
					defer func() { done <- struct{}{} }()
					for i := range 200 {
						prompt := fmt.Sprintf("conversation %d turn %d ", i%7, g) + strings.Repeat("x", 100*(i%5))
						in := peerInput(t, prompt, bs, nil)
						in.Now = peerT0.Add(time.Duration(i) * time.Second)
						if d := peerRoute(p, in); d.Index < 0 || d.Index >= len(bs) {
							t.Errorf("pick %d out of range", d.Index)
							return
						}
					}
				}()
			}
			for range 4 {
				<-done
			}
		})
	}
}
