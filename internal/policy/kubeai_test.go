package policy

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/request"
)

func TestKubeAIKey(t *testing.T) {
	long := strings.Repeat("é", 150)
	tests := []struct {
		name string
		v    request.View
		want string
	}{
		{"chat keys on the first user message", request.View{Kind: request.Chat, Prompt: "<|system|>\nS\n<|user|>\nhello\n", FirstUser: "hello"}, "hello"},
		{"chat without a user message keys on the prompt", request.View{Kind: request.Chat, Prompt: "<|system|>\nS\n"}, "<|system|>\nS\n"},
		{"completion keys on the prompt", request.View{Kind: request.Completion, Prompt: "abc", FirstUser: "ignored"}, "abc"},
		{"100 characters, not bytes", request.View{Kind: request.Completion, Prompt: long}, long[:200]},
	}
	for _, tc := range tests {
		if got := KubeAIKey(&tc.v); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestKubeAIStickinessAndBound(t *testing.T) {
	prefix := strings.Repeat("k", 100)
	chat := func(first, rest string) *request.View {
		return &request.View{Kind: request.Chat, FirstUser: first, Prompt: first + rest}
	}
	t.Run("same first 100 characters, same endpoint", func(t *testing.T) {
		bs := peerFleet(t, 8)
		p := NewKubeAI(Options{})
		in := peerInput(t, "", bs, nil)
		in.View = chat(prefix+"tail one", "")
		first := p.Pick(in).Index
		for _, rest := range []string{"tail two", "something else entirely", ""} {
			in.View = chat(prefix+rest, "more turns")
			if got := p.Pick(in).Index; got != first {
				t.Fatalf("key %q went to %d, want %d", rest, got, first)
			}
		}
		// Different keys spread: 64 keys over 8 endpoints reach most of them.
		seen := map[int]bool{}
		for i := range 64 {
			in.View = chat(strings.Repeat(string(rune('a'+i%26)), 1+i), "")
			seen[p.Pick(in).Index] = true
		}
		if len(seen) < 6 {
			t.Errorf("64 keys reached only %d of 8 endpoints", len(seen))
		}
	})
	t.Run("the bound moves an overloaded endpoint's keys to its successor", func(t *testing.T) {
		bs := peerFleet(t, 4)
		p := NewKubeAI(Options{})
		in := peerInput(t, "", bs, nil)
		in.View = chat(prefix, "")
		home := p.Pick(in).Index
		// load 3 of total 3 over 4 endpoints: 3+1 > 1.25*(3+1)/4.
		peerLoad(t, bs[home], 3, 1, 1, false)
		d := p.Pick(in)
		if d.Index == home {
			t.Fatalf("overloaded endpoint %d kept its key", home)
		}
		// The successor is stable, and is the first other endpoint on the
		// ring after the key's point.
		if again := p.Pick(in).Index; again != d.Index {
			t.Fatalf("successor changed: %d then %d", d.Index, again)
		}
		r := p.ring.Load()
		h := kubeAIKeyHash(in.View)
		i := kubeAIStart(r, h)
		for int(r.owner[i]) == bs[home].ID {
			i = (i + 1) % len(r.points)
		}
		if want := int(r.owner[i]); bs[d.Index].ID != want {
			t.Fatalf("moved to %d, want ring successor %d", bs[d.Index].ID, want)
		}
	})
	t.Run("when every endpoint is over the bound, the first met", func(t *testing.T) {
		bs := peerFleet(t, 4)
		p := NewKubeAI(Options{})
		in := peerInput(t, "", bs, nil)
		in.View = chat(prefix, "")
		home := p.Pick(in).Index
		for _, b := range bs { // 1 each: 1+1 > 1.25*(4+1)/4
			peerLoad(t, b, 1, 1, 1, false)
		}
		if d := p.Pick(in); d.Index != home || d.Note != "ring-overloaded" {
			t.Fatalf("pick %d (%s), want %d (ring-overloaded)", d.Index, d.Note, home)
		}
	})
	t.Run("an excluded endpoint is skipped without moving other keys", func(t *testing.T) {
		bs := peerFleet(t, 4)
		p := NewKubeAI(Options{})
		in := peerInput(t, "", bs, nil)
		homes := map[string]int{}
		for i := range 40 {
			k := strings.Repeat(string(rune('a'+i%26)), 1+i)
			in.View = chat(k, "")
			homes[k] = bs[p.Pick(in).Index].ID
		}
		rest := bs[1:]
		in.Candidates = rest
		for k, id := range homes {
			in.View = chat(k, "")
			got := rest[p.Pick(in).Index].ID
			if id != 0 && got != id {
				t.Errorf("key %q moved from %d to %d when 0 left", k, id, got)
			}
			if got == 0 {
				t.Errorf("key %q went to the excluded endpoint", k)
			}
		}
	})
}

// kubeAIKeyHash and kubeAIStart recompute the ring walk's start for tests.
func kubeAIKeyHash(v *request.View) uint64 { return kubeAIHash(KubeAIKey(v)) }

func kubeAIStart(r *kubeAIRing, h uint64) int {
	for i, p := range r.points {
		if p >= h {
			return i
		}
	}
	return 0
}

func BenchmarkKubeAIPick(b *testing.B) {
	p := NewKubeAI(Options{})
	in := peerBenchInput(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}
