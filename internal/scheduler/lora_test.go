package scheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
)

// A request for an adapter goes to the backends of its base model, which
// list only the base model; an unknown model is still refused.
func TestAdapterServedByBase(t *testing.T) {
	f := fleet.New()
	base := f.Add("base", nil, []string{"llama"})
	f.Add("other", nil, []string{"mistral"})
	s := New(f, longestPrefix{}, Config{})
	s.SetAdapters(map[string]string{"sql-lora": "llama"})
	a, err := s.Route(&request.View{Model: "sql-lora", Prompt: "hello", PromptTokens: 2}, nil, t0)
	if err != nil {
		t.Fatalf("adapter request: %v", err)
	}
	if a.Backend != base {
		t.Errorf("routed to %s, want the base model's backend", a.Backend.Name)
	}
	a.Done(t0)
	if _, err := s.Route(&request.View{Model: "nope-lora", Prompt: "hello", PromptTokens: 2}, nil, t0); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model: %v", err)
	}
}

// An adapter's prefix is not the base model's nor another adapter's: the
// same prompt matches nothing across them, and matches under the same
// adapter. The adapter-blind policy hashes as if there were no adapters.
func TestAdapterSalt(t *testing.T) {
	prompt := strings.Repeat("a shared system prompt ", 40)
	view := func(model string) *request.View {
		return &request.View{Model: model, Prompt: prompt, PromptTokens: len(prompt) / 4}
	}
	f := fleet.New()
	f.Add("b0", nil, nil)
	s := New(f, longestPrefix{}, Config{})
	s.SetAdapters(map[string]string{"a": "llama", "b": "llama"})
	first, err := s.Route(view("a"), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	first.Done(t0)
	for _, c := range []struct {
		model   string
		matched bool
	}{{"a", true}, {"b", false}, {"llama", false}} {
		a, err := s.Route(view(c.model), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.MatchedTokens > 0; got != c.matched {
			t.Errorf("%s after a: matched %d tokens, want matched=%v", c.model, a.MatchedTokens, c.matched)
		}
		a.Done(t0)
	}
	if h, g := s.Hashes(view("a")), s.Hashes(view("llama")); h[0] == g[0] {
		t.Error("an adapter's hashes are the base model's")
	}
	s.SetPolicy(mustPolicy(t, "kvroute-lora-blind"))
	if h, g := s.Hashes(view("a")), s.Hashes(view("llama")); h[0] != g[0] {
		t.Error("the adapter-blind policy salts with the adapter")
	}
}

// kvroute's adapter stage: of two idle engines, the request goes to the
// one running its adapter, whichever the policy would rather take;
// without the stage (the adapter-blind policy) the policy's own pick
// stands.
func TestAdapterStage(t *testing.T) {
	f := fleet.New()
	b0 := f.Add("b0", nil, nil)
	b1 := f.Add("b1", nil, nil)
	b0.SetEngine(&fleet.EngineState{At: t0, LoRA: &fleet.LoRAState{Running: []string{"x", "y"}, Named: true, Max: 2, Used: 2}})
	b1.SetEngine(&fleet.EngineState{At: t0, LoRA: &fleet.LoRAState{Running: []string{"a"}, Named: true, Max: 2, Used: 1}})
	p := &fixed{i: 0}
	s := New(f, &affine{p}, Config{})
	s.SetAdapters(map[string]string{"a": "llama"})
	a, err := s.Route(&request.View{Model: "a", Prompt: "hello", PromptTokens: 2}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Backend != b1 {
		t.Errorf("routed to %s, want b1 where the adapter runs", a.Backend.Name)
	}
	// The stage decided: the reason names the adapter and the tier kept.
	if !strings.Contains(a.Reason, " adapter=a adapter_tier=loaded") {
		t.Errorf("reason %q does not name the adapter and its tier", a.Reason)
	}
	a.Done(t0)
	s.SetPolicy(p)
	a, _ = s.Route(&request.View{Model: "a", Prompt: "hello", PromptTokens: 2}, nil, t0)
	if a.Backend != b0 {
		t.Errorf("without the stage: routed to %s, want the policy's b0", a.Backend.Name)
	}
	if strings.Contains(a.Reason, "adapter") {
		t.Errorf("without the stage: reason %q names an adapter", a.Reason)
	}
	a.Done(t0)
	// Both engines run it: the stage keeps both and decided nothing.
	b0.SetEngine(&fleet.EngineState{At: t0, LoRA: &fleet.LoRAState{Running: []string{"a"}, Named: true, Max: 2, Used: 1}})
	s.SetPolicy(&affine{p})
	a, _ = s.Route(&request.View{Model: "a", Prompt: "hello", PromptTokens: 2}, nil, t0)
	if strings.Contains(a.Reason, "adapter") {
		t.Errorf("the stage kept every engine: reason %q names an adapter", a.Reason)
	}
	a.Done(t0)
}

// affine is a policy that asks for the adapter stage.
type affine struct{ *fixed }

func (*affine) AdapterAffinity() bool { return true }

func mustPolicy(t *testing.T, name string) policy.Policy {
	t.Helper()
	p, err := policy.New(name, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The filters (a split fleet's roles) come before the adapter stage: a
// decode leg for an adapter that only a prefill engine runs goes to the
// decode engine. With the stage first, it kept only the prefill engine,
// which the role filter then removed: no backend, and every adapter
// request of a split fleet was served whole.
func TestAdapterStageAfterFilters(t *testing.T) {
	f := fleet.New()
	prefill := f.Add("prefill", nil, nil)
	decode := f.Add("decode", nil, nil)
	prefill.SetEngine(&fleet.EngineState{At: t0, LoRA: &fleet.LoRAState{Running: []string{"a"}, Named: true, Max: 2, Used: 1}})
	decode.SetEngine(&fleet.EngineState{At: t0, LoRA: &fleet.LoRAState{Named: true, Max: 2}})
	s := New(f, &affine{&fixed{i: 0}}, Config{Filters: []policy.Filter{tiers{"prefill": -1}}})
	s.SetAdapters(map[string]string{"a": "llama"})
	a, err := s.Route(&request.View{Model: "a", Prompt: "hello", PromptTokens: 2}, nil, t0)
	if err != nil {
		t.Fatalf("adapter request with the adapter's engine filtered out: %v", err)
	}
	if a.Backend != decode {
		t.Errorf("routed to %s, want decode", a.Backend.Name)
	}
	a.Done(t0)
}
