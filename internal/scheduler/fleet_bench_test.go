package scheduler

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// BenchmarkPickFleet measures the pick's cost as the fleet grows: one
// routing decision under the kvroute policy (hash, Match, the policy's
// Pick over every candidate, acquire, account, release) over n backends,
// each holding a shared system prompt and four conversations of its own,
// with 8 of them also holding the benchmark prompt's first blocks (a
// conversation's earlier turns), as a chat fleet looks. The prompt is an
// 8,000-character chat turn (125 blocks). cpu-ns/op is the figure to
// read on a shared machine (clocktest.ReportCPU).
func BenchmarkPickFleet(b *testing.B) {
	for _, n := range []int{8, 64, 256, 1024} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			s := New(newFleet(b, n), policy.NewKVRoute(policy.Options{}), Config{})
			system := text(0, 2048)
			prompt := system + text(1, 8000-2048)
			query := prefix.Hash(nil, prompt, prefix.DefaultBlockChars)
			for k := range n {
				for c := range 4 {
					s.Index().Insert(k, prefix.Hash(nil, system+text(1000+k*10+c, 4000), prefix.DefaultBlockChars))
				}
			}
			for j := range 8 {
				s.Index().Insert(j*n/8, query[:len(query)*j/8])
			}
			cpu0 := clocktest.CPUTime()
			routeLoop(b, s, view("", prompt))
			clocktest.ReportCPU(b, cpu0)
		})
	}
}
