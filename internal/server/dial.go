package server

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// dialFunc opens a connection; the transports' DialTLSContext.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// listenerTLS is the TLS configuration of the client listener (and of
// admin.listen): the certificate is the one last loaded, at startup or by
// a reload, so that a rotated pair serves every new connection.
func (s *Server) listenerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cert.Load(), nil
		},
	}
}

// listen opens addr, over TLS when listen_tls is set.
func (s *Server) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil || s.cert.Load() == nil {
		return ln, err
	}
	return hintListener{tls.NewListener(ln, s.listenerTLS())}, nil
}

// hintListener is a TLS listener whose connections answer a plain HTTP
// request with a 400 that says the port speaks TLS, as net/http's own
// TLS serving does, rather than closing without a word: the HTTP server
// sees the connection through the client limits' wrapper (proxy's
// connLimit), not as a *tls.Conn, so net/http's answer never runs.
type hintListener struct{ net.Listener }

func (l hintListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return hintConn{c}, nil
}

// hintConn is one connection of a hintListener.
type hintConn struct{ net.Conn }

// plainHTTPAnswer is written, in clear, to a client that sent plain HTTP.
const plainHTTPAnswer = "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" +
	"Client sent an HTTP request to an HTTPS server: this port speaks TLS (listen_tls); use https://.\n"

// Read is the TLS connection's; a handshake that fails on a first record
// that looks like an HTTP request gets plainHTTPAnswer on the connection
// underneath before the error is returned (and the server closes it).
func (c hintConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var re tls.RecordHeaderError
	if err != nil && errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
		_ = re.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(re.Conn, plainHTTPAnswer)
	}
	return n, err
}

// looksLikeHTTP reports whether a TLS record header's five bytes start an
// HTTP request.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "PATCH", "DELET":
		return true
	}
	return false
}

// nextCert loads cfg's listen_tls pair for a reload to serve in place of
// the current one; nil keeps the current one. A listener started without
// TLS stays plain, and one started with it keeps TLS: turning it on or off
// takes a restart (restartKeys says so).
func (s *Server) nextCert(cfg *config.Config) (*tls.Certificate, error) {
	if s.cert.Load() == nil || !cfg.ListenTLS.Enabled() {
		return nil, nil
	}
	return cfg.ListenTLS.Load()
}

// dialBackendTLS opens a TLS connection to the backend at addr with the
// settings of its config entry (backends[].tls, else upstream.tls), read
// from their files now: a rotated client certificate or CA bundle is used
// from the next connection on. Every transport to the backends (proxied
// requests, health checks, /v1/models, scrapes, /tokenize) dials with it.
func (s *Server) dialBackendTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	bt, host := s.backendTLSFor(addr)
	cfg, err := bt.ClientConfig(host)
	if err != nil {
		return nil, err
	}
	timeout := s.cfg.Upstream.ConnectTimeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}, Config: cfg}
	return d.DialContext(ctx, network, addr)
}

// backendTLSFor returns the TLS settings of the backend at addr and the
// name its certificate must carry by default: the host of its entry's URL,
// which for a DNS pool is the name resolved rather than the address.
func (s *Server) backendTLSFor(addr string) (*config.BackendTLS, string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	fleetTLS := s.upstreamTLS.Load()
	if s.set == nil {
		return fleetTLS, host
	}
	for _, m := range s.set.All() {
		if m.B.URL == nil || dialAddr(m.B.URL) != addr {
			continue
		}
		if m.Entry.Base != nil && m.Entry.Base.Hostname() != "" {
			host = m.Entry.Base.Hostname()
		}
		if m.Entry.TLS != nil {
			return m.Entry.TLS, host
		}
		break
	}
	return fleetTLS, host
}

// dialAddr is u's host with its port, as a transport dials it.
func dialAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// newTransport returns the transport to the backends, which opens https
// connections with dialTLS. Compression is off so that the client's
// Accept-Encoding reaches the backend and the response bytes pass through
// untouched.
func newTransport(c config.Upstream, dialTLS dialFunc) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: c.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		DialTLSContext:        dialTLS,
		ResponseHeaderTimeout: c.ResponseHeaderTimeout,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}
