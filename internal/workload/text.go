package workload

import (
	"sync"

	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// Text generation. Every piece of prompt text is a pure function of a 64-bit
// key and a length, made of lowercase words and single spaces only, so that
// it needs no escaping in a JSON string (bytes == characters) and the same
// key always gives the same bytes. Text of key k and length n is a prefix of
// the text of key k and any length m > n.

// splitmix64 steps a SplitMix64 generator; its output function is a
// bijection, so distinct states give distinct outputs.
func splitmix64(s *uint64) uint64 {
	x := *s
	*s += prefix.Gamma
	return prefix.Mix64(x)
}

// mix combines values into one key.
func mix(vs ...uint64) uint64 {
	s := uint64(0x6a09e667f3bcc908)
	for _, v := range vs {
		s ^= v
		s = splitmix64(&s)
	}
	return s
}

// appendText appends n bytes of deterministic words for key to dst.
func appendText(dst []byte, key uint64, n int) []byte {
	s := key
	for n > 0 {
		r := splitmix64(&s)
		wl := 2 + int(r&7) // words of 2..9 letters
		r >>= 3
		for i := 0; i < wl && n > 0; i++ {
			// 5 bits scaled to 26 letters: slightly uneven, which is fine.
			dst = append(dst, 'a'+byte(((r&31)*26)>>5))
			r >>= 5
			n--
		}
		if n > 0 {
			dst = append(dst, ' ')
			n--
		}
	}
	return dst
}

// BlockTokens is the number of tokens of one trace hash id (Mooncake's block size).
const BlockTokens = 512

// blockBytes is the size of one block's text.
const blockBytes = BlockTokens * request.BytesPerToken

// idTagLen is the width of the id tag that opens each block: 14 base-26
// letters encode any uint64, so two distinct ids differ within the first 14
// bytes of their blocks and prompts that share k ids share k blocks and not
// a 16-token block more.
const idTagLen = 14

// appendBlock appends the 2048-byte text of trace block id.
func appendBlock(dst []byte, id uint64) []byte {
	v := id
	for i := 0; i < idTagLen; i++ {
		// Least significant digit first, so neighbouring ids differ at byte 0.
		dst = append(dst, 'a'+byte(v%26))
		v /= 26
	}
	dst = append(dst, ' ')
	return appendText(dst, mix(0x7472616365, id), blockBytes-idTagLen-1)
}

// blockCache keeps recently built block texts. A whole trace's blocks do not
// fit in memory comfortably (the Mooncake conversation trace has 182,790
// distinct ids, 374 MB of text), so the cache is bounded and simply dropped
// when full: hot blocks (shared system prompts, the start of long
// conversations) are rebuilt at most once per fill.
type blockCache struct {
	mu  sync.Mutex
	max int
	m   map[uint64][]byte
}

func newBlockCache(max int) *blockCache {
	return &blockCache{max: max, m: make(map[uint64][]byte)}
}

func (c *blockCache) get(id uint64) []byte {
	c.mu.Lock()
	b, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		return b
	}
	b = appendBlock(make([]byte, 0, blockBytes), id)
	c.mu.Lock()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[id] = b
	c.mu.Unlock()
	return b
}
