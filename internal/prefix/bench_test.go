package prefix

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
)

// promptText returns n characters unique to seed.
func promptText(seed, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		fmt.Fprintf(&sb, "turn %d of conversation %d says something. ", sb.Len(), seed)
	}
	return sb.String()[:n]
}

const benchChars = 32000 // 500 blocks of 64

func BenchmarkHash(b *testing.B) {
	text := promptText(1, benchChars)
	dst := make([]uint64, 0, benchChars/DefaultBlockChars)
	b.SetBytes(benchChars)
	b.ReportAllocs()
	for b.Loop() {
		dst = Hash(dst[:0], text, DefaultBlockChars)
	}
}

// benchIndex builds a 64-backend index in which every backend holds a
// shared 2,048-character system prompt plus its own conversations, and
// backend k also holds the query's first 7k blocks (so the query's match
// fans out across the fleet and dies out gradually, the expensive shape for
// Match). allHold puts the whole query on every backend: the worst case.
func benchIndex(b *testing.B, allHold bool) (*Index, []uint64) {
	b.Helper()
	const backends = 64
	system := promptText(0, 2048)
	query := Hash(nil, system+promptText(1, benchChars-2048), DefaultBlockChars)
	ix := NewIndex(DefaultCapacity)
	for k := range backends {
		for c := range 20 {
			ix.Insert(k, Hash(nil, system+promptText(1000+k*100+c, 16000), DefaultBlockChars))
		}
		n := min(len(query), 7*k)
		if allHold {
			n = len(query)
		}
		ix.Insert(k, query[:n])
	}
	return ix, query
}

func BenchmarkMatch(b *testing.B) {
	for _, bc := range []struct {
		name    string
		allHold bool
	}{{"fanout", false}, {"allhold", true}} {
		b.Run(bc.name, func(b *testing.B) {
			ix, query := benchIndex(b, bc.allHold)
			out := make([]int32, 64)
			b.ReportAllocs()
			for b.Loop() {
				ix.Match(query, out)
			}
			if bc.allHold && out[63] != int32(len(query)) {
				b.Fatalf("backend 63 matched %d of %d", out[63], len(query))
			}
		})
	}
}

// BenchmarkInsert measures inserting a routed 500-block prompt whose first
// 32 blocks the backend already holds, at steady state (evicting as much as
// it inserts).
func BenchmarkInsert(b *testing.B) {
	system := promptText(0, 2048)
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = Hash(nil, system+promptText(i+1, benchChars-2048), DefaultBlockChars)
	}
	ix := NewIndex(8 * 500)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ix.Insert(i%4, prompts[i%len(prompts)])
		i++
	}
}

// BenchmarkMemory reports the index's memory per (block, backend) pair held,
// from the heap in use before and after filling it with 1M blocks spread
// over 64 backends in 500-block prompts that share a 32-block system prompt.
func BenchmarkMemory(b *testing.B) {
	const total = 1 << 20
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		ix := NewIndex(total)
		var h []uint64
		held := 0
		for p := 0; held < total; p++ {
			h = h[:0]
			for i := range 500 {
				if i < 32 {
					h = append(h, uint64(i+1)) // the shared system prompt
				} else {
					h = append(h, uint64(p)<<20|uint64(i)|1<<60)
				}
			}
			had := ix.Len(p % 64)
			ix.Insert(p%64, h)
			held += ix.Len(p%64) - had
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(held), "B/block")
		runtime.KeepAlive(ix)
		b.StartTimer()
	}
}

// BenchmarkInsertShared measures re-inserting a 500-block prompt that all
// 64 backends hold, for the backend inserted first (the last one on every
// block's holder list) and the one inserted last (the first).
func BenchmarkInsertShared(b *testing.B) {
	for _, bc := range []struct {
		name    string
		backend int
	}{{"first-holder", 63}, {"last-holder", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			ix, query := benchIndex(b, true)
			b.ReportAllocs()
			for b.Loop() {
				ix.Insert(bc.backend, query)
			}
		})
	}
}

