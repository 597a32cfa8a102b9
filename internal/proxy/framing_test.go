package proxy

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// rawRequests writes raw onto one connection to the router and reads n
// responses off it; closed reports whether the router closed the
// connection after the last one.
func (r *rig) rawRequests(raw string, n int) (resps []*http.Response, bodies []string, closed bool) {
	r.t.Helper()
	c := dial(r.t, r.srv.Addr())
	if _, err := io.WriteString(c, raw); err != nil {
		r.t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(c)
	for i := range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			r.t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resps, bodies = append(resps, resp), append(bodies, string(b))
	}
	// The deadline tells a kept connection (timeout) from a closed one.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := br.ReadByte()
	var ne net.Error
	closed = !(errors.As(err, &ne) && ne.Timeout())
	return resps, bodies, closed
}

// TestContentLengthAndTransferEncodingClose: a request with both
// Content-Length and Transfer-Encoding is answered (by its chunked body,
// as RFC 9112 says) and then its connection is closed, as seen on the
// wire; a request with a Content-Length alone keeps its connection for the
// next request.
func TestContentLengthAndTransferEncodingClose(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	body := chat("shared", false, "smuggle")
	both := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	resps, bodies, closed := r.rawRequests(both, 1)
	if resps[0].StatusCode != http.StatusOK || bodies[0] != jsonAnswer("b0") {
		t.Errorf("CL+TE request: status %d %q; want the chunked body served", resps[0].StatusCode, bodies[0])
	}
	if !resps[0].Close || !closed {
		t.Errorf("CL+TE request: Connection: close %v, connection closed %v; want both", resps[0].Close, closed)
	}

	one := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resps, _, closed = r.rawRequests(one+one, 2)
	if resps[0].Close || resps[1].StatusCode != http.StatusOK || closed {
		t.Errorf("Content-Length requests: close %v, second status %d, closed %v; want a kept connection", resps[0].Close, resps[1].StatusCode, closed)
	}
}

// TestUpgradeRefused: a protocol upgrade gets 501 in the OpenAI shape and
// never reaches a backend; an h2c upgrade offer is ignored and the
// request served over HTTP/1.1.
func TestUpgradeRefused(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	body := chat("shared", false, "upgrade")
	req := func(upgrade string) string {
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", upgrade, len(body), body)
	}
	resps, bodies, _ := r.rawRequests(req("websocket"), 1)
	checkErrorShape(t, result{status: resps[0].StatusCode, header: resps[0].Header, body: []byte(bodies[0])}, http.StatusNotImplemented, openai.TypeInvalidRequest)
	if n := r.backends[0].hits.Load(); n != 0 {
		t.Errorf("the upgrade reached the backend (%d requests)", n)
	}
	resps, bodies, _ = r.rawRequests(req("h2c"), 1)
	if resps[0].StatusCode != http.StatusOK || bodies[0] != jsonAnswer("b0") {
		t.Errorf("h2c offer: status %d %q; want the completion over HTTP/1.1", resps[0].StatusCode, bodies[0])
	}
	if h := *r.backends[0].lastHeader.Load(); h.Get("Upgrade") != "" || strings.Contains(strings.ToLower(h.Get("Connection")), "upgrade") {
		t.Errorf("the backend saw an upgrade offer: %v", h)
	}
}

// TestErrorsHideBackendAddresses: a backend that cannot be reached (its
// name left to the default, its host:port) gives the client a 502 whose
// message names no address, and the router's log the cause with it.
func TestErrorsHideBackendAddresses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there any more: connection refused
	r, logs := newLoggedRig(t, 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: "http://" + addr, Models: []string{"shared"}}}
		c.Health.Path = ""
		c.Engines.Enabled = false
		c.Retry.Attempts = 0
	})
	res := r.post("/v1/chat/completions", chat("shared", false, "where"))
	checkErrorShape(t, res, http.StatusBadGateway, openai.TypeServer)
	port := addr[strings.LastIndex(addr, ":")+1:]
	if strings.Contains(string(res.body), "127.0.0.1") || strings.Contains(string(res.body), port) {
		t.Errorf("the client's 502 names the backend's address: %s", res.body)
	}
	if !strings.Contains(logs.String(), addr) {
		t.Error("the log does not name the failed backend's address")
	}
}

