package prefix

// Remove forgets that backend holds hashes (the engine reported evicting
// them), pinned or not. Blocks it does not hold are skipped.
func (ix *Index) Remove(backend int, hashes ...uint64) {
	ix.lock()
	defer ix.unlock()
	l := ix.known(backend)
	if l == nil {
		return
	}
	for _, h := range hashes {
		if n := ix.pairs.find(ix.nodes, h, int32(backend)); n != nilNode {
			ix.drop(l, n)
		}
	}
}

// Holds reports whether backend holds the block hash.
func (ix *Index) Holds(backend int, hash uint64) bool {
	ix.mu.RLock()
	defer ix.runlock()
	return backend >= 0 && ix.pairs.find(ix.nodes, hash, int32(backend)) != nilNode
}

// Evicted returns how many blocks backend has had evicted for its
// capacity, ever (RemoveBackend and Remove are not evictions).
func (ix *Index) Evicted(backend int) uint64 {
	ix.mu.RLock()
	defer ix.runlock()
	if l := ix.known(backend); l != nil {
		return l.evicted
	}
	return 0
}

// known returns backend's list, nil if it never had one. The caller holds
// a lock.
func (ix *Index) known(backend int) *lru {
	if backend < 0 || backend >= len(ix.backends) {
		return nil
	}
	return &ix.backends[backend]
}
