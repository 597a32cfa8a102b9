package epp_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvroute/kvroute/internal/config"
)

// TestTLS: with listen_tls the picker serves ext_proc over TLS with the
// listener's certificate (a gateway that dials the picker over TLS), and
// decides as over plaintext.
func TestTLS(t *testing.T) {
	// httptest's certificate, for 127.0.0.1, as the listener's files.
	ts := httptest.NewTLSServer(http.NotFoundHandler())
	ts.Close()
	c := ts.TLS.Certificates[0]
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	rg := newRig(t, 1, func(cfg *config.Config) { cfg.ListenTLS = config.ListenTLS{CertFile: certFile, KeyFile: keyFile} })
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	ext, _ := rg.srv.EPPAddr()
	conn, err := grpc.NewClient(ext, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rg.conn = conn
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true}.sendRequest(t, st, chat("s", "hello", false))
	if d := readDecision(t, st); rg.byAddr[d.dest] == nil {
		t.Fatalf("over TLS: destination %q", d.dest)
	}
}
