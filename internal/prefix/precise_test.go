package prefix

import (
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/kvevents"
)

var pt0 = time.Unix(5000, 0)

// toks returns n token ids starting at base: distinct bases give distinct
// blocks.
func toks(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// stored is a BlockStored of tokens in blocks of 4, engine hashes h...,
// chained to parent when parent != 0.
func stored(tokens []uint32, parent uint64, hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, Parent: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: 4}
}

func removed(hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes}
}

var cleared = kvevents.Event{Kind: kvevents.AllBlocksCleared}

func TestHashTokens(t *testing.T) {
	a := HashTokens(nil, toks(0, 10), 4, "")
	if len(a) != 2 {
		t.Fatalf("%d keys for 10 tokens in blocks of 4, want 2", len(a))
	}
	b := HashTokens(nil, append(toks(0, 4), toks(100, 4)...), 4, "")
	if a[0] != b[0] || a[1] == b[1] {
		t.Errorf("keys %x and %x: want the first equal and the second different", a, b)
	}
	if c := HashTokens(nil, toks(0, 8), 4, "adapter"); c[0] == a[0] {
		t.Error("a salted chain has the unsalted chain's key")
	}
	// An event's chain continued from its parent's key is the request's.
	whole := HashTokens(nil, toks(0, 12), 4, "")
	tail := chainTokens(nil, whole[0], toks(4, 8), 4)
	if !slices.Equal(whole[1:], tail) {
		t.Errorf("chain from the parent %x, want %x", tail, whole[1:])
	}
}

func TestPreciseEvents(t *testing.T) {
	// Requests' token chains: p shares its first two blocks with q.
	p := toks(0, 16)                         // 4 blocks
	q := append(toks(0, 8), toks(900, 8)...) // 4 blocks, 2 shared with p
	type step struct {
		backend int
		events  []kvevents.Event
	}
	tests := []struct {
		name   string
		steps  []step
		prompt []uint32
		want   []int32
		stats  PreciseStats // of backend 0 (Blocks, Orphans, Mismatched, UnknownRemoved checked)
	}{
		{
			name:   "stored in two messages, chained by parent",
			steps:  []step{{0, []kvevents.Event{stored(p[:8], 0, 11, 12)}}, {0, []kvevents.Event{stored(p[8:16], 12, 13, 14)}}},
			prompt: p, want: []int32{4, 0},
			stats: PreciseStats{Blocks: 4},
		},
		{
			name:   "prefix shared, tail differs",
			steps:  []step{{0, []kvevents.Event{stored(q, 0, 1, 2, 3, 4)}}, {1, []kvevents.Event{stored(p[:4], 0, 7)}}},
			prompt: p, want: []int32{2, 1},
			stats: PreciseStats{Blocks: 4},
		},
		{
			name:   "removed block cuts the chain",
			steps:  []step{{0, []kvevents.Event{stored(p, 0, 11, 12, 13, 14), removed(13)}}},
			prompt: p, want: []int32{2, 0},
			stats: PreciseStats{Blocks: 3},
		},
		{
			name:   "removed unknown hash is counted",
			steps:  []step{{0, []kvevents.Event{stored(p[:4], 0, 11), removed(99)}}},
			prompt: p, want: []int32{1, 0},
			stats: PreciseStats{Blocks: 1, UnknownRemoved: 1},
		},
		{
			name:   "orphan: parent never seen",
			steps:  []step{{0, []kvevents.Event{stored(p[4:8], 55, 12)}}},
			prompt: p, want: []int32{0, 0},
			stats: PreciseStats{Orphans: 1},
		},
		{
			name:   "other block size skipped",
			steps:  []step{{0, []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1}, TokenIDs: p[:8], BlockSize: 8}}}},
			prompt: p, want: []int32{0, 0},
			stats: PreciseStats{Mismatched: 1},
		},
		{
			name:   "all blocks cleared",
			steps:  []step{{0, []kvevents.Event{stored(p, 0, 11, 12, 13, 14)}}, {1, []kvevents.Event{stored(p, 0, 11, 12)}}, {0, []kvevents.Event{cleared}}},
			prompt: p, want: []int32{0, 2}, // backend 1 reported two hashes for four blocks of tokens
			stats: PreciseStats{},
		},
		{
			name: "stored in two media, removed from one",
			steps: []step{{0, []kvevents.Event{
				stored(p[:8], 0, 11, 12),
				{Kind: kvevents.BlockStored, BlockHashes: []uint64{12}, Parent: 11, HasParent: true, TokenIDs: p[4:8], BlockSize: 4, Medium: "CPU"},
				removed(12),
			}}},
			prompt: p, want: []int32{2, 0},
			stats: PreciseStats{Blocks: 2},
		},
		{
			name:   "engine hash reused for other tokens",
			steps:  []step{{0, []kvevents.Event{stored(p[:8], 0, 11, 12), stored(toks(500, 4), 0, 12)}}},
			prompt: p, want: []int32{1, 0},
			stats: PreciseStats{Blocks: 2},
		},
		{
			name:   "lora blocks are not the base model's",
			steps:  []step{{0, []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1}, TokenIDs: p[:4], BlockSize: 4, LoraName: "sql"}}}},
			prompt: p, want: []int32{0, 0},
			stats: PreciseStats{Blocks: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewPrecise(PreciseConfig{BlockTokens: 4})
			x.Reset(0, true, pt0)
			x.Reset(1, true, pt0)
			for _, s := range tt.steps {
				x.Apply(s.backend, s.events, pt0)
			}
			keys := HashTokens(nil, tt.prompt, 4, "")
			out := []int32{-1, -1}
			trusted := make([]bool, 2)
			x.Match(keys, pt0, out, trusted)
			if !slices.Equal(out, tt.want) {
				t.Errorf("match %v, want %v", out, tt.want)
			}
			st := x.Stats(0, pt0)
			got := PreciseStats{Blocks: st.Blocks, Orphans: st.Orphans, Mismatched: st.Mismatched, UnknownRemoved: st.UnknownRemoved}
			if got != tt.stats {
				t.Errorf("stats %+v, want %+v", got, tt.stats)
			}
		})
	}
}

