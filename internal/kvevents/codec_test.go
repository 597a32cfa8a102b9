package kvevents

import (
	"bytes"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// wire encodes v with the msgpack library's generic encoder: the test
// payloads are built independently of Encode. Map keys come out in sorted
// order, so "type" is not first: Decode must not care.
func wire(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.SetSortMapKeys(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sample is a batch with every field set, as the engine emulator publishes.
func sample() Batch {
	return Batch{TS: 1712345678.25, DPRank: 0, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{11, math.MaxUint64}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: BlockStored, BlockHashes: []uint64{12}, Parent: math.MaxUint64, HasParent: true, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "GPU", LoraName: "adapter"},
		{Kind: BlockRemoved, BlockHashes: []uint64{11}, Medium: "GPU"},
		{Kind: AllBlocksCleared},
	}}
}

func TestDecode(t *testing.T) {
	h32 := bytes.Repeat([]byte{0xab}, 32)
	stored := map[string]any{
		"type": "BlockStored", "block_hashes": []any{uint64(math.MaxUint64), int64(-2)},
		"parent_block_hash": nil, "token_ids": []any{1, 2, 3, 4}, "block_size": 2,
		"lora_id": nil, "medium": "GPU", "lora_name": nil,
	}
	wantStored := Event{Kind: BlockStored, BlockHashes: []uint64{math.MaxUint64, math.MaxUint64 - 1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"}
	tests := []struct {
		name string
		v    any
		want Batch
	}{
		{"current events in a positional batch", []any{1.5, []any{stored, map[string]any{"type": "AllBlocksCleared"}}, 3},
			Batch{TS: 1.5, DPRank: 3, Events: []Event{wantStored, {Kind: AllBlocksCleared}}}},
		{"map batch", map[string]any{"ts": 2, "events": []any{stored}, "data_parallel_rank": nil},
			Batch{TS: 2, DPRank: -1, Events: []Event{wantStored}}},
		{"batch without rank", []any{1.5, []any{}}, Batch{TS: 1.5, DPRank: -1}},
		{"legacy vLLM event", []any{1.5, []any{[]any{"BlockStored", []any{7}, 6, []any{9, 8}, 16, nil, "CPU", "lora-a"}}, 0},
			Batch{TS: 1.5, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{7}, Parent: 6, HasParent: true, TokenIDs: []uint32{9, 8}, BlockSize: 16, Medium: "CPU", LoraName: "lora-a"}}}},
		{"legacy SGLang events", []any{1.5, []any{[]any{"BlockStored", []any{-7}, nil, []any{1}, 1, nil}, []any{"BlockRemoved", []any{-7}}}},
			Batch{TS: 1.5, DPRank: -1, Events: []Event{
				{Kind: BlockStored, BlockHashes: []uint64{uint64(math.MaxUint64 - 6)}, TokenIDs: []uint32{1}, BlockSize: 1},
				{Kind: BlockRemoved, BlockHashes: []uint64{uint64(math.MaxUint64 - 6)}}}}},
		{"bytes hashes", []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{h32}, "medium": "GPU"}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{xxhash.Sum64(h32)}, Medium: "GPU"}}}},
		{"unknown fields, types and trailing elements", []any{1.0, []any{
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "medium": "GPU", "group_idx": 0, "ownership": map[string]any{"a": []any{1}}},
			map[string]any{"type": "BlockTransferred", "block_hashes": []any{1}},
			[]any{"BlockRemoved", []any{2}, nil, 0, "future"},
			[]any{"AllBlocksCleared", "future"},
		}, 0, "trailing"},
			Batch{TS: 1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"}, {Kind: BlockRemoved, BlockHashes: []uint64{2}}, {Kind: AllBlocksCleared}}}},
		{"repeated events key", map[string]any{"ts": 1.0, "events": []any{[]any{"BlockRemoved", []any{1, 2}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{1, 2}}}}},
		{"extra keys", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2}, "parent_block_hash": nil,
			"token_ids": []any{1, 2}, "block_size": 1, "lora_id": nil, "medium": nil, "lora_name": nil,
			"extra_keys": []any{[]any{"salt"}, nil}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2}, BlockSize: 1,
				ExtraKeys: [][]byte{{0x91, 0xa4, 's', 'a', 'l', 't'}, nil}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(wire(t, tt.v))
			if err != nil {
				t.Fatal(err)
			}
			if !equalBatch(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "EOF"},
		{"not a batch", wire(t, 7), "where a batch belongs"},
		{"short batch", wire(t, []any{1.0}), "want [ts, events"},
		{"map batch without events", wire(t, map[string]any{"ts": 1.0}), "without events"},
		{"ts a string", wire(t, []any{"x", []any{}}), "ts"},
		{"event not a container", wire(t, []any{1.0, []any{5}}), "where an event belongs"},
		{"event map without type", wire(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}), "without \"type\""},
		{"short BlockStored", wire(t, []any{1.0, []any{[]any{"BlockStored", []any{1}}}}), "at least 5"},
		{"nil hash", wire(t, []any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}}), "nil hash"},
		{"hash a float", wire(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}), "block hash"},
		{"negative token", wire(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}), "out of range"},
		{"huge token", wire(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}, 1}}}), "out of range"},
		{"truncated", wire(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}})[:12], "exceeds"},
		{"trailing bytes", append(wire(t, []any{1.0, []any{}}), 0), "after the batch"},
		{"huge declared events", []byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90}, "exceeds"},
		{"huge declared hashes", []byte{0x92, 0x01, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0xdd, 0x7f, 0xff, 0xff, 0xff}, "exceeds"},
		{"huge declared string", []byte{0x92, 0x01, 0x91, 0x91, 0xdb, 0x7f, 0xff, 0xff, 0xff, 'x'}, "exceeds"},
		{"huge declared ext", []byte{0x92, 0x01, 0x91, 0x81, 0xa1, 'x', 0xc9, 0xc8, 0xc8, 0xc8, 0xc8, 0x01}, "exceeds"},
		{"deeply nested unknown field", append([]byte{0x92, 0x01, 0x91, 0x81, 0xa1, 'x'}, bytes.Repeat([]byte{0x91}, 100000)...), "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.payload)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Decode(% x...) = %v, want an error with %q", tt.payload[:min(len(tt.payload), 16)], err, tt.want)
			}
		})
	}
}

