package scheduler

import (
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// tokensOf stands in for a tokenizer of four characters a token: one id per
// four bytes of s, so that token blocks and character blocks cover the same
// text, as in the engine model.
func tokensOf(s string) []uint32 {
	out := make([]uint32, len(s)/4)
	for i := range out {
		out[i] = uint32(s[4*i]) | uint32(s[4*i+1])<<8 | uint32(s[4*i+2])<<16 | uint32(s[4*i+3])<<24
	}
	return out
}

// BenchmarkRoutePrecise is BenchmarkRoute with every backend's stream
// trusted and its blocks reported by events instead of guessed: the same
// 64 backends, conversations and prompt, the match taken from the precise
// index (confirmed blocks and the speculative entries the loop's own
// routings leave). Each iteration hashes the prompt's characters, as
// BenchmarkRoute does; its token keys are hashed once, outside the loop:
// the exchange hashes them with the tokenizer's answer, before it routes
// (BenchmarkTokenKeys measures that).
func BenchmarkRoutePrecise(b *testing.B) { benchPrecise(b, 64) }

// BenchmarkRoutePreciseMixed is BenchmarkRoutePrecise with only half the
// backends' streams trusted: both indexes are matched.
func BenchmarkRoutePreciseMixed(b *testing.B) { benchPrecise(b, 32) }

// benchPrecise runs BenchmarkRoutePrecise with the first trusted backends'
// streams trusted.
func benchPrecise(b *testing.B, trusted int) {
	s, prompt := benchScheduler(b)
	p := New(s.fleet, longestPrefix{}, Config{Precise: &prefix.PreciseConfig{}})
	system := text(0, 2048)
	query := tokensOf(prompt)
	for k := range trusted {
		p.Precise().Reset(k, true, t0)
		next := uint64(k) << 40
		store := func(tokens []uint32) {
			n := len(tokens) / 16
			hashes := make([]uint64, n)
			for i := range hashes {
				next++
				hashes[i] = next
			}
			p.Precise().Apply(k, []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:16*n], BlockSize: 16}}, t0)
		}
		for c := range 20 {
			store(tokensOf(system + text(1000+k*100+c, 16000)))
		}
		store(query[:min(len(query), 16*7*k)])
	}
	// The approximate index holds what BenchmarkRoute's does.
	for k := range 64 {
		for c := range 20 {
			p.Index().Insert(k, prefix.Hash(nil, system+text(1000+k*100+c, 16000), prefix.DefaultBlockChars))
		}
		p.Index().Insert(k, prefix.Hash(nil, prompt, prefix.DefaultBlockChars)[:min(500, 7*k)])
	}
	v := view("", prompt)
	keys := p.TokenKeys(query, "")
	b.ReportAllocs()
	for b.Loop() {
		a, err := p.RoutePrecise(v, p.Hashes(v), keys, nil, t0)
		if err != nil {
			b.Fatal(err)
		}
		a.FirstByte(t0)
		a.Done(t0)
	}
}

// BenchmarkTokenKeys measures hashing the token ids of BenchmarkRoute's
// prompt (8,000 tokens, 500 blocks) into the precise index's keys.
func BenchmarkTokenKeys(b *testing.B) {
	s := New(newFleet(b, 1), longestPrefix{}, Config{Precise: &prefix.PreciseConfig{}})
	tokens := tokensOf(text(0, 2048) + text(1, 32000-2048))
	b.ReportAllocs()
	for b.Loop() {
		_ = s.TokenKeys(tokens, "")
	}
}