func TestPreciseLoraMatch(t *testing.T) {
	x := NewPrecise(PreciseConfig{BlockTokens: 4})
	x.Reset(0, true, pt0)
	x.Apply(0, []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: toks(0, 8), BlockSize: 4, LoraName: "sql"}}, pt0)
	out, trusted := make([]int32, 1), make([]bool, 1)
	if x.Salt("sql") != "sql" || x.Salt("base") != "" {
		t.Errorf("Salt: %q for an adapter the events named, %q for another model", x.Salt("sql"), x.Salt("base"))
	}
	x.Match(HashTokens(nil, toks(0, 8), 4, x.Salt("sql")), pt0, out, trusted)
	if out[0] != 2 {
		t.Errorf("salted match %d, want 2", out[0])
	}
}

func TestPreciseTrust(t *testing.T) {
	cfg := PreciseConfig{BlockTokens: 4, StaleAfter: 10 * time.Second, Retrust: 30 * time.Second, SpeculativeTTL: 2 * time.Second}
	ev := []kvevents.Event{stored(toks(0, 4), 0, 1)}
	s := func(d time.Duration) time.Time { return pt0.Add(d) }
	tests := []struct {
		name string
		run  func(x *Precise)
		at   time.Duration
		want bool
	}{
		{"never heard from", func(x *Precise) {}, 0, false},
		{"reset empty, no event yet", func(x *Precise) { x.Reset(0, true, pt0) }, 0, false},
		{"reset empty, then an event", func(x *Precise) { x.Reset(0, true, pt0); x.Apply(0, ev, pt0) }, 0, true},
		{"joined mid-stream: not before retrust", func(x *Precise) { x.Apply(0, ev, pt0) }, 29 * time.Second, false},
		{"joined mid-stream: after retrust", func(x *Precise) { x.Apply(0, ev, pt0) }, 30 * time.Second, true},
		{"gap: dropped until retrust", func(x *Precise) {
			x.Reset(0, true, pt0)
			x.Apply(0, ev, pt0)
			x.Reset(0, false, s(time.Second))
			x.Apply(0, ev, s(2*time.Second))
		}, 20 * time.Second, false},
		{"routed, no events: stale", func(x *Precise) {
			x.Reset(0, true, pt0)
			x.Apply(0, ev, pt0)
			x.Speculate(0, []uint64{1}, s(time.Second))
		}, 12 * time.Second, false},
		{"routed, events within the timeout", func(x *Precise) {
			x.Reset(0, true, pt0)
			x.Apply(0, ev, pt0)
			x.Speculate(0, []uint64{1}, s(time.Second))
			x.Apply(0, nil, s(5*time.Second))
		}, 12 * time.Second, true},
		{"idle without events stays trusted", func(x *Precise) { x.Reset(0, true, pt0); x.Apply(0, ev, pt0) }, time.Hour, true},
		{"silent until the next event", func(x *Precise) { x.Reset(0, true, pt0); x.Apply(0, ev, pt0); x.Silent(0) }, 0, false},
		{"silent, then an event", func(x *Precise) { x.Reset(0, true, pt0); x.Apply(0, ev, pt0); x.Silent(0); x.Apply(0, nil, pt0) }, 0, true},
		{"forgotten", func(x *Precise) { x.Reset(0, true, pt0); x.Apply(0, ev, pt0); x.Forget(0) }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewPrecise(cfg)
			tt.run(x)
			if got := x.Stats(0, s(tt.at)).Trusted; got != tt.want {
				t.Errorf("trusted %v, want %v", got, tt.want)
			}
			out, trusted := []int32{9}, []bool{!tt.want}
			x.Match(HashTokens(nil, toks(0, 4), 4, ""), s(tt.at), out, trusted)
			if trusted[0] != tt.want || (!tt.want && out[0] != 0) {
				t.Errorf("Match says trusted %v with %d blocks, want trusted %v", trusted[0], out[0], tt.want)
			}
		})
	}
}

