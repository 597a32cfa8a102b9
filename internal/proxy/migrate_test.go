package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// clientStream is what a client read of a chat stream: its chunks' ids,
// role chunks, text, finish, usage, [DONE]s and error events.
type clientStream struct {
	ids         map[string]bool
	roles       int
	text        string
	tokens      int
	finish      string
	usage       *openai.Usage
	dones, errs int
	backend     string
	readErr     error
	lastEvent   string
}

// readClientStream reads resp's stream; after calls at, if set, once
// the client has read n token chunks.
func readClientStream(t *testing.T, resp *http.Response, n int, at func()) clientStream {
	t.Helper()
	cs := clientStream{ids: map[string]bool{}, backend: resp.Header.Get(headerBackend)}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		cs.lastEvent = data
		switch {
		case data == "[DONE]":
			cs.dones++
			continue
		case strings.HasPrefix(data, `{"error"`):
			cs.errs++
			continue
		}
		var c openai.Response
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		cs.ids[fmt.Sprint(c.ID, "/", c.Created)] = true
		if c.Usage != nil {
			cs.usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Delta == nil {
				continue
			}
			if ch.Delta.Role != "" {
				cs.roles++
			}
			if ch.Delta.Content != "" {
				cs.text += ch.Delta.Content
				cs.tokens++
				if cs.tokens == n && at != nil {
					at()
				}
			}
			if ch.FinishReason != nil {
				cs.finish = *ch.FinishReason
			}
		}
	}
	cs.readErr = sc.Err()
	return cs
}

// streamFrom posts body to url's chat endpoint and reads the stream.
func streamFrom(t *testing.T, client *http.Client, url, body string, n int, at func()) clientStream {
	t.Helper()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return readClientStream(t, resp, n, at)
}

