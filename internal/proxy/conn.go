package proxy

import (
	"bytes"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// connLimit is the client listener bounded by limits.max_connections (as
// golang.org/x/net/netutil.LimitListener, with the hits counted and the
// idle connections reclaimed). While the limit is reached, Accept waits
// (new connections queue in the kernel's backlog) after closing the
// longest idle keep-alive connection, so that idle connections can never
// lock new clients out: only connections busy with a request hold their
// place, and each of those is bounded by the header, body and write
// limits. The HTTP server reports its connections' states (track), which
// is how idle ones are known.
type connLimit struct {
	net.Listener
	slots chan struct{}
	hits  *limitHits
	done  chan struct{}
	once  sync.Once

	// wentIdle is signalled when a connection becomes idle, for an
	// Accept waiting for a place.
	wentIdle chan struct{}

	mu   sync.Mutex
	idle map[*limitedConn]time.Time // since when each is idle
}

func newConnLimit(ln net.Listener, n int, hits *limitHits) *connLimit {
	return &connLimit{Listener: ln, slots: make(chan struct{}, n), hits: hits, done: make(chan struct{}),
		wentIdle: make(chan struct{}, 1), idle: map[*limitedConn]time.Time{}}
}

func (l *connLimit) Accept() (net.Conn, error) {
	if err := l.place(); err != nil {
		return nil, err
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, l: l}, nil
}

// place waits for a place for the next connection: a free one, else one
// freed by closing the longest idle connection, now or as soon as one
// becomes idle, else one freed by a connection's end.
func (l *connLimit) place() error {
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	l.hits.hit(limitConnections, "")
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		default:
		}
		if c := l.longestIdle(); c != nil {
			l.hits.hit(limitIdleClosed, c.RemoteAddr().String())
			_ = c.Close() // frees its place before it returns
			continue
		}
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.wentIdle:
		case <-l.done:
			return net.ErrClosed
		}
	}
}

func (l *connLimit) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// longestIdle returns the connection idle the longest, nil for none.
func (l *connLimit) longestIdle() *limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	delete(l.idle, oldest)
	return oldest
}

// track is the HTTP server's ConnState hook: it keeps the set of idle
// connections.
func (l *connLimit) track(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == http.StateIdle {
		l.idle[lc] = time.Now()
		select {
		case l.wentIdle <- struct{}{}:
		default:
		}
	} else {
		delete(l.idle, lc)
	}
}

// limitedConn is one accepted connection; closing it frees its place.
// It also counts the HTTP server's own 431 answer to headers over
// limits.max_header_bytes, which net/http writes on the connection
// without calling any handler.
type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
}

// headersTooLarge starts net/http's answer to headers over
// http.Server.MaxHeaderBytes, written in one piece and never by a
// handler's response (which has a Date header after the status line).
var headersTooLarge = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

func (c *limitedConn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, headersTooLarge) {
		c.l.hits.hit(limitHeaderBytes, c.RemoteAddr().String())
	}
	return c.Conn.Write(p)
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}

// fileLimit is the process's limit on open file descriptors (Go raises
// the soft limit to the hard one at startup), 0 when unknown.
func fileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