// BenchmarkMatchFleet measures Match over a fleet of n backends in which
// the 8 backends with the highest IDs hold the same blocks (a shared system
// prompt, then the query's first 0, 1/8, ... 7/8), and the others a shared
// prefix of their own: the cost of the fleet's size alone, lock-free at
// every size. ids=120-127 is the 128-slot fleet whose 8 live backends
// took IDs 120-127 after churn.
func BenchmarkMatchFleet(b *testing.B) {
	for _, n := range []int{8, 64, 128, 256, 1024} {
		name := fmt.Sprintf("backends=%d", n)
		if n == 128 {
			name = "ids=120-127"
		}
		b.Run(name, func(b *testing.B) {
			ix := NewIndex(DefaultCapacity)
			system := promptText(0, 2048)
			query := Hash(nil, system+promptText(1, benchChars-2048), DefaultBlockChars)
			other := Hash(nil, promptText(2, 4096), DefaultBlockChars)
			for k := range n - 8 {
				ix.Insert(k, other)
			}
			for j := range 8 {
				ix.Insert(n-8+j, query[:32+(len(query)-32)*j/8])
			}
			out := make([]int32, n)
			b.ReportAllocs()
			cpu0 := clocktest.CPUTime()
			for b.Loop() {
				ix.Match(query, out)
			}
			clocktest.ReportCPU(b, cpu0)
		})
	}
}

// BenchmarkInsertAtCapacity measures inserting the picker's requests into
// an index already at its capacity, as a long-running router's is: 8
// backends of DefaultCapacity blocks, each insert a new request on the
// next backend (one of 8 system prompts, then blocks of its own), so that
// every insert evicts about as many blocks as it adds. Warmed up until
// every backend has turned over its capacity twice, it reports, besides
// ns/op, the distribution of single inserts: the mean, p50, p99 and the
// slowest (an insert that finds the block map due for a rebuild pays for
// it); with cpu-, the same of the inserting thread's CPU time, which a
// shared machine's waits for a CPU leave out. body=220KB is the picker's large request (3,520 blocks of 64
// characters), body=4KB a chat turn (64). docs/benchmarks.md, "The
// Endpoint Picker".
func BenchmarkInsertAtCapacity(b *testing.B) {
	for _, bc := range []struct {
		name   string
		blocks int
	}{{"body=220KB", 220 << 10 / DefaultBlockChars}, {"body=4KB", 4 << 10 / DefaultBlockChars}} {
		b.Run(bc.name, func(b *testing.B) {
			const backends, system = 8, 16
			ix := NewIndex(DefaultCapacity)
			h := make([]uint64, bc.blocks)
			req := 0
			next := func() {
				for i := range h {
					if i < system {
						h[i] = Mix64(uint64(req%8)<<32 | uint64(i))
					} else {
						h[i] = Mix64(uint64(req+8)<<32 | uint64(i))
					}
				}
				ix.Insert(req%backends, h)
				req++
			}
			for req*(bc.blocks-system) < 2*backends*DefaultCapacity {
				next()
			}
			// Per insert, wall time and the thread's CPU time (the same
			// without the waits for a CPU of a shared machine).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			wall, cpu := make([]time.Duration, 0, 1<<16), make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0, c0 := time.Now(), threadCPU()
				next()
				cpu = append(cpu, threadCPU()-c0)
				wall = append(wall, time.Since(t0))
			}
			b.StopTimer()
			reportLatency(b, "", wall)
			if cpu[0] != 0 || cpu[len(cpu)-1] != 0 {
				reportLatency(b, "cpu-", cpu)
			}
		})
	}
}

// reportLatency reports the mean, p50, p99 and max of lat in µs, their
// names prefixed by prefix.
func reportLatency(b *testing.B, prefix string, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(sum)/float64(len(lat)), prefix+"mean-µs")
	b.ReportMetric(us(lat[len(lat)/2]), prefix+"p50-µs")
	b.ReportMetric(us(lat[len(lat)*99/100]), prefix+"p99-µs")
	b.ReportMetric(us(lat[len(lat)-1]), prefix+"max-µs")
}
