package config

import (
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// maxLoadPerToken bounds a tier's configured load time per token: a second
// a token is no cache.
const maxLoadPerToken = time.Second

// validateTiers checks backend i's cache tier keys and puts the load times
// into its cost model's prior (a generic one when it names no preset).
func (e *Entry) validateTiers(i int, bad func(string, ...any)) {
	if e.CPUKVBlocks < 0 {
		bad("backends[%d].cpu_kv_blocks: %d must not be negative", i, e.CPUKVBlocks)
	}
	for _, k := range []struct {
		name string
		d    time.Duration
	}{{"cpu_load_time_per_token", e.CPULoadTimePerToken}, {"disk_load_time_per_token", e.DiskLoadTimePerToken}} {
		if k.d < 0 || k.d > maxLoadPerToken {
			bad("backends[%d].%s: %v must be between 0 and %v", i, k.name, k.d, maxLoadPerToken)
		}
	}
	if e.CPULoadTimePerToken <= 0 && e.DiskLoadTimePerToken <= 0 {
		return
	}
	p := costmodel.Generic()
	if e.Prior != nil {
		p = *e.Prior
	}
	if e.CPULoadTimePerToken > 0 {
		p.HostLoad = e.CPULoadTimePerToken.Seconds()
	}
	if e.DiskLoadTimePerToken > 0 {
		p.DiskLoad = e.DiskLoadTimePerToken.Seconds()
	}
	e.Prior = &p
}
