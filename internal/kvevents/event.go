// Package kvevents is vLLM's KV cache event protocol (also spoken by
// SGLang): the events an engine publishes when its prefix cache stores,
// evicts or clears blocks, as the router and the engine emulator exchange
// them. Event and Batch are the decoded, encoding-neutral form: the engine
// model produces them, the wire codec and the ZMQ transport carry them, and
// the router's precise index consumes them. Every socket of the transport
// reads its peers through a guard (guard.go) that bounds what a peer can
// make it allocate and refuses what zmq4 would panic on.
package kvevents

// Kind is an event's tag in vLLM's tagged union.
type Kind uint8

const (
	// BlockStored: the engine computed and cached BlockHashes, in chain
	// order, the first one a child of Parent (when HasParent), holding
	// TokenIDs (BlockSize tokens per block).
	BlockStored Kind = iota + 1
	// BlockRemoved: the engine evicted BlockHashes.
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one KV cache event. Engine block hashes are opaque: they depend
// on the engine's hash algorithm and seed, so they are only ever compared
// with other hashes from the same engine. A hash that arrives as bytes
// (vLLM's sha256 modes) is folded to a uint64 by the decoder.
type Event struct {
	Kind        Kind
	BlockHashes []uint64
	Parent      uint64
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	LoraName    string
	Medium      string // "GPU", "CPU", ... ("" when the engine sent none)
	// ExtraKeys is BlockStored's extra_keys (vLLM: per block, the extra
	// inputs of its hash such as multimodal ids, LoRA name and cache salt),
	// one entry per block, each the entry's raw msgpack encoding (nil for a
	// block without any); nil when the engine sent none. SGLang sends none.
	// The bytes are stable for equal values from one engine, so a consumer
	// may hash them into its own block keys.
	ExtraKeys [][]byte
}

// Batch is one published message's payload: vLLM's KVEventBatch.
type Batch struct {
	TS     float64 // engine wall-clock seconds
	Events []Event
	// DPRank is the data-parallel rank, -1 when the engine sent none.
	DPRank int
}
