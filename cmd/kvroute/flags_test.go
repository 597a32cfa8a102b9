package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFleetFlagsCheck(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		f       fleetFlags
		wantErr string
		lo, hi  time.Duration
	}{
		{name: "no workload", f: fleetFlags{}, wantErr: "--workload is required"},
		{name: "two paces", f: fleetFlags{workload: "chat", rate: 1, load: 0.5}, wantErr: "at most one"},
		{name: "negative", f: fleetFlags{workload: "chat", load: -1}, wantErr: "must not be negative"},
		{name: "window on a builtin", f: fleetFlags{workload: "chat", window: "1m-2m"}, wantErr: "applies to traces"},
		{name: "window without dash", f: fleetFlags{workload: trace, window: "10m"}, wantErr: "want START-END"},
		{name: "window backwards", f: fleetFlags{workload: trace, window: "20m-10m"}, wantErr: "end must be after start"},
		{name: "window", f: fleetFlags{workload: trace, window: "10m-20m"}, lo: 10 * time.Minute, hi: 20 * time.Minute},
		{name: "open window", f: fleetFlags{workload: trace, window: "30m-"}, lo: 30 * time.Minute},
		{name: "plain trace", f: fleetFlags{workload: trace, limit: 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.check()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("check() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			o := tc.f.options()
			if o.WindowStart != tc.lo || o.WindowEnd != tc.hi || o.Limit != tc.f.limit {
				t.Errorf("options() = window [%v, %v) limit %d, want [%v, %v) limit %d", o.WindowStart, o.WindowEnd, o.Limit, tc.lo, tc.hi, tc.f.limit)
			}
		})
	}
}
