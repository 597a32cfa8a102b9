package prefix

// AdapterSalt is the salt of a prompt's blocks under a LoRA adapter
// (adapter, "" for the base model) and a cache salt: the cache salt alone
// for the base model, else JoinSalt of both. An adapter's KV cache is never
// the base model's: vLLM puts the adapter's name among the extra keys of
// every block hash, so the same text under two adapters shares no block.
func AdapterSalt(adapter, cacheSalt string) string {
	if adapter == "" {
		return cacheSalt
	}
	return JoinSalt(adapter, cacheSalt)
}
