package migrate

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// BenchmarkStream is what reading a first engine's stream through a
// Stream costs per event, beside reading it directly: the relay's cost of
// being ready to move a stream that never breaks. go test -bench Stream
// ./internal/migrate/
func BenchmarkStream(b *testing.B) {
	const events = 500
	body := []byte(strings.Repeat(chunk("chatcmpl-0123456789abcdef", 1, `{"content":" token"}`, ""), events) + "data: [DONE]\n\n")
	buf := make([]byte, 32<<10)
	for _, through := range []bool{false, true} {
		name := "direct"
		if through {
			name = "stream"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var r io.Reader = &breaking{b: body, step: 4096, err: io.EOF}
				if through {
					r = NewStream(nil, nil, io.NopCloser(r))
				}
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
	_ = bytes.MinRead
}