func TestEncodeShapes(t *testing.T) {
	b := sample()
	for _, tt := range []struct {
		enc  Encoding
		want any
	}{
		{Current, []any{b.TS, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(11), uint64(math.MaxUint64)}, "parent_block_hash": nil,
				"token_ids": []any{uint64(1), uint64(2), uint64(3), uint64(4)}, "block_size": int64(2), "lora_id": nil, "medium": "GPU", "lora_name": nil},
			map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(12)}, "parent_block_hash": uint64(math.MaxUint64),
				"token_ids": []any{uint64(5), uint64(6)}, "block_size": int64(2), "lora_id": nil, "medium": "GPU", "lora_name": "adapter"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(11)}, "medium": "GPU"},
			map[string]any{"type": "AllBlocksCleared"},
		}, int64(0)}},
		{Legacy, []any{b.TS, []any{
			[]any{"BlockStored", []any{uint64(11), uint64(math.MaxUint64)}, nil, []any{uint64(1), uint64(2), uint64(3), uint64(4)}, int64(2), nil, "GPU", nil},
			[]any{"BlockStored", []any{uint64(12)}, uint64(math.MaxUint64), []any{uint64(5), uint64(6)}, int64(2), nil, "GPU", "adapter"},
			[]any{"BlockRemoved", []any{uint64(11)}, "GPU"},
			[]any{"AllBlocksCleared"},
		}, int64(0)}},
	} {
		t.Run(tt.enc.String(), func(t *testing.T) {
			var got any
			d := msgpack.NewDecoder(bytes.NewReader(Encode(nil, b, tt.enc)))
			d.UseLooseInterfaceDecoding(true)
			if err := d.Decode(&got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(got), normalize(tt.want)) {
				t.Errorf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
	// No rank, no third element (vLLM omits a None rank).
	b.DPRank = -1
	var got []any
	if err := msgpack.Unmarshal(Encode(nil, b, Current), &got); err != nil || len(got) != 2 {
		t.Errorf("batch without rank: %v elements, %v", len(got), err)
	}
}

// normalize makes a generically decoded msgpack value comparable: ints of
// every width become int64 or uint64 as loose decoding gives them, maps
// become map[string]any.
func normalize(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalize(x)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = normalize(x)
		}
		return out
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v)
		}
		return v
	}
	return v
}

func TestRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{Current, Legacy} {
		b := sample()
		b.Events[0].ExtraKeys = [][]byte{nil, {0x91, 0x01}}
		got, err := Decode(Encode(nil, b, enc))
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		if !equalBatch(got, b) {
			t.Errorf("%v: got %+v\nwant %+v", enc, got, b)
		}
	}
}

func TestDecodedSlicesAreCapped(t *testing.T) {
	b, err := Decode(Encode(nil, sample(), Current))
	if err != nil {
		t.Fatal(err)
	}
	first := b.Events[0].BlockHashes
	_ = append(first, 99)
	if b.Events[1].BlockHashes[0] != 12 {
		t.Errorf("appending to one event's hashes overwrote the next event's")
	}
}

