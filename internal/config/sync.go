package config

import (
	"net/url"
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
)

func defaultSync() Sync {
	return Sync{Subject: DefaultSyncSubject, Heartbeat: DefaultSyncHeartbeat, PeerTimeout: DefaultSyncPeerTimeout,
		FlushInterval: DefaultSyncFlushInterval, QueueSize: DefaultSyncQueueSize}
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
}
