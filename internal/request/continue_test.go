package request

import (
	"strings"
	"testing"
)

// TestContinueFinalMessage checks the chat template's switches: a prompt
// continuing an answer is the original prompt followed by the answer's
// text, which is what lets a continued request reuse the original's
// cached prefix.
func TestContinueFinalMessage(t *testing.T) {
	const orig = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	base, e := Parse(Chat, []byte(orig), Options{})
	if e != nil {
		t.Fatal(e)
	}
	cases := []struct {
		name, body string
		prompt     string // "" when refused
		continues  int
	}{
		{"continued", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":" the and"}],"continue_final_message":true,"add_generation_prompt":false}`,
			base.Prompt + " the and", len(" the and")},
		{"continued, generation prompt unset", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"continue_final_message":true}`,
			base.Prompt + "x", 1},
		{"generation prompt null", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":null}`,
			base.Prompt, 0},
		{"no generation prompt", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
			strings.TrimSuffix(base.Prompt, generationStart), 0},
		{"final message not the assistant's", `{"model":"m","messages":[{"role":"user","content":"hi"}],"continue_final_message":true,"add_generation_prompt":false}`,
			strings.TrimSuffix(base.Prompt, generationStart), 0},
		{"continue off", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"continue_final_message":false}`,
			strings.TrimSuffix(base.Prompt, generationStart) + "<|assistant|>\nx\n" + generationStart, 0},
		{"both true", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"continue_final_message":true,"add_generation_prompt":true}`,
			"", 0},
		{"wrong type", `{"model":"m","messages":[{"role":"user","content":"hi"}],"continue_final_message":1}`, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, e := Parse(Chat, []byte(c.body), Options{})
			if c.prompt == "" {
				if e == nil || e.Status != 400 {
					t.Fatalf("got %+v, %v; want a 400", v, e)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			if v.Prompt != c.prompt || v.Continues != c.continues {
				t.Fatalf("prompt %q continues %d; want %q %d", v.Prompt, v.Continues, c.prompt, c.continues)
			}
		})
	}
	// The completions endpoint passes over the chat template's switches.
	v, e := Parse(Completion, []byte(`{"model":"m","prompt":"p","continue_final_message":true,"add_generation_prompt":true}`), Options{})
	if e != nil || v.Prompt != "p" {
		t.Fatalf("completion: %+v %v", v, e)
	}
}
