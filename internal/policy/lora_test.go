package policy

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// loraFleet builds backends with the given in-flight counts and LoRA
// reports (nil: no report) at fxT0.
func loraFleet(inflight []int, reports []*fleet.LoRAState) []*fleet.Backend {
	f := fleet.New()
	out := make([]*fleet.Backend, len(reports))
	for i, l := range reports {
		b := f.Add(fmt.Sprintf("b%d", i), nil, nil)
		for range inflight[i] {
			b.Start(10, 10, 10, fxT0)
		}
		if l != nil {
			b.SetEngine(&fleet.EngineState{At: fxT0, LoRA: l})
		}
		out[i] = b
	}
	return out
}

func lora(max int, running, waiting []string) *fleet.LoRAState {
	used := len(running)
	for _, w := range waiting {
		if !slices.Contains(running, w) {
			used++
		}
	}
	return &fleet.LoRAState{Running: running, Waiting: waiting, Named: true, Max: max, Used: used}
}

// llm-d's lora-affinity-scorer: 1.0 running, 0.8 a free slot (running plus
// waiting adapters below max_lora), 0.6 waiting, 0 full.
func TestLoRAScore(t *testing.T) {
	for _, c := range []struct {
		l    *fleet.LoRAState
		want float64
	}{
		{lora(2, []string{"a", "b"}, nil), 1.0},
		{lora(2, []string{"b"}, nil), 0.8},
		{lora(2, []string{"b"}, []string{"c", "a"}), 0.6},
		{lora(2, []string{"b", "c"}, nil), 0},
		{lora(2, []string{"b"}, []string{"c"}), 0},
		{&fleet.LoRAState{Max: 4, Used: 3}, 0.8}, // SGLang: counts only
		{&fleet.LoRAState{Max: 4, Used: 4}, 0},
	} {
		if got := LoRAScore(c.l, "a"); got != c.want {
			t.Errorf("%+v: score %v, want %v", c.l, got, c.want)
		}
	}
}

func TestAdapterTiers(t *testing.T) {
	full := lora(2, []string{"x", "y"}, nil)
	fullQ1 := lora(2, []string{"x", "y"}, []string{"z"})
	fullQ2 := lora(2, []string{"x", "y"}, []string{"z", "w"})
	for _, c := range []struct {
		name     string
		inflight []int
		reports  []*fleet.LoRAState
		want     []int
		tier     string
	}{
		{"running first", []int{0, 0, 0}, []*fleet.LoRAState{lora(2, []string{"x"}, nil), lora(2, []string{"a"}, nil), full}, []int{1}, TierLoaded},
		{"overloaded spills to a free slot", []int{0, 20, 0}, []*fleet.LoRAState{lora(2, []string{"x"}, nil), lora(2, []string{"a"}, nil), full}, []int{0, 1}, TierFreeSlot},
		{"no report is a free slot", []int{0, 0}, []*fleet.LoRAState{nil, full}, []int{0}, TierFreeSlot},
		{"waiting over full", []int{0, 0, 0}, []*fleet.LoRAState{full, lora(2, []string{"x", "y"}, []string{"a"}), full}, []int{1}, TierWaiting},
		{"overloaded stays where it runs when all else is full", []int{0, 20, 0}, []*fleet.LoRAState{full, lora(2, []string{"a", "y"}, nil), full}, []int{1}, TierLoadedBusy},
		{"the shortest slot queue", []int{0, 0, 0}, []*fleet.LoRAState{fullQ2, fullQ1, fullQ2}, []int{1}, TierShortestQueue},
	} {
		t.Run(c.name, func(t *testing.T) {
			cands := loraFleet(c.inflight, c.reports)
			var got []int
			kept, tier := AdapterTiers(slices.Clone(cands), "a", fxT0, nil)
			for _, b := range kept {
				got = append(got, b.ID)
			}
			if !slices.Equal(got, c.want) || tier != c.tier {
				t.Errorf("kept %v (tier %q), want %v (tier %q)", got, tier, c.want, c.tier)
			}
		})
	}
	// A stale report counts as none.
	cands := loraFleet([]int{0, 0}, []*fleet.LoRAState{full, lora(2, []string{"a"}, nil)})
	if got, _ := AdapterTiers(slices.Clone(cands), "a", fxT0.Add(EngineStateMaxAge+time.Second), nil); len(got) != 2 {
		t.Errorf("stale reports: kept %d of 2", len(got))
	}
}

