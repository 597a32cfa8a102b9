package report

import "time"

// PDRun is a run's prefill/decode figures on a fleet with prefill
// engines: how many requests were split, and the legs' times of those
// that were.
type PDRun struct {
	// Split is the share of completed requests sent as two legs.
	Split float64 `json:"split"`
	// Prefill is the prefill leg's time, arrival to its one token (queue
	// on the prefill engine and its prefill), in milliseconds.
	Prefill Dist `json:"prefill_ms"`
	// Transfer is the decode leg's wait on its engine until the prompt's
	// KV cache is there, in milliseconds: its admission (a step's start)
	// and the transfer of the blocks the engine did not hold.
	Transfer Dist `json:"transfer_ms"`
	// DecodeTTFT is the decode leg's time to its first token from the
	// prefill leg's end: the transfer, then its queue and first step.
	DecodeTTFT Dist `json:"decode_ttft_ms"`
}

// SummarizePD is the PDRun of completed requests, split of them split,
// with the legs' times of the split ones.
func SummarizePD(completed, split int, prefill, transfer, decode []time.Duration) *PDRun {
	pd := &PDRun{Prefill: distOf(prefill), Transfer: distOf(transfer), DecodeTTFT: distOf(decode)}
	if completed > 0 {
		pd.Split = float64(split) / float64(completed)
	}
	return pd
}

// distOf is dist of d in milliseconds.
func distOf(d []time.Duration) Dist {
	xs := make([]float64, len(d))
	for i, x := range d {
		xs[i] = ms(x)
	}
	return dist(xs)
}
