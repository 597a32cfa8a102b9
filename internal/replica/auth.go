package replica

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"sync"
)

// Authenticated peers. Anyone who can publish on the sync subjects can
// speak as a replica; NATS accounts and permissions can stop them, but
// only on a server configured so, and a replica cannot tell whether it
// is. With a Key, shared by every replica of the group (config
// sync.key_file or KVROUTE_SYNC_KEY), each message carries an
// HMAC-SHA256 tag over its subject, its reply subject and its bytes, and
// a replica drops (and counts) every message without a valid one: only
// holders of the key speak as replicas, whatever the NATS server allows.
// The tag is a trailer of TagSize bytes after the message; a replica
// without the key reads a tagged message as malformed (trailing bytes),
// so that a group never half-trusts.
//
// A tag does not hide a message (TLS to NATS does that) nor stop a
// recorded one from being sent again: the receiver refuses batches older
// than its peer timeout (by their SentAt, which the tag covers), and
// within that window a replayed batch re-applies load and pins that the
// sender's next heartbeat and the bounds of limits.go contain.

// TagSize is the length of a message's tag.
const TagSize = sha256.Size

// MinKeyLen is the shortest key accepted: 32 bytes, the tag's strength.
const MinKeyLen = 32

// ErrUnauthenticated is returned by Open for a message without a valid tag.
var ErrUnauthenticated = errors.New("sync message without a valid tag")

// Key tags and checks messages. A nil *Key does neither: Seal and Open
// return the message unchanged.
type Key struct {
	macs sync.Pool
}

// NewKey returns the Key of secret, which must be at least MinKeyLen bytes.
func NewKey(secret []byte) (*Key, error) {
	if len(secret) < MinKeyLen {
		return nil, errors.New("sync key: shorter than 32 bytes")
	}
	s := append([]byte(nil), secret...)
	k := &Key{}
	k.macs.New = func() any { return hmac.New(sha256.New, s) }
	return k, nil
}

// Seal appends to msg its tag for subject and reply.
func (k *Key) Seal(msg []byte, subject, reply string) []byte {
	if k == nil {
		return msg
	}
	return k.sum(msg, subject, reply, msg)
}

// Open checks p's tag for subject and reply and returns the message
// before it; an error wrapping ErrUnauthenticated if the tag is missing
// or wrong.
func (k *Key) Open(subject, reply string, p []byte) ([]byte, error) {
	if k == nil {
		return p, nil
	}
	if len(p) < TagSize {
		return nil, ErrUnauthenticated
	}
	msg, tag := p[:len(p)-TagSize], p[len(p)-TagSize:]
	var buf [TagSize]byte
	if !hmac.Equal(k.sum(buf[:0], subject, reply, msg), tag) {
		return nil, ErrUnauthenticated
	}
	return msg, nil
}

// sum appends the tag of (subject, reply, msg) to dst. The subjects are
// length-prefixed so that no two triples hash alike.
func (k *Key) sum(dst []byte, subject, reply string, msg []byte) []byte {
	m := k.macs.Get().(hash.Hash)
	m.Reset()
	var n [binary.MaxVarintLen64]byte
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(subject)))])
	m.Write([]byte(subject))
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(reply)))])
	m.Write([]byte(reply))
	m.Write(msg)
	dst = m.Sum(dst)
	k.macs.Put(m)
	return dst
}
