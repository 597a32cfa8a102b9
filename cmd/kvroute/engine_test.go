package main

import (
	"testing"
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
