package config

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Sync shares routing state between kvroute replicas in front of the same
// fleet, over NATS (docs/configuration.md, "Several replicas"): each
// replica publishes its decisions and load and applies its peers', so that
// every replica sees the whole fleet's in-flight load, conversations and
// routed prefixes. Off while url is empty.
type Sync struct {
	// URL is the NATS server, e.g. "nats://nats:4222"; a comma-separated
	// list names several servers of one cluster. Schemes nats, tls, ws,
	// wss. Default "" (off); `kvroute serve --sync URL` sets it.
	URL string `yaml:"url"`
	// Subject is the prefix of the NATS subjects the replicas share
	// (<subject>.events.<replica_id>, <subject>.snapshot...): replicas
	// with the same subject on the same NATS form one group. Default
	// "kvroute".
	Subject string `yaml:"subject"`
	// ReplicaID names this replica among its peers: a NATS subject token
	// (no dots, spaces or wildcards). Default "": the host name with a
	// random suffix, new at every start.
	ReplicaID string `yaml:"replica_id"`
	// CredentialsFile is a NATS .creds file (user JWT and NKey seed).
	// Default "".
	CredentialsFile string `yaml:"credentials_file"`
	// User and Password authenticate with a user name and password;
	// Token with a token (not both). Default "".
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	Token    string `yaml:"token"`
	// TLS verifies the server (CAFile) and authenticates this replica
	// with a client certificate (CertFile and KeyFile, both or neither).
	// Default "": the system roots, no client certificate.
	TLS SyncTLS `yaml:"tls"`
	// Heartbeat is how often a replica reports its whole load to its
	// peers (which corrects any event lost on the way). Default 1s.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// PeerTimeout is how long a peer may stay silent before its load is
	// forgotten, and the longest requests wait for the peers' load and
	// decisions after a reconnection to NATS; at least twice heartbeat.
	// Default 5s.
	PeerTimeout time.Duration `yaml:"peer_timeout"`
	// FlushInterval is the longest an event waits to be batched with
	// others before it is sent; 0 sends at once (what queued while the
	// last batch was being sent goes out together). Default 0: peers that
	// see a decision later pile onto the same backend within a burst
	// (docs/routing.md, "With several replicas").
	FlushInterval time.Duration `yaml:"flush_interval"`
	// QueueSize is how many events wait to be sent before new ones are
	// dropped (counted in kvroute_sync_events_dropped_total); routing never
	// waits for them. Default 16384.
	QueueSize int `yaml:"queue_size"`
	// MaxPeers caps the live peer replicas: messages from a new replica
	// ID beyond it are ignored (counted in
	// kvroute_sync_peers_refused_total) until a peer is forgotten.
	// Default 64.
	MaxPeers int `yaml:"max_peers"`
	// KeyFile is a file whose content (surrounding whitespace trimmed, at
	// least 32 bytes) is the key the replicas share: with a key, every
	// message carries an HMAC-SHA256 tag and messages without a valid one
	// are dropped (kvroute_sync_unauthenticated_total). The
	// KVROUTE_SYNC_KEY environment variable, when set, wins. Default "":
	// no key, peers unauthenticated (docs/reliability.md, "Sync between
	// replicas", says what that exposes).
	KeyFile string `yaml:"key_file"`
}

// SyncKeyEnv is the environment variable that carries the replicas'
// shared key; when set and not empty it wins over sync.key_file.
const SyncKeyEnv = "KVROUTE_SYNC_KEY"

// MinSyncKeyLen is the shortest key accepted (`openssl rand -hex 32`
// makes one of 64).
const MinSyncKeyLen = 32

