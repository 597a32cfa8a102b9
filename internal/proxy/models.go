package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// maxModelsBody bounds a backend's /v1/models answer.
const maxModelsBody = 4 << 20

// fetchModels asks one backend for its /v1/models and returns its entries
// as raw JSON (so that extensions such as vLLM's max_model_len pass
// through) with their ids.
func (s *Server) fetchModels(ctx context.Context, base *url.URL) (ids []string, raw []json.RawMessage, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Health.Timeout)
	defer cancel()
	u := *base
	u.Path += "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := s.upstream.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: status %d", u.String(), resp.StatusCode)
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", u.String(), err)
	}
	for _, m := range list.Data {
		var id struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m, &id) == nil && id.ID != "" {
			ids = append(ids, id.ID)
			raw = append(raw, m)
		}
	}
	return ids, raw, nil
}

// discoverModels returns, per configured backend, its models: the
// configured list, else (when discovery is on) what its /v1/models says,
// else nil (any model).
func (s *Server) discoverModels() [][]string {
	out := make([][]string, len(s.cfg.Backends))
	var wg sync.WaitGroup
	for i, bc := range s.cfg.Backends {
		if len(bc.Models) > 0 {
			out[i] = bc.Models
			continue
		}
		if !s.cfg.Upstream.DiscoverModels {
			continue
		}
		u, err := config.ParseBackendURL(bc.URL)
		if err != nil {
			continue
		}
		wg.Go(func() {
			ids, raw, err := s.fetchModels(context.Background(), u)
			if err != nil || len(ids) == 0 {
				s.log.Warn("model discovery failed; the backend is taken to serve any model", "backend", bc.URL, "err", err)
				return
			}
			s.noteModelLens(i, ids, raw)
			out[i] = ids
		})
	}
	wg.Wait()
	return out
}

// models answers GET /v1/models with the union of the healthy backends'
// models, deduplicated by id, in backend order. A backend that does not
// answer contributes its known model names.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		s.reject(w, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on /v1/models; use GET"})
		return
	}
	healthy := s.fleet.Snapshot().Healthy
	if len(healthy) == 0 {
		s.reject(w, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend", Message: "no healthy backend", RetryAfter: 1})
		return
	}
	type answer struct {
		ids []string
		raw []json.RawMessage
	}
	answers := make([]answer, len(healthy))
	var wg sync.WaitGroup
	for i, b := range healthy {
		wg.Go(func() {
			ids, raw, err := s.fetchModels(r.Context(), b.URL)
			if err != nil {
				s.log.Debug("models", "backend", b.Name, "err", err)
				ids, raw = knownModels(b)
			}
			answers[i] = answer{ids, raw}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	data := []json.RawMessage{}
	for _, a := range answers {
		for j, id := range a.ids {
			if !seen[id] {
				seen[id] = true
				data = append(data, a.raw[j])
			}
		}
	}
	body, err := json.Marshal(struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{"list", data})
	if err != nil {
		s.reject(w, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// knownModels renders b's configured or discovered model names as list
// entries.
func knownModels(b *fleet.Backend) ([]string, []json.RawMessage) {
	var raw []json.RawMessage
	for _, id := range b.Models {
		m, _ := json.Marshal(openai.Model{ID: id, Object: "model", OwnedBy: "kvroute"})
		raw = append(raw, m)
	}
	return b.Models, raw
}