// llmd-lora adds the scorer to llm-d's picker: between two engines alike
// in all else it takes the one running the adapter; llmd-default does not
// see adapters.
func TestLLMDLoRA(t *testing.T) {
	reports := []*fleet.LoRAState{lora(2, []string{"x", "y"}, nil), lora(2, []string{"a", "y"}, nil)}
	for _, c := range []struct {
		policy string
		want   map[int]bool
	}{{"llmd-lora", map[int]bool{1: true}}, {"llmd-default", map[int]bool{0: true, 1: true}}} {
		p := fxNew(t, c.policy, Options{Seed: 1})
		seen := map[int]bool{}
		for range 32 {
			cands := loraFleet([]int{0, 0}, reports)
			in := &Input{View: &request.View{Model: "a", Prompt: "p"}, BlockChars: 64, Candidates: cands, Matched: make([]int32, 2), Now: fxT0}
			seen[p.Pick(in).Index] = true
		}
		if len(seen) != len(c.want) {
			t.Errorf("%s picked %v, want %v", c.policy, seen, c.want)
		}
	}
}

func TestAdapterInterfaces(t *testing.T) {
	if _, ok := fxNew(t, "kvroute", Options{}).(AdapterAffinity); !ok {
		t.Error("kvroute has no adapter stage")
	}
	blind := fxNew(t, "kvroute-lora-blind", Options{})
	if _, ok := blind.(AdapterAffinity); ok {
		t.Error("the adapter-blind kvroute asks for the adapter stage")
	}
	if _, ok := blind.(AdapterBlind); !ok {
		t.Error("the adapter-blind kvroute is not AdapterBlind")
	}
	if _, ok := blind.(SessionLearner); !ok {
		t.Error("the adapter-blind kvroute lost kvroute's session table")
	}
}

// The adapters the router sent an engine last count as loaded there,
// whatever its batch holds at the scrape: an idle engine that served "a"
// last is where "a" goes, and one whose max_lora adapters are taken by
// others' recent requests has no free slot.
func TestAdapterTiersResident(t *testing.T) {
	idle := func() *fleet.LoRAState { return lora(2, nil, nil) }
	for _, c := range []struct {
		name     string
		resident [][]string
		want     []int
	}{
		{"no picture: every idle engine is a free slot", nil, []int{0, 1, 2}},
		{"served last", [][]string{{"x", "y"}, {"a"}, nil}, []int{1}},
		{"beyond max_lora it is evicted", [][]string{{"x", "y", "a"}, {"x"}, {"x", "y"}}, []int{1}},
		{"residents fill the slots", [][]string{{"x", "y"}, {"x", "z"}, {"w"}}, []int{2}},
		{"else an idle adapter is evicted", [][]string{{"x", "y"}, {"x", "z"}, {"w", "v"}}, []int{0, 1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cands := loraFleet([]int{0, 0, 0}, []*fleet.LoRAState{idle(), idle(), idle()})
			var resident func(b *fleet.Backend) []string
			if c.resident != nil {
				resident = func(b *fleet.Backend) []string { return c.resident[b.ID] }
			}
			var got []int
			kept, _ := AdapterTiers(slices.Clone(cands), "a", fxT0, resident)
			for _, b := range kept {
				got = append(got, b.ID)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("kept %v, want %v", got, c.want)
			}
		})
	}
}