// ResolveKey returns the replicas' shared key: the KVROUTE_SYNC_KEY
// environment variable if set, else the content of key_file; nil for
// none. A key shorter than MinSyncKeyLen is an error.
func (s *Sync) ResolveKey() ([]byte, error) {
	k, where := strings.TrimSpace(os.Getenv(SyncKeyEnv)), SyncKeyEnv
	if k == "" && s.KeyFile != "" {
		b, err := os.ReadFile(s.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("sync.key_file: %w", err)
		}
		k, where = strings.TrimSpace(string(b)), "sync.key_file "+s.KeyFile
	}
	if k == "" {
		if s.KeyFile != "" {
			return nil, fmt.Errorf("sync.key_file: %s is empty", s.KeyFile)
		}
		return nil, nil
	}
	if len(k) < MinSyncKeyLen {
		return nil, fmt.Errorf("%s: the key has %d bytes; use at least %d", where, len(k), MinSyncKeyLen)
	}
	return []byte(k), nil
}

// SyncTLS is the TLS of the connection to NATS.
type SyncTLS struct {
	// CAFile is a PEM file of the CAs to verify the NATS server with.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are this replica's PEM client certificate and key.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Sync defaults.
const (
	DefaultSyncSubject       = "kvroute"
	DefaultSyncHeartbeat     = time.Second
	DefaultSyncPeerTimeout   = 5 * time.Second
	DefaultSyncFlushInterval = 0
	DefaultSyncQueueSize     = 16384
	DefaultSyncMaxPeers      = 64
)

func defaultSync() Sync {
	return Sync{Subject: DefaultSyncSubject, Heartbeat: DefaultSyncHeartbeat, PeerTimeout: DefaultSyncPeerTimeout,
		FlushInterval: DefaultSyncFlushInterval, QueueSize: DefaultSyncQueueSize, MaxPeers: DefaultSyncMaxPeers}
}

// Enabled reports whether sync is on.
func (s *Sync) Enabled() bool { return s.URL != "" }

func (s *Sync) validate(bad func(string, ...any)) {
	if !s.Enabled() {
		return
	}
	for _, raw := range strings.Split(s.URL, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		switch {
		case err != nil:
			bad("sync.url: %v", err)
		case u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss":
			bad("sync.url: %q: scheme must be nats, tls, ws or wss", raw)
		case u.Host == "":
			bad("sync.url: %q: no host", raw)
		}
	}
	if s.Subject == "" || strings.ContainsAny(s.Subject, " \t\r\n*>") || strings.HasPrefix(s.Subject, ".") ||
		strings.HasSuffix(s.Subject, ".") || strings.Contains(s.Subject, "..") {
		bad("sync.subject: %q must be a NATS subject without wildcards or empty tokens", s.Subject)
	}
	if strings.ContainsAny(s.ReplicaID, " \t\r\n*>.") || len(s.ReplicaID) > 200 {
		bad("sync.replica_id: %q must be one NATS subject token (no dots, spaces or wildcards, at most 200 bytes)", s.ReplicaID)
	}
	if s.Token != "" && (s.User != "" || s.CredentialsFile != "") {
		bad("sync.token: set a token, or user/password, or credentials_file, not several")
	}
	if s.Password != "" && s.User == "" {
		bad("sync.password: set with sync.user")
	}
	if (s.TLS.CertFile == "") != (s.TLS.KeyFile == "") {
		bad("sync.tls: cert_file and key_file go together")
	}
	if s.Heartbeat <= 0 {
		bad("sync.heartbeat: %v must be positive", s.Heartbeat)
	}
	if s.PeerTimeout < 2*s.Heartbeat {
		bad("sync.peer_timeout: %v must be at least twice sync.heartbeat (%v)", s.PeerTimeout, s.Heartbeat)
	}
	if s.FlushInterval < 0 || s.FlushInterval > s.Heartbeat {
		bad("sync.flush_interval: %v must be 0 or positive and at most sync.heartbeat", s.FlushInterval)
	}
	if s.QueueSize <= 0 {
		bad("sync.queue_size: %d must be positive", s.QueueSize)
	}
	if s.MaxPeers <= 0 {
		bad("sync.max_peers: %d must be positive", s.MaxPeers)
	}
}
