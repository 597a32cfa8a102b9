package lifecycle

import (
	"bytes"
	"io"
	"testing"
)

// chunks is a reader that hands out one chunk per Read, as a stream
// arrives.
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	*c = (*c)[1:]
	return n, nil
}

// TestPeekToken: a Responses or Messages stream's first byte that counts
// is its first text delta (the events before it are sent before the
// prefill), or an event that ends the wait; a chat stream's is its first.
func TestPeekToken(t *testing.T) {
	created := []byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n")
	delta := []byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" hi\"}\n\n")
	start := []byte("event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
	block := []byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n")
	errEv := []byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"m\"}}\n\n")
	for _, c := range []struct {
		name string
		in   chunks
		want int // chunks in the head
	}{
		{"responses", chunks{created, created, delta, delta}, 3},
		{"messages", chunks{start, block, block}, 2},
		{"error before a token", chunks{start, errEv, block}, 2},
		{"ends without a token", chunks{start}, 1},
	} {
		all := bytes.Join(c.in, nil)
		want := len(bytes.Join(c.in[:c.want], nil))
		in := c.in
		head, _ := peekToken(&in)
		if len(head) != want || !bytes.Equal(head, all[:want]) {
			t.Errorf("%s: head of %d bytes, want the first %d", c.name, len(head), want)
		}
	}
	in := chunks{start, block}
	if head, _ := peek(&in); !bytes.Equal(head, start) {
		t.Errorf("peek read past the first chunk: %q", head)
	}
}
