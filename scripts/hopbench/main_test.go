package main

import (
	"bytes"
	"testing"

	"github.com/kvroute/kvroute/internal/request"
)

// TestChatBody checks that bodies have exactly the size asked for, are
// requests the router accepts, and are the same bytes every time.
func TestChatBody(t *testing.T) {
	for _, agent := range []bool{false, true} {
		for _, size := range []int{2048, 4096, 204800} {
			b, err := chatBody(agent, size, "m")
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != size {
				t.Errorf("agent=%v size %d: got %d bytes", agent, size, len(b))
			}
			v, perr := request.Parse(request.Chat, b, request.Options{})
			if perr != nil {
				t.Fatalf("agent=%v size %d: %v", agent, size, perr)
			}
			if v.Model != "m" || v.Stream || len(v.Prompt) < size/2 {
				t.Errorf("agent=%v size %d: model %q, stream %v, prompt %d bytes", agent, size, v.Model, v.Stream, len(v.Prompt))
			}
			again, _ := chatBody(agent, size, "m")
			if !bytes.Equal(b, again) {
				t.Errorf("agent=%v size %d: two calls gave different bodies", agent, size)
			}
		}
	}
	if _, err := chatBody(false, 100, "m"); err == nil {
		t.Error("a 100-byte body was accepted")
	}
	// The agent body's tools, system prompt and task alone are over 1 KB.
	if _, err := chatBody(true, 1024, "m"); err == nil {
		t.Error("a 1 KB agent body was accepted")
	}
}
