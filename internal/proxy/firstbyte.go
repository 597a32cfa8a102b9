package proxy

import (
	"io"
	"sync/atomic"
	"time"
)

// errFirstByteTimeout is a backend that sent its response headers and
// then nothing within upstream.response_header_timeout. It is a timeout
// (504 when no retry is left) and counts as a failure of the backend.
var errFirstByteTimeout error = firstByteTimeout{}

type firstByteTimeout struct{}

func (firstByteTimeout) Error() string {
	return "no response byte within upstream.response_header_timeout after the headers"
}
func (firstByteTimeout) Timeout() bool   { return true }
func (firstByteTimeout) Temporary() bool { return true }

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
