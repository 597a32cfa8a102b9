package kvevents_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// pyLine is one line of testdata/subscriber.py: a message from the SUB
// socket (seq, batch) or from a replay (replayed, batch), or the replay's
// end.
type pyLine struct {
	Seq       *uint64         `json:"seq"`
	Replayed  *uint64         `json:"replayed"`
	ReplayEnd bool            `json:"replay_end"`
	Batch     json.RawMessage `json:"batch"`
}

// pyEvent is an event as python's msgpack decodes it, in either shape.
type pyEvent struct {
	shape       string // "map" or "array"
	kind        string
	blockHashes []uint64
	tokenIDs    []uint32
	blockSize   int
	medium      string
}

func parseEvents(t *testing.T, raw json.RawMessage) []pyEvent {
	t.Helper()
	var batch []json.RawMessage // [ts, events, rank]
	if err := json.Unmarshal(raw, &batch); err != nil || len(batch) < 2 {
		t.Fatalf("batch %s: want [ts, events, rank]: %v", raw, err)
	}
	var evs []json.RawMessage
	if err := json.Unmarshal(batch[1], &evs); err != nil {
		t.Fatal(err)
	}
	var out []pyEvent
	for _, e := range evs {
		var ev pyEvent
		if bytes.HasPrefix(e, []byte("{")) {
			var m struct {
				Type        string   `json:"type"`
				BlockHashes []uint64 `json:"block_hashes"`
				TokenIDs    []uint32 `json:"token_ids"`
				BlockSize   int      `json:"block_size"`
				Medium      string   `json:"medium"`
			}
			if err := json.Unmarshal(e, &m); err != nil {
				t.Fatalf("event %s: %v", e, err)
			}
			ev = pyEvent{"map", m.Type, m.BlockHashes, m.TokenIDs, m.BlockSize, m.Medium}
		} else {
			var a []json.RawMessage
			if err := json.Unmarshal(e, &a); err != nil || len(a) < 1 {
				t.Fatalf("event %s: %v", e, err)
			}
			ev.shape = "array"
			_ = json.Unmarshal(a[0], &ev.kind)
			switch ev.kind {
			case "BlockStored": // [tag, hashes, parent, token_ids, block_size, lora_id, medium, lora_name]
				_ = json.Unmarshal(a[1], &ev.blockHashes)
				_ = json.Unmarshal(a[3], &ev.tokenIDs)
				_ = json.Unmarshal(a[4], &ev.blockSize)
				_ = json.Unmarshal(a[6], &ev.medium)
			case "BlockRemoved": // [tag, hashes, medium]
				_ = json.Unmarshal(a[1], &ev.blockHashes)
				_ = json.Unmarshal(a[2], &ev.medium)
			}
		}
		out = append(out, ev)
	}
	return out
}

func postJSON(t *testing.T, url string, body any) []byte {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, out.String())
	}
	return out.Bytes()
}

// TestInteropEmulatorToPython: kvroute engine's stream, in both encodings,
// read by testdata/subscriber.py (libzmq SUB and DEALER, python msgpack):
// what it decodes is what the engine stored, and the replay socket serves
// the same batches again.
func TestInteropEmulatorToPython(t *testing.T) {
	for _, enc := range []kvevents.Encoding{kvevents.Current, kvevents.Legacy} {
		t.Run(enc.String(), func(t *testing.T) {
			p, _ := engine.LookupPreset("h100-llama3-8b")
			run, err := emulator.Start(t.Context(), emulator.Config{Preset: p, TimeScale: 50, KVEvents: &kvevents.PublisherConfig{
				Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv@e0@" + p.Model, Encoding: enc}}, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = run.Close() })
			srv := run.Server
			py := kvevents.StartPython(t, "subscriber.py", "tcp://"+srv.KVEventsAddr().String(), "tcp://"+srv.KVEventsReplayAddr().String(), "kv@e0")

			// Until python's subscription has reached the publisher, what
			// is published is lost: probe with resets (AllBlocksCleared).
			var first string
			for deadline := time.Now().Add(10 * time.Second); first == ""; {
				if time.Now().After(deadline) {
					t.Fatal("python never received an event")
				}
				postJSON(t, run.URL+"/reset_prefix_cache", map[string]any{})
				first, _ = py.TryLine(20 * time.Millisecond)
			}
			content := strings.Repeat("the same long document ", 40)
			chat := map[string]any{"model": srv.Model(), "messages": []map[string]any{{"role": "user", "content": content}}}
			var tr struct {
				Tokens []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(postJSON(t, run.URL+"/tokenize", chat), &tr); err != nil {
				t.Fatal(err)
			}
			chat["max_tokens"] = 2
			postJSON(t, run.URL+"/v1/chat/completions", chat)
			full := len(tr.Tokens) / engine.BlockSize

			var seqs []uint64
			sub := map[uint64]string{}
			var hashes []uint64
			var ids []uint32
			for l := first; ; l = py.Line(t) {
				var pl pyLine
				if err := json.Unmarshal([]byte(l), &pl); err != nil || pl.Seq == nil {
					t.Fatalf("python line %q: %v", l, err)
				}
				seqs = append(seqs, *pl.Seq)
				sub[*pl.Seq] = string(pl.Batch)
				for _, ev := range parseEvents(t, pl.Batch) {
					wantShape := map[kvevents.Encoding]string{kvevents.Current: "map", kvevents.Legacy: "array"}[enc]
					if ev.shape != wantShape {
						t.Fatalf("a %s event in the %v encoding", ev.shape, enc)
					}
					if ev.kind == "BlockStored" {
						if ev.blockSize != engine.BlockSize || ev.medium != "GPU" {
							t.Errorf("BlockStored block size %d medium %q", ev.blockSize, ev.medium)
						}
						hashes = append(hashes, ev.blockHashes...)
						ids = append(ids, ev.tokenIDs...)
					}
				}
				if len(hashes) >= full {
					break
				}
			}
			text := prefix.Hash(nil, renderedPrompt(t, tr.Tokens), engine.BlockSize*engine.BytesPerToken)
			if !slices.Equal(hashes, text) {
				t.Errorf("python read hashes %v, the engine's are %v", hashes, text)
			}
			if !slices.Equal(ids, tr.Tokens[:full*engine.BlockSize]) {
				t.Errorf("python read token ids that are not a prefix of /tokenize's")
			}

			// Python asks our ROUTER for everything from the first batch
			// it saw: the same payloads come back, in order, then the end.
			py.Send(t, "replay "+jsonNumber(seqs[0]))
			want := seqs[0]
			for {
				var pl pyLine
				l := py.Line(t)
				if err := json.Unmarshal([]byte(l), &pl); err != nil {
					t.Fatalf("python line %q: %v", l, err)
				}
				if pl.ReplayEnd {
					break
				}
				if pl.Replayed == nil {
					continue // a live message arriving meanwhile
				}
				if *pl.Replayed != want {
					t.Fatalf("replayed %d, want %d", *pl.Replayed, want)
				}
				if b, ok := sub[want]; ok && b != string(pl.Batch) {
					t.Errorf("replayed batch %d differs from the published one", want)
				}
				want++
			}
			if want <= seqs[len(seqs)-1] {
				t.Errorf("replay ended at %d, before the last published batch %d", want, seqs[len(seqs)-1])
			}
		})
	}
}

// renderedPrompt turns /tokenize's ids back into the prompt text (each id
// is 4 little-endian bytes; the last may be zero-padded).
func renderedPrompt(t *testing.T, ids []uint32) string {
	t.Helper()
	b := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	return string(bytes.TrimRight(b, "\x00"))
}

func jsonNumber(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
