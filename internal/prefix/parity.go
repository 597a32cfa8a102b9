package prefix

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// The hash-parity check: the precise index keys an engine's blocks by the
// router's own chain over the token ids its KV events carry, and a
// request's blocks by the same chain over the token ids the router's
// tokenizer gives. Both agree only if the engine's blocks are of the
// router's block size, its tokens for a prompt are the router's, and its
// chains start where the router's start (no cache salt or LoRA the router
// does not know of). When they do not, the precise index never matches
// that engine, silently. The check sends one known prompt (ParityPrompt)
// to the engine and compares the router's keys of its tokens with the
// keys of the blocks the engine then reports storing (CheckParity).

// Parity causes, as CheckParity names them.
const (
	ParityOK        = "ok"
	ParityBlockSize = "block_size"
	ParityTokenizer = "tokenizer"
	ParitySalt      = "salt"
)

// Parity is the verdict of a hash-parity check.
type Parity struct {
	// Cause is ParityOK or the likely cause of a mismatch.
	Cause string
	// Detail says what differed, for the log.
	Detail string
}

// OK reports whether the router's keys match the engine's.
func (p Parity) OK() bool { return p.Cause == ParityOK }

// ParityPrompt is the known prompt of a check: nonce first, so that none
// of its blocks is already cached (the engine reports storing only new
// blocks), then a fixed text of several blocks.
func ParityPrompt(nonce string) string {
	var b strings.Builder
	b.WriteString("kvroute hash parity check " + nonce + ".")
	for i := range 48 {
		fmt.Fprintf(&b, " Sentence %d of the parity check says the same thing in a plain way.", i)
	}
	return b.String()
}

// CheckParity compares the router's view of the check's prompt (tokens,
// from the router's tokenizer, keyed in blocks of blockTokens under salt)
// with the BlockStored events the engine sent since the prompt was sent.
// The prompt's first block is the one stored without a parent whose
// tokens share the longest prefix with the router's. decided is false
// while no such block was seen (the events may still come).
func CheckParity(tokens []uint32, blockTokens int, salt string, events []kvevents.Event) (p Parity, decided bool) {
	var best *kvevents.Event
	bestN := 0
	for i := range events {
		ev := &events[i]
		if ev.Kind != kvevents.BlockStored || ev.HasParent {
			continue
		}
		if n := commonTokens(tokens, ev.TokenIDs); n > bestN {
			best, bestN = ev, n
		}
	}
	if best == nil || bestN == 0 {
		return Parity{}, false
	}
	if best.BlockSize != blockTokens {
		return Parity{Cause: ParityBlockSize, Detail: fmt.Sprintf("the engine stores blocks of %d tokens, the router keys blocks of %d (kv_events.block_tokens must be the engine's block size: vLLM --block-size, SGLang --page-size)",
			best.BlockSize, blockTokens)}, true
	}
	want := min(len(best.TokenIDs), len(tokens)) / blockTokens * blockTokens
	if want == 0 {
		return Parity{}, false // a prompt shorter than a block says nothing
	}
	if bestN < want {
		return Parity{Cause: ParityTokenizer, Detail: fmt.Sprintf("the engine's tokens for the check's prompt differ from the router's at token %d of %d (the router tokenizes with another tokenizer or chat template than the engine)",
			bestN, want)}, true
	}
	// The chain as the precise index derives it from the event, and as
	// it keys a request.
	engine := chainTokens(nil, rootKey(best), best.TokenIDs[:want], blockTokens)
	router := HashTokens(nil, tokens[:want], blockTokens, salt)
	for i := range engine {
		if engine[i] != router[i] {
			return Parity{Cause: ParitySalt, Detail: fmt.Sprintf("equal tokens but block %d's key differs: the engine's chain starts from another seed (a cache salt or LoRA adapter %q the router's request did not carry)",
				i, best.LoraName)}, true
		}
	}
	return Parity{Cause: ParityOK, Detail: fmt.Sprintf("%d blocks of %d tokens match", len(engine), blockTokens)}, true
}

// commonTokens is the length of a and b's common prefix.
func commonTokens(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
