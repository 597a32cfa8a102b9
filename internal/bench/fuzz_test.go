package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzReadStream checks that whatever a server streams back, readStream
// neither panics nor hangs, accepts a stream only if it ended with
// "data: [DONE]", and never counts more inter-token gaps than it read
// events.
func FuzzReadStream(f *testing.F) {
	seeds, err := filepath.Glob("testdata/streams/*.sse")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds in testdata/streams: %v", err)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := readStream(bytes.NewReader(data), time.Now())
		if st.ttft < 0 || st.e2e < 0 || len(st.itl) > bytes.Count(data, []byte("data:")) {
			t.Fatalf("impossible stats %+v", st)
		}
		if err != nil {
			return
		}
		if !bytes.Contains(data, []byte("[DONE]")) {
			t.Fatal("a stream without [DONE] was accepted")
		}
		if !st.usage && st.output > bytes.Count(data, []byte("data:")) {
			t.Fatalf("%d output tokens from fewer events", st.output)
		}
	})
}
