package emulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Running is a Server listening on a socket, for in-process use (kvroute
// compare, tests).
type Running struct {
	// URL is the base URL, e.g. http://127.0.0.1:41234.
	URL string
	// Server is the emulated engine behind it.
	Server *Server

	http *http.Server
	stop func() bool
}

// Start builds a Server for cfg, listens on addr (e.g. "127.0.0.1:0") and
// serves until ctx is done or Close is called.
//
// Its prefill answers name the listening address as their side channel
// unless cfg.SideChannel says otherwise.
func Start(ctx context.Context, cfg Config, addr string) (*Running, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: listen %s: %w", addr, err)
	}
	if cfg.SideChannel == "" {
		cfg.SideChannel = ln.Addr().String()
	}
	s, err := New(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	r := &Running{
		URL:    "http://" + ln.Addr().String(),
		Server: s,
		http:   &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second},
	}
	go func() {
		if err := r.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("emulator: serve", "addr", r.URL, "err", err)
		}
	}()
	r.stop = context.AfterFunc(ctx, func() { r.Close() })
	return r, nil
}

// Close stops the engine (cutting any streams still open) and the listener.
func (r *Running) Close() error {
	r.stop()
	// The engine first: open streams end at once instead of running out.
	r.Server.Close()
	return r.http.Close()
}
