package main

import (
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
)

func TestEnginePresetFlags(t *testing.T) {
	p, err := enginePreset("h100-llama3-8b", limitFlags{maxNumSeqs: 8, maxBatchedTokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxNumSeqs != 8 || p.MaxBatchedTokens != 1024 {
		t.Errorf("--max-num-seqs 8 --max-num-batched-tokens 1024 gave %d and %d", p.MaxNumSeqs, p.MaxBatchedTokens)
	}
	for _, args := range [][]string{
		{"--max-num-seqs", "-1"},
		{"--max-num-batched-tokens", "-5"},
		{"--preset", "nope", "--max-num-seqs", "8"},
		{"--listen", "127.0.0.1:0", "--role", "middle"},
		{"--kv-transfer-latency", "-1ms"},
		{"--kv-transfer-time-per-token", "-1ns"},
	} {
		if code := runEngine(args); code != 2 {
			t.Errorf("kvroute engine %v exited %d, want 2", args, code)
		}
	}
}

// The startup line names the adapters an engine serves.
func TestLoRANames(t *testing.T) {
	for _, tc := range []struct {
		mods emulator.LoRAModules
		want string
	}{
		{nil, ""},
		{emulator.LoRAModules{{Name: "sql", Path: "/a"}}, "sql"},
		{emulator.LoRAModules{{Name: "sql", Path: "/a"}, {Name: "chat", Path: "/b", Base: "llama"}}, "sql, chat (base llama)"},
	} {
		if got := loraNames(tc.mods); got != tc.want {
			t.Errorf("loraNames(%v) = %q, want %q", tc.mods, got, tc.want)
		}
	}
}
