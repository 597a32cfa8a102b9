package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
)

// Two emulated engines serve one base model with LoRA adapters. Through
// the router, /v1/models lists the adapters with their parent, a request
// for an adapter is served under its name, and the router knows it as an
// adapter of the base model (its prefix salted with it).
func TestLoRAThroughRouter(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithLoRA(2, 0); err != nil {
		t.Fatal(err)
	}
	var backends []config.Backend
	for i, mods := range [][]emulator.LoRAModule{{{Name: "sql", Path: "/a/sql"}, {Name: "chat", Path: "/a/chat"}}, {{Name: "sql", Path: "/a/sql"}}} {
		em, err := emulator.New(emulator.Config{Preset: p, TimeScale: 50, Model: "base", LoRAModules: mods})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(em.Handler())
		t.Cleanup(func() { srv.Close(); _ = em.Close() })
		backends = append(backends, config.Backend{URL: srv.URL, Name: []string{"e0", "e1"}[i]})
	}
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "round-robin", 0, func(c *config.Config) {
		c.Backends = backends
		c.Admin.Token = "lora-admin-token-for-tests"
	})

	res := r.get("/v1/models")
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(res.body, &list); err != nil || res.status != http.StatusOK {
		t.Fatalf("/v1/models: %d %s (%v)", res.status, res.body, err)
	}
	parents := map[string]string{}
	for _, m := range list.Data {
		if m.Parent != nil {
			parents[m.ID] = *m.Parent
		}
	}
	if len(list.Data) != 3 || parents["sql"] != "base" || parents["chat"] != "base" {
		t.Errorf("/v1/models through the router: %s", res.body)
	}
	if got := r.srv.sched.Parent("chat"); got != "base" {
		t.Errorf("the router takes chat for an adapter of %q, want base", got)
	}
	// Round-robin over the candidates: e1 lists adapters, not chat, so it
	// is none.
	for range 4 {
		res := r.post("/v1/completions", `{"model":"chat","prompt":"`+strings.Repeat("hello ", 50)+`","max_tokens":2}`)
		if res.status != http.StatusOK || res.header.Get(headerBackend) != "e0" || !strings.Contains(string(res.body), `"model":"chat"`) {
			t.Fatalf("chat: status %d from %q: %s", res.status, res.header.Get(headerBackend), res.body)
		}
	}

	// /admin/backends says which adapters each engine holds, from its
	// metrics (vllm:lora_requests_info's max_lora), once the monitor has
	// read them.
	for deadline := time.Now().Add(time.Minute); ; {
		status, body := r.adminCall(http.MethodGet, "/admin/backends", "lora-admin-token-for-tests")
		var got struct {
			Backends []struct {
				Name     string
				Role     string
				Adapters *struct{ Max int }
			}
		}
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil {
			t.Fatalf("GET /admin/backends: %d %s", status, body)
		}
		ok := len(got.Backends) == 2
		for _, b := range got.Backends {
			ok = ok && b.Role == config.RoleBoth && b.Adapters != nil && b.Adapters.Max == 2
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/admin/backends never showed both engines' adapters (max 2), role both: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
