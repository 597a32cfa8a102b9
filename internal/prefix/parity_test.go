package prefix

import (
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// TestCheckParity: the check matches the router's keys of a prompt with
// those of the blocks the engine reports storing for it, and names the
// cause of a mismatch: block size, tokens, or the chain's seed.
func TestCheckParity(t *testing.T) {
	tokens := make([]uint32, 70)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	other := append([]uint32(nil), tokens...)
	other[40] = 7
	stored := func(ids []uint32, size int, lora string) kvevents.Event {
		return kvevents.Event{Kind: kvevents.BlockStored, TokenIDs: ids[:len(ids)/size*size], BlockSize: size, BlockHashes: make([]uint64, len(ids)/size), LoraName: lora}
	}
	noise := kvevents.Event{Kind: kvevents.BlockStored, TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 4, BlockHashes: []uint64{9}}
	child := kvevents.Event{Kind: kvevents.BlockStored, HasParent: true, Parent: 3, TokenIDs: tokens[:16], BlockSize: 16, BlockHashes: []uint64{4}}
	tests := []struct {
		name    string
		events  []kvevents.Event
		salt    string
		decided bool
		cause   string
	}{
		{"match", []kvevents.Event{noise, stored(tokens, 16, "")}, "", true, ParityOK},
		{"engine block size", []kvevents.Event{stored(tokens, 32, "")}, "", true, ParityBlockSize},
		{"tokenizer", []kvevents.Event{stored(other, 16, "")}, "", true, ParityTokenizer},
		{"engine salts with an adapter the router does not", []kvevents.Event{stored(tokens, 16, "lora-a")}, "", true, ParitySalt},
		{"router salts, the engine does not", []kvevents.Event{stored(tokens, 16, "")}, "tenant", true, ParitySalt},
		{"not seen yet", []kvevents.Event{noise, child, {Kind: kvevents.AllBlocksCleared}}, "", false, ""},
		{"nothing", nil, "", false, ""},
	}
	for _, tt := range tests {
		p, decided := CheckParity(tokens, 16, tt.salt, tt.events)
		if decided != tt.decided || p.Cause != tt.cause || p.OK() != (tt.cause == ParityOK) {
			t.Errorf("%s: %+v decided %v; want cause %q decided %v", tt.name, p, decided, tt.cause, tt.decided)
		}
		if decided && p.Detail == "" {
			t.Errorf("%s: no detail", tt.name)
		}
	}
}
