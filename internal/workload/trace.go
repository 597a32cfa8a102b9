package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/request"
)

// Sanity limits on a trace line: they keep a corrupt or hostile line from
// asking for gigabytes of prompt text when its body is built.
const (
	maxTraceInputTokens = 1 << 22 // 16 MiB of prompt text
	maxTraceOutput      = 1 << 20
	maxLineBytes        = 16 << 20
)

// traceLine is one line of a Mooncake-format trace. Pointers tell a missing
// field from a zero one; unknown fields are allowed, so that traces with
// extra annotations still load.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

type traceEntry struct {
	at      float64 // ms
	in, out int
	ids     []int64
	line    int
}

// ReadTrace parses a Mooncake-format JSONL trace (see Load for the text it
// is given). name is used in error messages.
func ReadTrace(r io.Reader, name string, opt Options) ([]Request, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var entries []traceEntry
	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		e, err := parseTraceLine(raw)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		e.line = line
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s: no requests", name)
	}
	// Replay in arrival order; equal timestamps keep file order.
	slices.SortStableFunc(entries, func(a, b traceEntry) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	if opt.WindowStart > 0 || opt.WindowEnd > 0 {
		lo, hi := ms(opt.WindowStart), math.Inf(1)
		if opt.WindowEnd > 0 {
			hi = ms(opt.WindowEnd)
		}
		entries = slices.DeleteFunc(entries, func(e traceEntry) bool { return e.at < lo || e.at >= hi })
		if len(entries) == 0 {
			return nil, fmt.Errorf("%s: no requests in window [%v, %v)", name, opt.WindowStart, opt.WindowEnd)
		}
	}
	if opt.Limit > 0 && len(entries) > opt.Limit {
		entries = entries[:opt.Limit]
	}
	base := entries[0].at
	cache := newBlockCache(blockCacheSize)
	reqs := make([]Request, len(entries))
	for i, e := range entries {
		at := (e.at - base) / opt.Speedup
		reqs[i] = Request{
			At:           time.Duration(at * float64(time.Millisecond)),
			Kind:         request.Completion,
			InputTokens:  e.in,
			OutputTokens: e.out,
			body:         traceBody(cache, e),
		}
	}
	return reqs, nil
}

// blockCacheSize bounds a trace's block cache: 16,384 blocks, 32 MiB.
const blockCacheSize = 1 << 14

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func parseTraceLine(raw []byte) (traceEntry, error) {
	var l traceLine
	if err := json.Unmarshal(raw, &l); err != nil {
		return traceEntry{}, fmt.Errorf("invalid JSON: %w", err)
	}
	switch {
	case l.Timestamp == nil:
		return traceEntry{}, fmt.Errorf("missing \"timestamp\"")
	case l.InputLength == nil:
		return traceEntry{}, fmt.Errorf("missing \"input_length\"")
	case l.OutputLength == nil:
		return traceEntry{}, fmt.Errorf("missing \"output_length\"")
	case l.HashIDs == nil:
		return traceEntry{}, fmt.Errorf("missing \"hash_ids\"")
	}
	e := traceEntry{at: *l.Timestamp, in: *l.InputLength, out: *l.OutputLength, ids: l.HashIDs}
	switch {
	case math.IsNaN(e.at) || math.IsInf(e.at, 0) || e.at < 0:
		return e, fmt.Errorf("timestamp %v must be a non-negative number of milliseconds", e.at)
	case e.in < 1 || e.in > maxTraceInputTokens:
		return e, fmt.Errorf("input_length %d out of range [1, %d]", e.in, maxTraceInputTokens)
	case e.out < 0 || e.out > maxTraceOutput:
		return e, fmt.Errorf("output_length %d out of range [0, %d]", e.out, maxTraceOutput)
	case len(e.ids) == 0:
		return e, fmt.Errorf("hash_ids is empty")
	}
	for _, id := range e.ids {
		if id < 0 {
			return e, fmt.Errorf("negative hash id %d", id)
		}
	}
	// An output of 0 tokens cannot be streamed; ask for one.
	e.out = max(e.out, 1)
	return e, nil
}

// traceBody builds a /v1/completions body: the request's blocks
// concatenated and cut to input_length tokens. A request with fewer hash
// ids than its length needs is completed with blocks of its own (keyed by
// its line), which no other request shares.
func traceBody(cache *blockCache, e traceEntry) func(string) []byte {
	return func(model string) []byte {
		n := e.in * 4
		b := make([]byte, 0, n+len(model)+192)
		b = append(b, `{"model":`...)
		b = appendJSONString(b, model)
		b = append(b, `,"prompt":"`...)
		start := len(b)
		for _, id := range e.ids {
			if len(b)-start >= n {
				break
			}
			b = append(b, cache.get(uint64(id))...)
		}
		for pad := uint64(0); len(b)-start < n; pad++ {
			b = appendText(b, mix(0x706164, uint64(e.line), pad), blockBytes)
		}
		b = b[:start+n]
		b = append(b, '"')
		return appendTail(b, e.out)
	}
}
