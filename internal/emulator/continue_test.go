package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/migrate"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// streamText is the tokens and finish reason of a chat stream of body.
func streamText(t *testing.T, url string, body []byte) ([]string, string) {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	resp := post(t, context.Background(), url+"/v1/chat/completions", b)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var toks []string
	finish := ""
	for _, ev := range sseEvents(t, resp.Body) {
		if ev == "[DONE]" {
			continue
		}
		var c openai.Response
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Delta != nil && ch.Delta.Content != "" {
				toks = append(toks, ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return toks, finish
}

// TestContinuedAnswer: an answer continued mid-way (the router's
// continuation body: the text so far as a final assistant message with
// continue_final_message) goes on exactly as the uninterrupted answer
// did, token for token, to the same finish.
func TestContinuedAnswer(t *testing.T) {
	s, hs := newTestServer(t, 1000)
	for _, extra := range []string{``, `,"max_tokens":12`, `,"max_tokens":40`, `,"max_tokens":9,"ignore_eos":true`} {
		for _, prompt := range []string{"hello there", "a longer prompt about nothing much at all"} {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"stream":true%s}`, s.Model(), prompt, extra)
			whole, finish := streamText(t, hs.URL, []byte(body))
			v, e := request.Parse(request.Chat, []byte(body), request.Options{})
			if e != nil {
				t.Fatal(e)
			}
			// Continued after the first token, half way, before the last.
			for _, k := range []int{1, len(whole) / 2, len(whole) - 1} {
				if k < 1 {
					continue
				}
				text := ""
				for _, tok := range whole[:k] {
					text += tok
				}
				cont, err := migrate.Body(v, []byte(body), text, k)
				if err != nil {
					t.Fatal(err)
				}
				rest, f := streamText(t, hs.URL, cont)
				got := append(append([]string{}, whole[:k]...), rest...)
				if fmt.Sprint(got) != fmt.Sprint(whole) || f != finish {
					t.Fatalf("%s after %d tokens:\ncontinued %q (%s)\nwhole     %q (%s)", body, k, got, f, whole, finish)
				}
			}
		}
	}
}
