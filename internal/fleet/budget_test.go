package fleet

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestHugeBudgets: budgets from clients' max_tokens near 2^63 are
// clamped, so that two such streams neither overflow the decode budget nor
// make it negative (they did: 9223372036854775805, then below zero).
func TestHugeBudgets(t *testing.T) {
	tests := []struct {
		name                   string
		prompt, uncach, budget int64
	}{
		{"max int64", 10, 10, math.MaxInt64},
		{"max int64 - 2", 10, 10, math.MaxInt64 - 2},
		{"negative", -5, -7, math.MinInt64},
		{"uncached above prompt", 10, math.MaxInt64, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, b := newBackend(t)
			a := b.Start(tt.prompt, tt.uncach, tt.budget, t0)
			c := b.Start(tt.prompt, tt.uncach, tt.budget, t0)
			a.FirstByte(t0)
			c.FirstByte(t0)
			l := b.Load()
			if l.DecodeBudget < 0 || l.DecodeBudget > 2*MaxTicketTokens || l.DecodeTokens < 0 || l.PendingPrefill < 0 {
				t.Errorf("two streams: %+v, want counters within [0, 2 x %d]", l, MaxTicketTokens)
			}
			a.Done(t0)
			c.Done(t0)
			assertZero(t, b)
		})
	}
}

// FuzzTicketCounters is the accounting's property: whatever the numbers a
// client sent and whatever order tickets start, see their first byte and
// end in, a backend's counters stay within [0, the sum of what the
// tickets may hold] and return to zero when every ticket is done.
func FuzzTicketCounters(f *testing.F) {
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 0, 2, 0})
	f.Add([]byte{0, 0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 0, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		_, b := newBackend(t)
		var all []*Ticket
		for len(ops) > 0 {
			op := ops[0] % 3
			ops = ops[1:]
			switch {
			case op == 0:
				var n [3]int64
				for i := range n {
					if len(ops) >= 8 {
						n[i] = int64(binary.LittleEndian.Uint64(ops))
						ops = ops[8:]
					}
				}
				tk := b.Start(n[0], n[1], n[2], t0)
				all = append(all, tk)
			case len(all) > 0 && len(ops) > 0:
				tk := all[int(ops[0])%len(all)]
				ops = ops[1:]
				if op == 1 {
					tk.FirstByte(t0)
				} else {
					tk.Done(t0)
				}
			}
			bound := int64(len(all)) * MaxTicketTokens
			l := b.Load()
			for _, c := range []int64{l.PendingPrefill, l.DecodeBudget, l.DecodeTokens} {
				if c < 0 || c > bound {
					t.Fatalf("counters %+v out of [0, %d] with %d tickets", l, bound, len(all))
				}
			}
			if l.InFlight < 0 || l.Decoding < 0 || l.Decoding > l.InFlight {
				t.Fatalf("counts %+v", l)
			}
		}
		for _, tk := range all {
			tk.Done(t0)
		}
		assertZero(t, b)
	})
}
