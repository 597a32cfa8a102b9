package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"
)

// Prefill/decode disaggregation, as vLLM's NixlConnector speaks it through
// the OpenAI server (a request's kv_transfer_params, and the same member of
// a non-streamed answer):
//
//   - A prefill leg carries {"do_remote_decode": true, ...}: the engine
//     runs it as any request (the router asks for one token) and keeps its
//     blocks for the decode engine (engine.Request.HoldKV); its answer's
//     kv_transfer_params name the engine (remote_engine_id), the blocks
//     (remote_block_ids, one list per KV cache group as vLLM's hybrid KV
//     cache manager sends them: one group here), the request
//     (remote_request_id), the engine's side channel (remote_host,
//     remote_port) and tp_size, with do_remote_prefill true: the
//     connector's request_finished.
//   - A decode leg carries those params with do_remote_prefill true: the
//     engine runs it with engine.Request.RemotePrefill, waiting the
//     transfer instead of computing the prompt.
//
// The prefill engine cannot learn when a decode engine in another process
// has read its blocks (vLLM's NIXL notification), so it keeps them for as
// long as the transfer of the whole prompt takes by its own figures.

// Engine roles (Config.Role), vLLM's KV roles: a prefill engine (kv_producer)
// answers prefill legs and refuses decode legs, a decode engine
// (kv_consumer) the reverse, and both (kv_both, NixlConnector's only role)
// takes either; every role serves whole requests.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// checkRole validates a role, "" meaning both.
func checkRole(role string) (string, error) {
	switch role {
	case "", RoleBoth:
		return RoleBoth, nil
	case RolePrefill, RoleDecode:
		return role, nil
	}
	return "", fmt.Errorf("emulator: role %q is not prefill, decode or both", role)
}

// kvTransfer is what a request's kv_transfer_params ask of the engine.
type kvTransfer struct {
	// remoteDecode: a prefill leg; remotePrefill: a decode leg.
	remoteDecode, remotePrefill bool
	// The prefill engine's blocks, for a decode leg: how many the first
	// KV cache group names.
	blocks int
}

// kvParamsKey is the member that carries the params, in a request and in
// an answer.
const kvParamsKey = "kv_transfer_params"

// kvTransferOf reads the kv_transfer_params of a completion body, exactly
// as vLLM's request models read a member (its exact key, the last of a
// repeated key winning). A body without them, or with null, asks nothing.
// The body was parsed as JSON before, so only the params can be wrong.
func kvTransferOf(body []byte) (kvTransfer, error) {
	if !bytes.Contains(body, []byte(kvParamsKey)) {
		return kvTransfer{}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return kvTransfer{}, fmt.Errorf("%s: %v", kvParamsKey, err)
	}
	return parseKVTransfer(m[kvParamsKey])
}

// parseKVTransfer validates kv_transfer_params (raw, nil or null for none)
// the way vLLM's NixlConnector uses them: booleans for the two flags (not
// both), and for a decode leg a remote_engine_id, remote_host and
// remote_port (1 to 65535) and remote_block_ids as a list of block ids or a
// list of such lists (one a KV cache group), ids non-negative integers.
// remote_request_id is a string and tp_size a positive integer when given;
// other members (other connectors' fields) are left alone.
func parseKVTransfer(raw json.RawMessage) (kvTransfer, error) {
	var kt kvTransfer
	if len(raw) == 0 || string(raw) == "null" {
		return kt, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return kt, errors.New(kvParamsKey + " must be a JSON object")
	}
	var err error
	if kt.remoteDecode, err = optBool(m, "do_remote_decode"); err != nil {
		return kt, err
	}
	if kt.remotePrefill, err = optBool(m, "do_remote_prefill"); err != nil {
		return kt, err
	}
	if kt.remoteDecode && kt.remotePrefill {
		return kt, errors.New(kvParamsKey + ": do_remote_decode and do_remote_prefill cannot both be true")
	}
	if v, ok := present(m, "remote_request_id"); ok {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return kt, fieldErr("remote_request_id", "a string")
		}
	}
	if v, ok := present(m, "tp_size"); ok {
		if n, ok := jsonInt(v); !ok || n < 1 {
			return kt, fieldErr("tp_size", "a positive integer")
		}
	}
	if !kt.remotePrefill {
		return kt, nil
	}
	for _, key := range []string{"remote_engine_id", "remote_host"} {
		var s string
		v, ok := present(m, key)
		if !ok || json.Unmarshal(v, &s) != nil || s == "" {
			return kt, fieldErr(key, "a non-empty string when do_remote_prefill is true")
		}
	}
	if v, ok := present(m, "remote_port"); !ok {
		return kt, fieldErr("remote_port", "a port number when do_remote_prefill is true")
	} else if n, ok := jsonInt(v); !ok || n < 1 || n > 65535 {
		return kt, fieldErr("remote_port", "an integer from 1 to 65535")
	}
	v, ok := present(m, "remote_block_ids")
	if !ok {
		return kt, fieldErr("remote_block_ids", "a list of block ids when do_remote_prefill is true")
	}
	if kt.blocks, ok = blockIDs(v); !ok {
		return kt, fieldErr("remote_block_ids", "a list of non-negative integer block ids, or a list of such lists")
	}
	return kt, nil
}

