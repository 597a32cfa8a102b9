package disagg

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
)

// A prefill answer's kv_transfer_params tell the decode engine where to
// pull the prompt's KV cache from: an engine (remote_engine_id), its side
// channel (remote_host, remote_port) and blocks (remote_block_ids). They
// come from an engine the router does not control, and go to another one,
// so they are checked before any decode leg carries them (checkParams):
// their types and sizes bounded, and remote_host the prefill engine's own
// host (or one the configuration allows). Parameters that fail are not
// sent: the decode engine serves the request whole.

// Transfer is what a prefill answer's transfer parameters may name besides
// the prefill engine's own host.
type Transfer struct {
	// Hosts are the side-channel hosts (remote_host) a prefill answer may
	// name although its prefill engine's URL has another host (a side
	// channel on another interface); compared as written, IP literals
	// compared as addresses.
	Hosts []string
}

// Bounds of a prefill answer's kv_transfer_params.
const (
	// maxParams bounds the parameters' JSON: an engine's list of block
	// ids for a 128k-token prompt in blocks of 16 is 8k ids, under 64 KiB.
	maxParams = 256 << 10
	// maxBlockIDs bounds the block ids (over every list).
	maxBlockIDs = 1 << 16
	// maxName bounds remote_engine_id, remote_host and any other string.
	maxName = 256
)

// checkParams reports why kv, a prefill answer's kv_transfer_params from
// the engine at host pre, cannot go to a decode engine; nil when it can.
func (t Transfer) checkParams(kv map[string]json.RawMessage, size int, pre string) error {
	if size > maxParams {
		return fmt.Errorf("kv_transfer_params of %d bytes, over %d", size, maxParams)
	}
	var id, host string
	if err := str(kv, "remote_engine_id", &id); err != nil {
		return err
	}
	if err := str(kv, "remote_host", &host); err != nil {
		return err
	}
	var port int
	if json.Unmarshal(kv["remote_port"], &port) != nil || port < 1 || port > 65535 {
		return errors.New("remote_port is not a port number (1 to 65535)")
	}
	if err := blockIDs(kv["remote_block_ids"]); err != nil {
		return err
	}
	if !t.allowed(host, pre) {
		return fmt.Errorf("remote_host %q is neither the prefill engine's host %q nor an allowed one", host, pre)
	}
	return nil
}

// str reads the string member key of kv, non-empty and at most maxName
// bytes, into s.
func str(kv map[string]json.RawMessage, key string, s *string) error {
	if json.Unmarshal(kv[key], s) != nil || *s == "" || len(*s) > maxName {
		return fmt.Errorf("%s is not a string of 1 to %d bytes", key, maxName)
	}
	return nil
}

// blockIDs checks remote_block_ids: a list of block ids (non-negative
// integers), or of such lists (one per KV cache group), at most
// maxBlockIDs in all.
func blockIDs(raw json.RawMessage) error {
	bad := errors.New("remote_block_ids is not a list of block ids")
	var flat []uint32
	if json.Unmarshal(raw, &flat) == nil {
		if len(flat) > maxBlockIDs {
			return bad
		}
		return nil
	}
	var groups [][]uint32
	if json.Unmarshal(raw, &groups) != nil {
		return bad
	}
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	if n > maxBlockIDs {
		return bad
	}
	return nil
}

// allowed reports whether a prefill answer from the engine at host pre may
// name host as its side channel: pre itself, one of t.Hosts, or a
// loopback name when pre is one (an engine on the router's machine, whose
// side channel vLLM names "localhost" by default).
func (t Transfer) allowed(host, pre string) bool {
	if same(host, pre) || slices.ContainsFunc(t.Hosts, func(h string) bool { return same(host, h) }) {
		return true
	}
	return loopback(host) && loopback(pre)
}

// same reports whether two hosts are the same: equal names (any case), or
// equal IP addresses.
func same(a, b string) bool {
	if strings.EqualFold(a, b) {
		return true
	}
	x, y := net.ParseIP(a), net.ParseIP(b)
	return x != nil && y != nil && x.Equal(y)
}

// loopback reports whether host is this machine's: localhost or a
// loopback address.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