// TestModelsCached: client GET /v1/models within upstream.models_cache_ttl
// ask each backend once, not once a request; after the TTL, or when the
// set of healthy backends changes, the router asks again.
func TestModelsCached(t *testing.T) {
	const ttl = 300 * time.Millisecond
	r := newRig(t, "round-robin", 2, func(c *config.Config) { c.Upstream.ModelsCacheTTL = ttl })
	hits := func() (n int64) {
		for _, f := range r.backends {
			n += f.modelHits.Load()
		}
		return n
	}
	before := hits() // startup discovery
	want := string(r.get("/v1/models").body)
	for range 20 {
		if got := string(r.get("/v1/models").body); got != want {
			t.Fatalf("cached answer %q, want %q", got, want)
		}
	}
	if n := hits() - before; n != 2 {
		t.Errorf("21 GET /v1/models within the TTL asked the backends %d times, want 2 (once each)", n)
	}
	time.Sleep(ttl)
	r.get("/v1/models")
	if n := hits() - before; n != 4 {
		t.Errorf("after the TTL: %d asks in all, want 4", n)
	}
	r.srv.fleet.Drain(r.backendByName("b1"), time.Now())
	var list struct{ Data []struct{ ID string } }
	_ = json.Unmarshal(r.get("/v1/models").body, &list)
	if len(list.Data) != 2 || list.Data[1].ID != "own-b0" {
		t.Errorf("after b1 left the healthy set: %+v, want b0's models only", list.Data)
	}
}

// FuzzTrust feeds the request fields the router trusts a request by (its
// peer address, priority header, Authorization, Connection and Upgrade)
// to the priority and upgrade checks: neither panics, a priority is in
// range and comes only from a trusted front or a configured key, and an
// upgrade is only ever the request's own Upgrade header.
func FuzzTrust(f *testing.F) {
	f.Add("10.1.2.3:5000", "7", "Bearer k", "Upgrade", "websocket")
	f.Add("[::ffff:10.0.0.1]:1", "-1000000", "bearer  k ", "keep-alive, upgrade", "h2c")
	f.Add("192.0.2.1:80", "1e9", "Basic x", "close", "")
	f.Add("garbage", "", "Bearer other", "", "x")
	fronts, err := (config.Admission{TrustedPriorityCIDRs: []string{"10.0.0.0/8"}}).TrustedFronts()
	if err != nil {
		f.Fatal(err)
	}
	keys, err := (config.Admission{KeyPriorities: []config.KeyPriority{{Key: "k", Priority: 3}}}).KeyPriorityDigests()
	if err != nil {
		f.Fatal(err)
	}
	p := priorities{fronts: fronts, keys: keys}
	f.Fuzz(func(t *testing.T, remote, prio, auth, conn, upgrade string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		r.Header.Set("X-Kvroute-Priority", prio)
		r.Header.Set("Authorization", auth)
		r.Header.Set("Connection", conn)
		r.Header.Set("Upgrade", upgrade)
		got, e := p.of(r)
		if got < -config.MaxPriority || got > config.MaxPriority {
			t.Fatalf("priority %d out of range", got)
		}
		if got != 0 && got != 3 && !p.fromFront(remote) {
			t.Fatalf("priority %d from an untrusted peer %q", got, remote)
		}
		if e != nil && (e.Status != http.StatusBadRequest || !p.fromFront(remote)) {
			t.Fatalf("error %+v for peer %q", e, remote)
		}
		if up := upgradeOf(r.Header); up != "" && up != r.Header.Get("Upgrade") {
			t.Fatalf("upgrade %q, header %q", up, r.Header.Get("Upgrade"))
		}
	})
}
