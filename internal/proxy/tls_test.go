package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// testCA is a certificate authority a test makes for itself.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

// newTestPKI makes a CA and a directory for the test's PEM files, the
// CA's certificate in caFile.
func newTestPKI(t *testing.T) (ca *testCA, dir, caFile string) {
	t.Helper()
	ca, dir = newTestCA(t), t.TempDir()
	caFile = filepath.Join(dir, "ca.pem")
	writeFile(t, caFile, ca.pem)
	return ca, dir, caFile
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a certificate for name (also its DNS SAN, with 127.0.0.1)
// and writes it and its key as PEM files in dir, named after file.
func (ca *testCA) issue(t *testing.T, dir, file, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, file+".crt"), filepath.Join(dir, file+".key")
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return certFile, keyFile
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mtlsFake is a fake backend served over TLS that requires a client
// certificate signed by ca; clients counts the requests that showed one.
func mtlsFake(t *testing.T, ca *testCA, dir string) (*fake, *atomic.Int64) {
	t.Helper()
	f := newFake(t, "tls0")
	f.srv.Close()
	crt, key := ca.issue(t, dir, "backend", "backend.test", x509.ExtKeyUsageServerAuth)
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	var clients atomic.Int64
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "router-client" {
			clients.Add(1)
		}
		f.serve(w, r)
	}))
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool}
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f, &clients
}

// TestTLSEndToEnd: a client reaches the router over TLS, the router
// reaches a backend that requires a client certificate over mutual TLS
// (with the settings on the entry, and as the fleet default), the admin
// listener serves TLS too, and a reload swaps the listener's certificate
// for new connections.
func TestTLSEndToEnd(t *testing.T) {
	for _, where := range []string{"entry", "fleet default"} {
		t.Run(where, func(t *testing.T) {
			ca, dir, caFile := newTestPKI(t)
			f, clients := mtlsFake(t, ca, dir)
			srvCrt, srvKey := ca.issue(t, dir, "router", "router.test", x509.ExtKeyUsageServerAuth)
			cliCrt, cliKey := ca.issue(t, dir, "client", "router-client", x509.ExtKeyUsageClientAuth)

			cfg := config.Default()
			cfg.Listen = "127.0.0.1:0"
			cfg.Admin.Listen = "127.0.0.1:0"
			cfg.Admin.Token = strings.Repeat("t", config.MinAdminTokenLen)
			cfg.ListenTLS = config.ListenTLS{CertFile: srvCrt, KeyFile: srvKey}
			cfg.Engines.Enabled = false
			bt := &config.BackendTLS{CAFile: caFile, CertFile: cliCrt, KeyFile: cliKey, ServerName: "backend.test"}
			b := config.Backend{URL: f.srv.URL, Name: f.name}
			if where == "entry" {
				b.TLS = bt
			} else {
				cfg.Upstream.TLS = bt
			}
			cfg.Backends = []config.Backend{b}
			if err := cfg.Check(); err != nil {
				t.Fatal(err)
			}
			srv, err := newRouter(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			})
			// A new connection for every request, so that each shows the
			// certificate served at the time.
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: ca.pool, ServerName: "router.test"}}}
			post := func() (*http.Response, string) {
				t.Helper()
				resp, err := client.Post("https://"+srv.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chat("shared", false, "hello")))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp, string(body)
			}
			resp, body := post()
			if resp.StatusCode != http.StatusOK || body != jsonAnswer(f.name) {
				t.Fatalf("over TLS: %d %q", resp.StatusCode, body)
			}
			if got := resp.TLS.PeerCertificates[0].Subject.CommonName; got != "router.test" {
				t.Errorf("router's certificate %q", got)
			}
			if clients.Load() == 0 {
				t.Error("the backend saw no request with the router's client certificate")
			}
			// Plain HTTP to either TLS port gets a 400 that says so, not an
			// empty reply.
			for _, addr := range []string{srv.Addr(), srv.AdminAddr()} {
				presp, err := http.Get("http://" + addr + "/healthz")
				if err != nil {
					t.Errorf("plain HTTP to the TLS port %s: %v, want a 400 saying the port speaks TLS", addr, err)
					continue
				}
				pbody, _ := io.ReadAll(presp.Body)
				presp.Body.Close()
				if presp.StatusCode != http.StatusBadRequest || !strings.Contains(string(pbody), "HTTPS server") || !strings.Contains(string(pbody), "https://") {
					t.Errorf("plain HTTP to the TLS port %s: %d %q, want a 400 saying the port speaks TLS", addr, presp.StatusCode, pbody)
				}
			}

			req, _ := http.NewRequest(http.MethodGet, "https://"+srv.AdminAddr()+"/admin/backends", nil)
			req.Header.Set("Authorization", "Bearer "+cfg.Admin.Token)
			aresp, err := client.Do(req)
			if err != nil {
				t.Fatalf("admin listener over TLS: %v", err)
			}
			aresp.Body.Close()
			if aresp.StatusCode != http.StatusOK {
				t.Errorf("admin over TLS: %d", aresp.StatusCode)
			}

			// Rotate the pair in place, as cert-manager does, and reload.
			ca.issue(t, dir, "router", "router2.test", x509.ExtKeyUsageServerAuth)
			client.Transport.(*http.Transport).TLSClientConfig.ServerName = "router2.test"
			if err := srv.Reload(cfg); err != nil {
				t.Fatal(err)
			}
			resp, body = post()
			if resp.StatusCode != http.StatusOK || body != jsonAnswer(f.name) {
				t.Fatalf("after the reload: %d %q", resp.StatusCode, body)
			}
			if got := resp.TLS.PeerCertificates[0].Subject.CommonName; got != "router2.test" {
				t.Errorf("after the reload the router serves %q, want the rotated router2.test", got)
			}
		})
	}
}

// TestBackendTLSRequiresClientCert: without the client certificate the
// mutual TLS backend refuses the router, which answers 502; the name the
// backend's certificate must carry is checked.
func TestBackendTLSRequiresClientCert(t *testing.T) {
	ca, dir, caFile := newTestPKI(t)
	f, _ := mtlsFake(t, ca, dir)
	cliCrt, cliKey := ca.issue(t, dir, "client", "router-client", x509.ExtKeyUsageClientAuth)
	for _, tc := range []struct {
		name string
		tls  config.BackendTLS
	}{
		{"no client certificate", config.BackendTLS{CAFile: caFile, ServerName: "backend.test"}},
		{"wrong server name", config.BackendTLS{CAFile: caFile, CertFile: cliCrt, KeyFile: cliKey, ServerName: "other.test"}},
		{"unknown authority", config.BackendTLS{CertFile: cliCrt, KeyFile: cliKey, ServerName: "backend.test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bt := tc.tls
			r := newRig(t, "round-robin", 0, func(c *config.Config) {
				c.Engines.Enabled = false
				c.Upstream.DiscoverModels = false
				c.Health.Path = ""
				c.Retry.Attempts = 0
				c.Backends = []config.Backend{{URL: f.srv.URL, Name: f.name, TLS: &bt}}
			})
			if res := r.post("/v1/chat/completions", chat("shared", false, "hello")); res.status != http.StatusBadGateway {
				t.Errorf("%s: status %d %s, want 502", tc.name, res.status, res.body)
			}
		})
	}
}
