package proxy

import (
	"context"
	"io"
	"net/http"
)

// relay is the body of the response the client gets, as the reverse proxy
// reads it: the bytes firstByte already read, then the backend's. It notes
// how the body ended for the exchange's settle (complete, or broken by the
// backend) and, when the backend breaks an event stream, appends the error
// event (streamerr.go). The reverse proxy reads and closes it on the
// exchange's goroutine.
type relay struct {
	rc      io.ReadCloser
	ctx     context.Context
	backend string
	head    []byte
	headErr error
	// complete is set when the backend's body reached its end; broken
	// holds the error of a body the backend broke.
	complete bool
	broken   error
	// sse marks an event stream, which gets an error event if its backend
	// breaks it: tail tracks event boundaries, and cut holds the event's
	// unsent bytes, then cutErr is returned.
	sse    bool
	tail   sseTail
	cut    []byte
	cutErr error
}

func newRelay(ex *exchange, resp *http.Response, head []byte, headErr error) *relay {
	return &relay{rc: resp.Body, ctx: resp.Request.Context(), backend: ex.target.B.Name, head: head, headErr: headErr,
		sse: resp.StatusCode == http.StatusOK && isSSE(resp.Header.Get("Content-Type"))}
}

func (t *relay) Read(p []byte) (int, error) {
	if t.cutErr != nil {
		n := copy(p, t.cut)
		t.cut = t.cut[n:]
		if n == 0 {
			return 0, t.cutErr
		}
		return n, nil
	}
	n, err := t.read(p)
	if !t.sse {
		return n, err
	}
	t.tail.note(p[:n])
	if t.broken != nil {
		t.cut, t.cutErr = streamErrorEvent(t.backend, err, t.tail.atBoundary()), err
		if n == 0 {
			return t.Read(p)
		}
		return n, nil // the event follows on the next Read
	}
	return n, err
}

// read is Read for the backend's own bytes.
func (t *relay) read(p []byte) (int, error) {
	var n int
	var err error
	switch {
	case len(t.head) > 0:
		n = copy(p, t.head)
		t.head = t.head[n:]
		if len(t.head) == 0 {
			err = t.headErr
		}
	case t.headErr != nil:
		err = t.headErr
	default:
		n, err = t.rc.Read(p)
	}
	if err != nil {
		t.end(err)
	}
	return n, err
}

// end notes how the body ended: io.EOF for a complete body, anything else
// (while the client is still there) for a body broken by the backend.
func (t *relay) end(err error) {
	if t.complete || t.broken != nil {
		return
	}
	if err == io.EOF {
		t.complete = true
	} else if t.ctx.Err() == nil {
		t.broken = err
	}
}

func (t *relay) Close() error { return t.rc.Close() }