func TestPreciseSpeculative(t *testing.T) {
	x := NewPrecise(PreciseConfig{BlockTokens: 4, SpeculativeTTL: 2 * time.Second})
	x.Reset(0, true, pt0)
	x.Reset(1, true, pt0)
	x.Apply(0, nil, pt0)
	x.Apply(1, nil, pt0)
	a := HashTokens(nil, toks(0, 40), 4, "")                           // 10 blocks
	b := HashTokens(nil, append(toks(0, 24), toks(700, 16)...), 4, "") // 6 shared with a
	x.Speculate(0, a, pt0)
	out, trusted := make([]int32, 2), make([]bool, 2)
	for _, tt := range []struct {
		keys []uint64
		at   time.Duration
		want []int32
	}{
		{a, 0, []int32{10, 0}},
		{b, time.Second, []int32{6, 0}},
		{a[:3], time.Second, []int32{3, 0}},
		{a, 2 * time.Second, []int32{0, 0}}, // expired
	} {
		x.Match(tt.keys, pt0.Add(tt.at), out, trusted)
		if !slices.Equal(out, tt.want) {
			t.Errorf("at %v: match %v, want %v", tt.at, out, tt.want)
		}
	}
	// A confirmed prefix and a longer speculative one: the longer counts.
	x.Apply(1, []kvevents.Event{stored(toks(0, 8), 0, 1, 2)}, pt0)
	x.Speculate(1, b, pt0)
	x.Match(a, pt0, out, trusted)
	if out[1] != 6 {
		t.Errorf("confirmed 2, speculative 6: match %d, want 6", out[1])
	}
}

func TestPreciseBounded(t *testing.T) {
	x := NewPrecise(PreciseConfig{BlockTokens: 4, MaxBlocks: 8})
	x.Reset(0, true, pt0)
	var parent uint64
	for i := range 20 {
		h := uint64(i + 1)
		x.Apply(0, []kvevents.Event{stored(toks(uint32(4*i), 4), parent, h)}, pt0)
		parent = h
	}
	st := x.Stats(0, pt0)
	if st.Blocks != 8 || st.Evicted != 12 {
		t.Errorf("blocks %d evicted %d, want 8 and 12", st.Blocks, st.Evicted)
	}
	// Removing an evicted block is harmless; the engine map stays bounded.
	x.Apply(0, []kvevents.Event{removed(1, 2, 3)}, pt0)
	if n := len(x.streams[0].eng); n > 2*8 {
		t.Errorf("%d engine hashes kept for 8 blocks", n)
	}
}

