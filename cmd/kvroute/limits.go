package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

// limitFlags are vLLM's --max-num-seqs and --max-num-batched-tokens, which
// kvroute engine, sim and compare take alike: one definition, so that an
// emulated engine, a simulated one and a live compare's are configured the
// same way.
type limitFlags struct {
	maxNumSeqs, maxBatchedTokens int
	// maxLoras and loraLoad are vLLM's --max-loras and the time one
	// adapter's load takes (0: the preset's).
	maxLoras int
	loraLoad time.Duration
	// cpuKVBlocks is every engine's CPU tier in blocks (0: none).
	cpuKVBlocks int
}

func (l *limitFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&l.maxNumSeqs, "max-num-seqs", 0, "cap on running sequences of every engine, as vLLM's flag; 0 means the preset's")
	fs.IntVar(&l.maxBatchedTokens, "max-num-batched-tokens", 0, "token budget of one engine step (the prefill chunk) of every engine, as vLLM's flag; 0 means the preset's")
	fs.IntVar(&l.maxLoras, "max-loras", 0, "LoRA adapters every engine runs in a batch and holds at once, as vLLM's flag; 0 serves none")
	fs.DurationVar(&l.loraLoad, "lora-load-time", 0, "time one LoRA adapter's load adds to an engine step; 0 means the preset's")
	fs.IntVar(&l.cpuKVBlocks, "cpu-kv-blocks", 0, "CPU tier of every engine in blocks of 16 tokens, as vLLM's OffloadingConnector's num_cpu_blocks: GPU blocks are offloaded there and loaded back at the preset's host-to-device bandwidth; 0 means none")
}

// apply returns presets with the overrides applied (0 keeps each preset's).
func (l *limitFlags) apply(presets []engine.Preset) ([]engine.Preset, error) {
	out := make([]engine.Preset, len(presets))
	for i, p := range presets {
		q, err := p.WithLimits(l.maxNumSeqs, l.maxBatchedTokens)
		if err == nil {
			q, err = q.WithLoRA(l.maxLoras, l.loraLoad)
		}
		if err == nil {
			q, err = q.WithCPUTier(l.cpuKVBlocks)
		}
		if err != nil {
			return nil, fmt.Errorf("--%w", err)
		}
		out[i] = q
	}
	return out, nil
}

// String renders the overrides as flags, for a report's notes ("" when none).
func (l *limitFlags) String() string {
	s := ""
	if l.maxNumSeqs != 0 {
		s += fmt.Sprintf(" --max-num-seqs %d", l.maxNumSeqs)
	}
	if l.maxBatchedTokens != 0 {
		s += fmt.Sprintf(" --max-num-batched-tokens %d", l.maxBatchedTokens)
	}
	if l.maxLoras != 0 {
		s += fmt.Sprintf(" --max-loras %d", l.maxLoras)
	}
	if l.loraLoad != 0 {
		s += fmt.Sprintf(" --lora-load-time %v", l.loraLoad)
	}
	if l.cpuKVBlocks != 0 {
		s += fmt.Sprintf(" --cpu-kv-blocks %d", l.cpuKVBlocks)
	}
	return s
}

// enginePreset is the named preset with the --max-num-seqs and
// --max-num-batched-tokens overrides applied (0 keeps the preset's).
func enginePreset(name string, l limitFlags) (engine.Preset, error) {
	p, err := engine.LookupPreset(name)
	if err != nil {
		return engine.Preset{}, err
	}
	ps, err := l.apply([]engine.Preset{p})
	if err != nil {
		return engine.Preset{}, err
	}
	return ps[0], nil
}
