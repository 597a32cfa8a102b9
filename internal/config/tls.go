package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ListenTLS serves the client listener, and admin.listen when set, over
// TLS. Both files are PEM; they are read at startup and again on every
// reload (SIGHUP, or a change of the config file or of these two files,
// which `kvroute serve` watches), so that a rotated pair (cert-manager
// rewrites the files in place) is served to new connections without a
// restart. Default: both empty, plain HTTP.
type ListenTLS struct {
	// CertFile is the certificate chain, the server's certificate first.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the certificate's private key.
	KeyFile string `yaml:"key_file"`
}

// Enabled reports whether the listener serves TLS.
func (l ListenTLS) Enabled() bool { return l.CertFile != "" || l.KeyFile != "" }

// Load reads the certificate and key.
func (l ListenTLS) Load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(l.CertFile, l.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("listen_tls: %w", err)
	}
	return &c, nil
}

func (l ListenTLS) validate(bad func(string, ...any)) {
	if l.Enabled() && (l.CertFile == "" || l.KeyFile == "") {
		bad("listen_tls: set both cert_file and key_file")
	}
}

// BackendTLS is how the router connects to an https backend: which
// authorities it trusts, the client certificate it shows to an engine that
// requires one (mutual TLS), and the name it expects on the engine's
// certificate. It applies to https URLs only. Set per backend entry
// (backends[].tls, for a DNS pool every address it resolves to) or for the
// whole fleet (upstream.tls); an entry's own wins whole, the two are not
// merged. The files are read whenever a new connection is opened, so a
// rotated certificate is used from the next connection on.
type BackendTLS struct {
	// CAFile is a PEM bundle of the authorities that sign the backends'
	// certificates. Default "": the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the router's client certificate and its
	// key (PEM), sent to a backend that asks for one. Default "": none.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the backend's certificate must carry.
	// Default "": the host of the entry's URL (for a DNS pool the name
	// it resolves, not each address).
	ServerName string `yaml:"server_name"`
}

func (b *BackendTLS) validate(where string, bad func(string, ...any)) {
	if b != nil && (b.CertFile == "") != (b.KeyFile == "") {
		bad("%s: set both cert_file and key_file, or neither", where)
	}
}

// ClientConfig reads the files and returns the TLS settings of a
// connection to a backend; host is the server name to expect when
// server_name is not set. A nil b gives Go's defaults with host.
func (b *BackendTLS) ClientConfig(host string) (*tls.Config, error) {
	c := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if b == nil {
		return c, nil
	}
	if b.ServerName != "" {
		c.ServerName = b.ServerName
	}
	if b.CAFile != "" {
		pem, err := os.ReadFile(b.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file: %s holds no PEM certificate", b.CAFile)
		}
		c.RootCAs = pool
	}
	if b.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(b.CertFile, b.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.cert_file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
