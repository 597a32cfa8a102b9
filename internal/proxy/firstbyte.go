package proxy

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// timeoutError is a backend that kept the router waiting past one of the
// upstream timeouts. It is a net.Error timeout (504 when no retry is left)
// and counts as a failure of the backend.
type timeoutError string

func (e timeoutError) Error() string { return string(e) }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var (
	// errFirstByteTimeout is a backend that sent its response headers
	// and then nothing within upstream.response_header_timeout.
	errFirstByteTimeout error = timeoutError("no response byte within upstream.response_header_timeout after the headers")
	// errFirstTokenTimeout is a streaming request that got no body byte
	// within upstream.first_token_timeout of being sent.
	errFirstTokenTimeout error = timeoutError("no first token within upstream.first_token_timeout")
	// errStreamIdle is a backend that went silent for
	// upstream.stream_idle_timeout after its first byte.
	errStreamIdle error = timeoutError("the backend sent nothing within upstream.stream_idle_timeout")
)

// firstByte is peek bounded by upstream.response_header_timeout: engines
// such as vLLM send a stream's headers before its prefill, so a stuck
// engine is one that sends headers and then nothing. The timeout closes
// the body, which ends the upstream request; nothing has reached the
// client yet, so the request can still be retried.
func (s *Server) firstByte(body io.ReadCloser) ([]byte, error) {
	d := s.cfg.Upstream.ResponseHeaderTimeout
	if d <= 0 {
		return peek(body)
	}
	var fired atomic.Bool
	t := time.AfterFunc(d, func() {
		fired.Store(true)
		_ = body.Close()
	})
	head, err := peek(body)
	if !t.Stop() && fired.Load() {
		return nil, errFirstByteTimeout
	}
	return head, err
}

// peek reads until the first byte of body arrives or the body ends.
func peek(body io.Reader) ([]byte, error) {
	buf := make([]byte, 4096)
	for {
		n, err := body.Read(buf)
		if n > 0 || err != nil {
			return buf[:n], err
		}
	}
}

// firstToken bounds a streaming attempt, from its sending to its first
// body byte, by upstream.first_token_timeout: it cancels the attempt's
// context, which ends the wait for headers and for the first byte alike.
// A nil *firstToken bounds nothing.
type firstToken struct {
	t     *time.Timer
	fired atomic.Bool
}

// boundFirstToken returns out under the first-token bound when v is a
// streaming request and the bound is set, else out and nil.
func (s *Server) boundFirstToken(v *request.View, out *http.Request) (*http.Request, *firstToken) {
	d := s.cfg.Upstream.FirstTokenTimeout
	if v == nil || !v.Stream || d <= 0 {
		return out, nil
	}
	ctx, cancel := context.WithCancelCause(out.Context())
	ft := &firstToken{}
	ft.t = time.AfterFunc(d, func() {
		ft.fired.Store(true)
		cancel(errFirstTokenTimeout)
	})
	// The attempt's context is a child of the request's, which net/http
	// cancels when the handler returns: cancel need not be kept.
	return out.WithContext(ctx), ft
}

// done stops the bound once the attempt has its first byte (or failed)
// and reports whether the bound fired first, in which case the attempt's
// context is cancelled and the attempt is a timeout.
func (ft *firstToken) done() bool {
	return ft != nil && !ft.t.Stop() && ft.fired.Load()
}
