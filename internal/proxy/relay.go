package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/request"
)

// relay is the body of the response the client gets, as the reverse proxy
// reads it: the bytes firstByte already read, then the backend's. It notes
// how the body ended for the exchange's settle (complete, or broken by the
// backend) and, when the backend breaks an event stream, appends the error
// event (streamerr.go). The reverse proxy reads and closes it on the
// exchange's goroutine.
//
// It also bounds both ends of the stream. Each read from the backend is
// bounded by upstream.stream_idle_timeout (a timer closes the backend's
// body, and the body counts as broken by errStreamIdle); only the time
// spent waiting for the backend counts, not the time the client takes.
// Each write to the client is bounded by limits.client_write_timeout: the
// write deadline of the client's connection is pushed forward before the
// bytes of every read go out, so that a client that stops reading fails
// the write, which ends the response and with it the upstream request.
type relay struct {
	rc      io.ReadCloser
	ctx     context.Context
	head    []byte
	headErr error
	// complete is set when the backend's body reached its end; broken
	// holds the error of a body the backend broke.
	complete bool
	broken   error
	// sse marks an event stream, which gets an error event if its backend
	// breaks it: tail tracks event boundaries, cut holds the event's
	// unsent bytes, and cutting is set once it does, after which the body
	// ends cleanly (io.EOF).
	sse     bool
	tail    sseTail
	cut     []byte
	cutting bool
	// idle closes rc when the backend stays silent for idleAfter; nil
	// without a stream idle timeout. It is stopped after every read, so
	// that a Stop reporting false is the deadline having passed.
	idle      lifecycle.Timer
	idleAfter time.Duration
	// client is the client's response, whose write deadline is pushed
	// writeAfter ahead of every read; nil without a client write timeout.
	client     *http.ResponseController
	writeAfter time.Duration
	// tally reads the 2xx body's tokens (lifecycle.Tally); counted is false for
	// another status.
	tally   lifecycle.Tally
	counted bool
	// answer blanks the engine's kv_transfer_params from a JSON or event
	// stream body (disagg.Answer: in place, the body's length kept); held
	// are the bytes it held back from the last read, handed to it again
	// first. nil for any other body.
	answer *disagg.Answer
	held   []byte
	// backend is the engine whose 2xx body this is (counted).
	backend *fleet.Backend
}

func newRelay(ex *exchange, l *lifecycle.Leg, resp *http.Response, head []byte, headErr error) *relay {
	t := &relay{rc: resp.Body, ctx: resp.Request.Context(), head: head, headErr: headErr,
		sse: resp.StatusCode == http.StatusOK && isSSE(resp.Header.Get("Content-Type"))}
	if resp.StatusCode/100 == 2 && !ex.Passthrough {
		t.counted, t.backend = true, l.Target.B
		t.tally.SSE = t.sse
		t.tally.Agent = ex.View != nil && (ex.View.Kind == request.Responses || ex.View.Kind == request.Messages)
		t.tally.ITL = l.Target.ITL(ex.Model)
		// Only the exchange's GenAI span reports the response's model
		// (endTrace): without one it is not read.
		t.tally.ModelSeen = ex.span == nil || ex.op == ""
	}
	if ct := strings.ToLower(resp.Header.Get("Content-Type")); strings.Contains(ct, "json") || isSSE(ct) {
		t.answer = &disagg.Answer{}
	}
	if d := ex.s.cfg.Upstream.StreamIdleTimeout; d > 0 {
		t.idleAfter = d
		t.idle = lifecycle.AfterFunc(d, func() { _ = t.rc.Close() })
		t.idle.Stop()
	}
	if d := ex.s.cfg.Limits.ClientWriteTimeout; d > 0 && ex.client != nil {
		t.client, t.writeAfter = ex.client, d
	}
	return t
}

func (t *relay) Read(p []byte) (int, error) {
	if t.cutting {
		n := copy(p, t.cut)
		t.cut = t.cut[n:]
		if n == 0 {
			return 0, io.EOF // the chunked body ends as any other
		}
		return n, nil
	}
	n, err := t.read(p)
	if t.client != nil {
		_ = t.client.SetWriteDeadline(time.Now().Add(t.writeAfter))
	}
	if !t.sse {
		return n, err
	}
	t.tail.note(p[:n])
	if t.broken != nil && t.tail.done() {
		// The backend went away after the stream's last event: the client
		// has the whole response, which ends as a complete one.
		t.broken = nil
		t.end(io.EOF)
		return n, io.EOF
	}
	if t.broken != nil {
		t.cut, t.cutting = streamErrorEvent(err, t.tail.atBoundary(), t.tally.Agent), true
		if n == 0 {
			return t.Read(p)
		}
		return n, nil // the event follows on the next Read
	}
	return n, err
}

// read is Read for the backend's own bytes, without the engine's
// kv_transfer_params.
func (t *relay) read(p []byte) (int, error) {
	if t.answer == nil {
		return t.raw(p)
	}
	if len(p) <= disagg.MaxHeld {
		// The reverse proxy reads 32 KiB at a time.
		return 0, io.ErrShortBuffer
	}
	h := copy(p, t.held)
	n, err := t.raw(p[h:])
	n += h
	k := t.answer.Strip(p[:n], err != nil)
	t.held = append(t.held[:0], p[k:n]...)
	return k, err
}

// raw is read before the kv_transfer_params are blanked.
func (t *relay) raw(p []byte) (int, error) {
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
		n, err = t.readBackend(p)
	}
	if t.counted && n > 0 {
		var now time.Time
		if t.sse { // only a stream's gaps are timed
			now = time.Now()
		}
		t.tally.Note(p[:n], now)
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
		if t.counted {
			t.tally.Finish()
		}
	} else if t.ctx.Err() == nil {
		t.broken = err
	}
}

// readBackend reads the backend's body under the stream idle timeout.
func (t *relay) readBackend(p []byte) (int, error) {
	if t.idle == nil {
		return t.rc.Read(p)
	}
	t.idle.Reset(t.idleAfter)
	n, err := t.rc.Read(p)
	if !t.idle.Stop() {
		// The deadline passed first: rc is (or is about to be) closed,
		// whatever this read returned.
		return n, errStreamIdle
	}
	return n, err
}

func (t *relay) Close() error {
	if t.idle != nil {
		t.idle.Stop()
	}
	return t.rc.Close()
}