func TestCommonPrefix(t *testing.T) {
	a := []uint64{1, 2, 3, 4, 5}
	for _, tt := range []struct {
		b    []uint64
		from int
		want int
	}{
		{[]uint64{1, 2, 3, 4, 5}, 0, 5},
		{[]uint64{1, 2, 3, 9, 9}, 0, 3},
		{[]uint64{1, 2}, 0, 2},
		{[]uint64{7}, 0, 0},
		{nil, 0, 0},
		{[]uint64{1, 2, 9}, 4, 4},
		{[]uint64{1, 2, 3, 4, 5, 6}, 1, 5},
	} {
		if got := commonPrefix(a, tt.b, tt.from); got != tt.want {
			t.Errorf("commonPrefix(%v, %v, %d) = %d, want %d", a, tt.b, tt.from, got, tt.want)
		}
	}
}

func TestPreciseMatchAllocs(t *testing.T) {
	x := NewPrecise(PreciseConfig{BlockTokens: 4})
	for b := range 8 {
		x.Reset(b, true, pt0)
		x.Apply(b, []kvevents.Event{stored(toks(0, 64), 0, hs(0, 16)...)}, pt0)
		x.Speculate(b, HashTokens(nil, toks(0, 80), 4, ""), pt0)
	}
	keys := HashTokens(nil, toks(0, 80), 4, "")
	out, trusted := make([]int32, 8), make([]bool, 8)
	if n := testing.AllocsPerRun(100, func() { x.Match(keys, pt0, out, trusted) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
	if out[3] != 20 {
		t.Errorf("match %d, want 20 (speculative)", out[3])
	}
}

func TestPreciseSpeculativeRecordsCollapse(t *testing.T) {
	x := NewPrecise(PreciseConfig{BlockTokens: 4})
	a := HashTokens(nil, toks(0, 40), 4, "")
	b := HashTokens(nil, toks(1000, 40), 4, "")
	for _, tt := range []struct {
		keys []uint64
		want int
	}{
		{a[:3], 1},
		{a, 1}, // covers a[:3]
		{a, 1},
		{b, 2},
		{a[:5], 3}, // covered by a, but a record of its own
	} {
		x.Speculate(0, tt.keys, pt0)
		if n := len(x.streams[0].spec); n != tt.want {
			t.Errorf("after %d keys: %d records, want %d", len(tt.keys), n, tt.want)
		}
	}
	for range 2 * maxSpeculative {
		x.Speculate(0, HashTokens(nil, toks(uint32(len(x.streams[0].spec))*100+5000, 8), 4, ""), pt0)
	}
	if n := len(x.streams[0].spec); n > maxSpeculative {
		t.Errorf("%d records, bound %d", n, maxSpeculative)
	}
}

// A request's cache_salt salts its chain as vLLM salts its first block:
// the blocks an engine stored under a salt (its extra_keys name it) match
// requests under that salt only, and blocks chained after them carry it.
func TestPreciseCacheSalt(t *testing.T) {
	keys, err := msgpack.Marshal([]any{"tenant-a"})
	if err != nil {
		t.Fatal(err)
	}
	x := NewPrecise(PreciseConfig{BlockTokens: 4})
	x.Reset(0, true, pt0)
	first := stored(toks(0, 8), 0, 1, 2)
	first.ExtraKeys = [][]byte{keys, nil}
	x.Apply(0, []kvevents.Event{first, stored(toks(8, 4), 2, 3)}, pt0)
	out, trusted := make([]int32, 1), make([]bool, 1)
	for _, tt := range []struct {
		salt string
		want int32
	}{{"tenant-a", 3}, {"", 0}, {"tenant-b", 0}} {
		x.Match(HashTokens(nil, toks(0, 12), 4, JoinSalt("", tt.salt)), pt0, out, trusted)
		if out[0] != tt.want {
			t.Errorf("cache salt %q: %d blocks matched, want %d", tt.salt, out[0], tt.want)
		}
	}
}

// The approximate hash under a salt shares no block with another salt's,
// nor with the unsalted one, and an empty salt is the plain hash.
func TestHashSalted(t *testing.T) {
	text := string(make([]byte, 256))
	plain := Hash(nil, text, 64)
	if !slices.Equal(HashSalted(nil, text, 64, ""), plain) {
		t.Fatal("an empty salt changed the hashes")
	}
	a, b := HashSalted(nil, text, 64, "a"), HashSalted(nil, text, 64, "b")
	for i := range plain {
		if a[i] == plain[i] || a[i] == b[i] {
			t.Fatalf("block %d shared across salts", i)
		}
	}
}
