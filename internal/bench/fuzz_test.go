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

// FuzzPredicted: whatever reason header a server sends, the predicted hit
// is within the prompt and never negative.
func FuzzPredicted(f *testing.F) {
	f.Add("policy=kvroute prefix=812/1024 est_ttft=0.210s sticky", 4000)
	f.Add("prefix=3/0", 10)
	f.Add("prefix=-1/2", 10)
	f.Fuzz(func(t *testing.T, reason string, prompt int) {
		prompt = max(prompt, 0) % (1 << 30)
		if got := predicted(reason, prompt); got < 0 || got > prompt {
			t.Fatalf("predicted(%q, %d) = %d", reason, prompt, got)
		}
	})
}

func TestPredicted(t *testing.T) {
	for _, tt := range []struct {
		reason string
		want   int
	}{
		{"policy=kvroute prefix=812/1024 est_ttft=0.210s sticky", 792},
		{"policy=round-robin prefix=0/10", 0},
		{"policy=kvroute", 0},
		{"prefix=11/10", 0},
		{"prefix=a/10", 0},
		{"", 0},
	} {
		if got := predicted(tt.reason, 1000); got != tt.want {
			t.Errorf("predicted(%q) = %d, want %d", tt.reason, got, tt.want)
		}
	}
}
