package lifecycle

import "time"

// LegTimes are a split request's timings, leg by leg: what the router saw
// of each engine's part, for the metrics (kvroute_pd_*). A timing is
// measured only when its Has flag is set.
//
//	sglang (both legs sent at once):
//	prefill leg:  sent ─────────────── answer read (ended)
//	decode leg:   sent ─────────────────────────────────── first byte
//	              └ Prefill ───────────┘└ TransferWait ────┘
//	              └ DecodeTTFT ────────────────────────────┘
//
//	vllm (the decode leg sent once the prefill leg ended):
//	prefill leg:  sent ──────── ended
//	decode leg:                      sent ───────── first byte
//	              └ Prefill ────┘└ TransferWait ───┘
//	                                 └ DecodeTTFT ─┘
type LegTimes struct {
	// Prefill is the prefill leg's time from its first sending to the end
	// of its answer, retries included: measured when the leg ended with a
	// complete 2xx answer.
	Prefill    time.Duration
	HasPrefill bool
	// TransferWait is the decode leg's first content byte less the end of
	// the prefill leg: the decode engine's wait for the prompt's KV cache
	// and its first step. Measured for a streaming request (a JSON
	// answer's first byte comes with its last) whose prefill leg ended
	// before the decode leg's first byte.
	TransferWait    time.Duration
	HasTransferWait bool
	// DecodeTTFT is the decode leg's time from its first sending to its
	// first content byte, retries included: measured for a streaming
	// request.
	DecodeTTFT    time.Duration
	HasDecodeTTFT bool
}

// markSent notes the leg's first sending (a retry keeps it).
func (l *Leg) markSent() {
	if l.sent.IsZero() {
		l.sent = time.Now()
	}
}

// Sent is when the leg was first sent; zero if it never was.
func (l *Leg) Sent() time.Time { return l.sent }

// FirstByteAt is when the leg's answering attempt had its first content
// byte; zero if it had none.
func (l *Leg) FirstByteAt() time.Time { return l.first }

// EndedAt is when an earlier leg's answer (a prefill) was read to its
// end; zero if it was not (failed, skipped, or the last leg, whose body
// the front relays).
func (l *Leg) EndedAt() time.Time { return l.ended }

// Status is the status of the leg's last response, 0 for none.
func (l *Leg) Status() int { return l.status }

// Attempts is how many times the leg was sent (0 for a leg never sent).
func (l *Leg) Attempts() int {
	if l.sent.IsZero() {
		return 0
	}
	return l.Retries + 1
}

// legTimes are r's per-leg timings, ok false for a request that is not
// split (one leg). The decode leg's timings are measured only when the
// prefill leg served (a decode engine that served the request whole, its
// prefill leg skipped, did its own prefill).
func (r *Request) legTimes() (t LegTimes, ok bool) {
	if len(r.Legs) < 2 {
		return t, false
	}
	pre, dec := &r.Legs[0], &r.Legs[len(r.Legs)-1]
	if pre.A == nil || pre.skipped {
		return t, true
	}
	if !pre.ended.IsZero() {
		t.Prefill, t.HasPrefill = pre.ended.Sub(pre.sent), true
	}
	if r.View == nil || !r.View.Stream || dec.first.IsZero() {
		return t, true
	}
	t.DecodeTTFT, t.HasDecodeTTFT = dec.first.Sub(dec.sent), true
	if t.HasPrefill && !dec.first.Before(pre.ended) {
		t.TransferWait, t.HasTransferWait = dec.first.Sub(pre.ended), true
	}
	return t, true
}