// blockIDs checks a remote_block_ids value and counts the blocks of its
// first group.
func blockIDs(v json.RawMessage) (int, bool) {
	var flat []json.RawMessage
	if json.Unmarshal(v, &flat) != nil {
		return 0, false
	}
	ids := func(list []json.RawMessage) bool {
		for _, id := range list {
			if n, ok := jsonInt(id); !ok || n < 0 {
				return false
			}
		}
		return true
	}
	if len(flat) > 0 && bytes.HasPrefix(bytes.TrimSpace(flat[0]), []byte("[")) {
		// One list a KV cache group.
		count := -1
		for _, g := range flat {
			var group []json.RawMessage
			if json.Unmarshal(g, &group) != nil || !ids(group) {
				return 0, false
			}
			if count < 0 {
				count = len(group)
			}
		}
		return count, true
	}
	return len(flat), ids(flat)
}

// present returns member key of m unless it is missing or null.
func present(m map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	v, ok := m[key]
	if !ok || string(v) == "null" {
		return nil, false
	}
	return v, true
}

// optBool reads a boolean member, false when missing or null.
func optBool(m map[string]json.RawMessage, key string) (bool, error) {
	v, ok := present(m, key)
	if !ok {
		return false, nil
	}
	var b bool
	if json.Unmarshal(v, &b) != nil {
		return false, fieldErr(key, "a boolean")
	}
	return b, nil
}

// jsonInt reads an integer JSON number (no fraction or exponent).
func jsonInt(v json.RawMessage) (int64, bool) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
	return n, err == nil
}

func fieldErr(key, want string) error {
	return fmt.Errorf("%s.%s must be %s", kvParamsKey, key, want)
}

// checkLeg says whether this engine's role takes the leg kt asks for.
func (s *Server) checkLeg(kt kvTransfer) error {
	switch {
	case kt.remotePrefill && s.role == RolePrefill:
		return errors.New(kvParamsKey + ".do_remote_prefill: this is a prefill engine (--role prefill); send decode legs to a decode engine")
	case kt.remoteDecode && s.role == RoleDecode:
		return errors.New(kvParamsKey + ".do_remote_decode: this is a decode engine (--role decode); send prefill legs to a prefill engine")
	}
	return nil
}

// kvAnswer is the kv_transfer_params of a prefill leg's answer, its members
// in the order of vLLM's NixlConnector.request_finished.
type kvAnswer struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteBlockIDs  [][]int `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// kvAnswerFor is the kv_transfer_params answering prefill leg id, whose
// blocks the engine holds.
func (s *Server) kvAnswerFor(id string, blocks []int) json.RawMessage {
	b, _ := json.Marshal(kvAnswer{
		DoRemotePrefill: true,
		RemoteBlockIDs:  [][]int{blocks},
		RemoteEngineID:  s.engineID,
		RemoteRequestID: id,
		RemoteHost:      s.sideHost,
		RemotePort:      s.sidePort,
		TPSize:          1,
	})
	return b
}

// holdFor is how long a prefill engine keeps a prompt's blocks for the
// decode engine: the transfer of the whole prompt by the preset's figures.
func (s *Server) holdFor(promptTokens int) time.Duration {
	p := s.preset
	d := p.KVTransferLatency + time.Duration(promptTokens)*p.KVTransferPerToken
	return max(d, time.Nanosecond) // 0 would mean the engine's default
}

// splitHostPort parses a side channel address "host:port" (Config.SideChannel).
func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("emulator: side channel %q: %w", addr, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > math.MaxUint16 {
		return "", 0, fmt.Errorf("emulator: side channel %q: bad port", addr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost" // vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST default
	}
	return host, n, nil
}