// TestMoveKilledEngine kills the engine a stream is reading from after
// its client has a few tokens: the client reads one whole stream, with
// no error, one id, one role chunk, one [DONE], the usage of one engine,
// and the very text the same request gets uninterrupted. With migration
// off the same kill cuts the stream with the error event (the behaviour
// before streams moved).
func TestMoveKilledEngine(t *testing.T) {
	const prompt = "tell me a long story about routers"
	body := `{"model":"shared","stream":true,"max_tokens":80,"ignore_eos":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("migration=", on), func(t *testing.T) {
			r, ems := newEmuRig(t, 2, 2, func(c *config.Config) {
				c.Health.Cooldown, c.Health.MaxCooldown = time.Minute, time.Minute
				if !on {
					c.Migration.MaxAttempts = 0
				}
			})
			byName := map[string]*emuBackend{}
			for _, e := range ems {
				byName[e.name] = e
			}
			resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			victim := byName[resp.Header.Get(headerBackend)]
			if victim == nil {
				t.Fatalf("answered by %q", resp.Header.Get(headerBackend))
			}
			cut := readClientStream(t, resp, 3, victim.kill)
			var survivor *emuBackend
			for _, e := range ems {
				if e != victim {
					survivor = e
				}
			}
			whole := streamFrom(t, http.DefaultClient, survivor.srv.URL, body, 0, nil)
			if whole.tokens != 80 || whole.dones != 1 {
				t.Fatalf("uninterrupted: %d tokens, %d [DONE]", whole.tokens, whole.dones)
			}
			moves := counterValue(r.srv.metrics.mig.moves)
			if !on {
				if cut.errs != 1 || cut.dones != 0 || moves != 0 {
					t.Fatalf("without migration: %d error events, %d [DONE], %v moves; want the error event", cut.errs, cut.dones, moves)
				}
				return
			}
			if cut.readErr != nil || cut.errs != 0 || cut.dones != 1 || cut.roles != 1 || len(cut.ids) != 1 {
				t.Fatalf("moved stream: read error %v, %d error events (%s), %d [DONE], %d role chunks, ids %v", cut.readErr, cut.errs, cut.lastEvent, cut.dones, cut.roles, cut.ids)
			}
			if cut.text != whole.text || cut.finish != whole.finish {
				t.Fatalf("moved stream's text\n%q (%s)\nuninterrupted\n%q (%s)", cut.text, cut.finish, whole.text, whole.finish)
			}
			if cut.usage == nil || cut.usage.CompletionTokens != 80 || cut.usage.PromptTokens != whole.usage.PromptTokens ||
				cut.usage.TotalTokens != whole.usage.TotalTokens {
				t.Fatalf("moved stream's usage %+v, uninterrupted %+v", cut.usage, whole.usage)
			}
			if moves != 1 || counterValue(r.srv.metrics.mig.prefill) <= 0 {
				t.Fatalf("%v moves counted, %v prefill tokens", moves, counterValue(r.srv.metrics.mig.prefill))
			}
		})
	}
}

// TestMoveDrainedStream drains the engine a stream reads from: once
// fleet.drain_grace has passed the stream moves to the other engine, and
// its client reads the uninterrupted text, whole; the drained engine is
// not held to have failed.
func TestMoveDrainedStream(t *testing.T) {
	const body = `{"model":"shared","stream":true,"max_tokens":80,"ignore_eos":true,"messages":[{"role":"user","content":"a story for a drain"}]}`
	r, ems := newEmuRig(t, 2, 2, func(c *config.Config) { c.Fleet.DrainGrace = 20 * time.Millisecond })
	resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	name := resp.Header.Get(headerBackend)
	drained := r.backendByName(name)
	got := readClientStream(t, resp, 3, func() { r.srv.Fleet().Drain(drained, time.Now()) })
	other := ems[0]
	if other.name == name {
		other = ems[1]
	}
	whole := streamFrom(t, http.DefaultClient, other.srv.URL, body, 0, nil)
	if got.errs != 0 || got.dones != 1 || got.roles != 1 || len(got.ids) != 1 || got.text != whole.text {
		t.Fatalf("drained stream: %d errors, %d [DONE], %d roles, ids %v\n%q\nuninterrupted\n%q", got.errs, got.dones, got.roles, got.ids, got.text, whole.text)
	}
	if n := counterValue(r.srv.metrics.mig.moves.WithLabelValues("drain", "moved")); n != 1 {
		t.Fatalf("%v drain moves counted", n)
	}
	if !drained.Healthy() {
		t.Fatal("the drained engine was judged to have failed")
	}
}

// TestMoveDrainedTwice: a rolling restart drains the engine a stream was
// moved to after the engine it came from is back: the stream goes back
// to the first engine, which it was drained from and did not fail on.
// Before, a drained engine counted among those the request failed on, and
// the second move found nowhere to go: the error event, the answer cut.
func TestMoveDrainedTwice(t *testing.T) {
	const body = `{"model":"shared","stream":true,"max_tokens":400,"ignore_eos":true,"messages":[{"role":"user","content":"a story for two drains"}]}`
	r, _ := newEmuRig(t, 2, 2, func(c *config.Config) { c.Fleet.DrainGrace = 20 * time.Millisecond })
	resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := r.backendByName(resp.Header.Get(headerBackend))
	var second *fleet.Backend
	for _, b := range r.srv.Fleet().Snapshot().All {
		if b != first {
			second = b
		}
	}
	moved := r.srv.metrics.mig.moves.WithLabelValues("drain", "moved")
	restarted := make(chan struct{})
	got := readClientStream(t, resp, 3, func() {
		r.srv.Fleet().Drain(first, time.Now())
		go func() {
			defer close(restarted)
			for counterValue(moved) < 1 { // the stream is on the second engine
				time.Sleep(time.Millisecond)
			}
			r.srv.Fleet().Undrain(first)
			r.srv.Fleet().Drain(second, time.Now())
		}()
	})
	<-restarted
	if got.errs != 0 || got.dones != 1 || got.roles != 1 || len(got.ids) != 1 || got.tokens != 400 {
		t.Fatalf("stream drained twice: %d error events (%s), %d [DONE], %d roles, ids %v, %d tokens", got.errs, got.lastEvent, got.dones, got.roles, got.ids, got.tokens)
	}
	if n := counterValue(moved); n != 2 {
		t.Fatalf("%v drain moves counted, want 2", n)
	}
}
