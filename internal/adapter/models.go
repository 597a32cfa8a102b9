package adapter

import (
	"encoding/json"
	"fmt"
	"io"
)

// Model is one entry of an engine's GET /v1/models.
type Model struct {
	ID string
	// Parent is the base model of a LoRA adapter (vLLM lists each adapter
	// it serves with "parent" set to its base model's name), "" for a base
	// model.
	Parent string
	// MaxModelLen is the context length it reports (vLLM's and SGLang's
	// max_model_len, llama.cpp's meta.n_ctx), 0 when not reported.
	MaxModelLen int
	// Raw is the entry as the engine sent it, so that extensions pass
	// through a router's listing.
	Raw json.RawMessage
}

// MaxModelsBody bounds a /v1/models answer; MaxModels bounds its entries.
const (
	MaxModelsBody = 4 << 20
	MaxModels     = 1 << 14
)

// ParseModels parses an engine's GET /v1/models answer, the OpenAI list
// {"object":"list","data":[{"id":...}, ...]}, of at most MaxModelsBody
// bytes. Entries without an id, and ids or parents longer than
// MaxAdapterName bytes, are left out; a context length beyond any model's
// is not reported (0).
func ParseModels(r io.Reader) ([]Model, error) {
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r, MaxModelsBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("parse /v1/models: %w", err)
	}
	if len(list.Data) > MaxModels {
		return nil, fmt.Errorf("parse /v1/models: %d models, more than %d", len(list.Data), MaxModels)
	}
	out := make([]Model, 0, len(list.Data))
	for _, raw := range list.Data {
		var e struct {
			ID          string `json:"id"`
			Parent      string `json:"parent"`
			MaxModelLen int    `json:"max_model_len"`
			Meta        struct {
				NCtx int `json:"n_ctx"`
			} `json:"meta"`
		}
		if json.Unmarshal(raw, &e) != nil || e.ID == "" || len(e.ID) > MaxAdapterName || len(e.Parent) > MaxAdapterName || e.Parent == e.ID {
			continue
		}
		m := Model{ID: e.ID, Parent: e.Parent, Raw: raw}
		switch {
		case e.MaxModelLen > 0:
			m.MaxModelLen = e.MaxModelLen
		case e.Meta.NCtx > 0: // llama.cpp
			m.MaxModelLen = e.Meta.NCtx
		}
		m.MaxModelLen = max(boundedInt(m.MaxModelLen, MaxContextTokens), 0)
		out = append(out, m)
	}
	return out, nil
}

// Adapters returns the adapters among models, by name, with their parents.
func Adapters(models []Model) map[string]string {
	out := map[string]string{}
	for _, m := range models {
		if m.Parent != "" {
			out[m.ID] = m.Parent
		}
	}
	return out
}