func TestParseEncoding(t *testing.T) {
	for _, s := range []string{"current", "legacy"} {
		e, err := ParseEncoding(s)
		if err != nil || e.String() != s {
			t.Errorf("ParseEncoding(%q) = %v, %v", s, e, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Errorf("ParseEncoding(json) accepted")
	}
}

// equalBatch compares batches treating nil and empty slices alike and NaN
// timestamps by their bits.
func equalBatch(a, b Batch) bool {
	if math.Float64bits(a.TS) != math.Float64bits(b.TS) && a.TS != b.TS || a.DPRank != b.DPRank || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if x.Kind != y.Kind || x.Parent != y.Parent || x.HasParent != y.HasParent || x.BlockSize != y.BlockSize ||
			x.LoraName != y.LoraName || x.Medium != y.Medium ||
			!equalSlice(x.BlockHashes, y.BlockHashes) || !equalSlice(x.TokenIDs, y.TokenIDs) ||
			(x.ExtraKeys == nil) != (y.ExtraKeys == nil) || len(x.ExtraKeys) != len(y.ExtraKeys) {
			return false
		}
		for j := range x.ExtraKeys {
			if (x.ExtraKeys[j] == nil) != (y.ExtraKeys[j] == nil) || !bytes.Equal(x.ExtraKeys[j], y.ExtraKeys[j]) {
				return false
			}
		}
	}
	return true
}

func equalSlice[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoding{Current, Legacy} {
		f.Add(Encode(nil, sample(), enc))
	}
	f.Add(wire(f, map[string]any{"ts": 1, "events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("0123456789abcdef0123456789abcdef")}}}}))
	f.Add(wire(f, []any{1.5, []any{[]any{"BlockStored", []any{-7}, nil, []any{1}, 1, nil}}, nil, "x"}))
	f.Add(wire(f, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": []any{1}, "extra_keys": []any{[]any{"s", 1}}}}}))
	f.Add([]byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add(wire(f, []any{1.0, []any{map[string]any{"type": "AllBlocksCleared", "when": time.Unix(1, 2)}}}))
	// A map batch whose "events" key comes twice: the second list counts.
	f.Add([]byte("\x82\xa6events\x91\x92\xacBlockRemoved\x91\x01\xa6events\x91\x92\xacBlockRemoved\x91\x02"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		for _, ev := range b.Events {
			for _, x := range ev.ExtraKeys {
				_ = CacheSalt(x, ev.LoraName) // never panics on any keys
			}
		}
		for _, enc := range []Encoding{Current, Legacy} {
			again, err := Decode(Encode(nil, b, enc))
			if err != nil {
				t.Fatalf("%v: decoding our own encoding: %v", enc, err)
			}
			if !equalBatch(b, again) {
				t.Fatalf("%v: round trip changed the batch:\n%+v\n%+v", enc, b, again)
			}
		}
	})
}

// realistic is what one engine step of a busy vLLM publishes: 32
// BlockStored events of one 16-token block each, chained.
func realistic() Batch {
	b := Batch{TS: 1712345678.125, DPRank: 0}
	for i := range 32 {
		ev := Event{Kind: BlockStored, BlockHashes: []uint64{uint64(i+1) * 0x9e3779b97f4a7c15}, BlockSize: 16, Medium: "GPU"}
		if i > 0 {
			ev.Parent, ev.HasParent = uint64(i)*0x9e3779b97f4a7c15, true
		}
		for j := range 16 {
			ev.TokenIDs = append(ev.TokenIDs, uint32(1000+i*16+j)*37%128000)
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// BenchmarkDecode decodes one realistic batch (32 BlockStored of 16
// tokens) per op.
func BenchmarkDecode(b *testing.B) {
	for _, enc := range []Encoding{Current, Legacy} {
		b.Run(enc.String(), func(b *testing.B) {
			payload := Encode(nil, realistic(), enc)
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncode encodes the same batch into a reused buffer.
func BenchmarkEncode(b *testing.B) {
	batch := realistic()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = Encode(buf[:0], batch, Current)
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		json string
		want PublisherConfig
		on   bool
		err  string
	}{
		{`{"enable_kv_cache_events":true}`, PublisherConfig{Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000}, true, ""},
		{`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","replay_endpoint":"tcp://*:6001","topic":"kv@p@m","buffer_steps":5,"hwm":7,"max_queue_size":9}`,
			PublisherConfig{Endpoint: "tcp://*:6000", ReplayEndpoint: "tcp://*:6001", Topic: "kv@p@m", BufferSteps: 5, HWM: 7}, true, ""},
		{`{"enable_kv_cache_events":false,"publisher":"zmq"}`, PublisherConfig{Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000}, false, ""},
		{`{"enable_kv_cache_events":true,"publisher":"null"}`, PublisherConfig{Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000}, false, ""},
		{`{}`, PublisherConfig{Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000}, false, ""},
		{`{"enable_kv_cache_events":true,"publisher":"kafka"}`, PublisherConfig{}, false, "unknown publisher"},
		{`{"enable_kv_cache_events":true,"colour":"red"}`, PublisherConfig{}, false, "unknown field"},
		{`{"enable_kv_cache_events":true,"hwm":0}`, PublisherConfig{}, false, "hwm must be positive"},
		{`{"enable_kv_cache_events":true,"endpoint":"localhost:5557"}`, PublisherConfig{}, false, "want tcp://host:port"},
		{`{"enable_kv_cache_events":true} {}`, PublisherConfig{}, false, "after the JSON"},
		{`[1]`, PublisherConfig{}, false, "cannot unmarshal"},
	}
	for _, tt := range tests {
		got, on, err := ParseConfig([]byte(tt.json))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseConfig(%s) error %v, want %q", tt.json, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want || on != tt.on {
			t.Errorf("ParseConfig(%s) = %+v, %v, %v; want %+v, %v", tt.json, got, on, err, tt.want, tt.on)
		}
	}
}

func TestDecodeRepeatedEventsKey(t *testing.T) {
	// {"events": [["BlockRemoved", [1, 2, 3]]], "events": [["BlockRemoved", [9]]]}
	p := []byte("\x82\xa6events\x91\x92\xacBlockRemoved\x93\x01\x02\x03\xa6events\x91\x92\xacBlockRemoved\x91\x09")
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || !slices.Equal(b.Events[0].BlockHashes, []uint64{9}) {
		t.Errorf("got %+v, want the second list", b.Events)
	}
}

// TestDecodeSkipsExt: ext values (msgpack's timestamps among them) in
// unknown fields are skipped, whatever their size class.
func TestDecodeSkipsExt(t *testing.T) {
	for _, ext := range [][]byte{
		{0xd4, 1, 0}, {0xd5, 1, 0, 0}, {0xd6, 1, 0, 0, 0, 0}, {0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		append([]byte{0xd8, 1}, make([]byte, 16)...),
		{0xc7, 2, 1, 0, 0}, {0xc8, 0, 2, 1, 0, 0}, {0xc9, 0, 0, 0, 2, 1, 0, 0},
	} {
		// [1.0, [{"x": ext, "type": "AllBlocksCleared"}]]
		p := append([]byte{0x92, 0x01, 0x91, 0x82, 0xa1, 'x'}, ext...)
		p = append(p, append([]byte{0xa4, 't', 'y', 'p', 'e', 0xb0}, "AllBlocksCleared"...)...)
		b, err := Decode(p)
		if err != nil || len(b.Events) != 1 || b.Events[0].Kind != AllBlocksCleared {
			t.Errorf("ext % x: %+v, %v", ext, b, err)
		}
	}
}

// TestDecodeGarbageAllocatesLittle: payloads that declare huge values
// allocate a small multiple of their own size, however often they come
// (the msgpack decoder's Skip would read a declared 3 GB ext into a buffer
// it keeps and grows by a megabyte a time).
func TestDecodeGarbageAllocatesLittle(t *testing.T) {
	payloads := [][]byte{
		{0x92, 0x01, 0x91, 0x81, 0xa1, 'x', 0xc9, 0xc8, 0xc8, 0xc8, 0xc8, 0x01},
		{0x92, 0x01, 0x91, 0x81, 0xa1, 'x', 0xdb, 0xc8, 0xc8, 0xc8, 0xc8, 0x01},
		{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90},
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		for _, p := range payloads {
			if _, err := Decode(p); err == nil {
				t.Fatalf("Decode(% x) accepted", p)
			}
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("300 tiny garbage payloads allocated %d bytes", n)
	}
}

// CacheSalt finds vLLM's cache_salt among a first block's extra keys:
// alone, after the LoRA name, between multimodal tuples and before an
// embedding digest; none in keys without one or in garbage.
func TestCacheSalt(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tt := range []struct {
		keys []byte
		lora string
		want string
	}{
		{enc([]any{"tenant-a"}), "", "tenant-a"},
		{enc([]any{"sql", "tenant-a"}), "sql", "tenant-a"},
		{enc([]any{"sql"}), "sql", ""},
		{enc([]any{"sql", []any{"img-1", 8}, "tenant-b", []byte{1, 2}}), "sql", "tenant-b"},
		{enc([]any{[]any{"img-1", 0}}), "", ""},
		{nil, "", ""},
		{[]byte{0x91}, "", ""},           // an array missing its element
		{[]byte{0xa3, 'a', 'b'}, "", ""}, // not an array, and short
	} {
		if got := CacheSalt(tt.keys, tt.lora); got != tt.want {
			t.Errorf("CacheSalt(%x, %q) = %q, want %q", tt.keys, tt.lora, got, tt.want)
		}
	}
}
