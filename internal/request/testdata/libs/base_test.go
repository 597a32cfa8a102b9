package libs

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// BenchmarkBaseline is what the machine does with the agent body at
// memory speed: a copy, utf8.Valid, counting quotes.
func BenchmarkBaseline(b *testing.B) {
	body := bodies(b)["agent200k"]
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		dst := make([]byte, len(body))
		for b.Loop() {
			copy(dst, body)
		}
	})
	b.Run("utf8.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			utf8.Valid(body)
		}
	})
	b.Run("count-quotes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			bytes.Count(body, []byte{'"'})
		}
	})
}
