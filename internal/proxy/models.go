package proxy

import (
	"encoding/json"
	"net/http"
	"sync"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

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
			l, err := s.set.FetchModels(r.Context(), b.URL)
			if err != nil {
				s.log.Debug("models", "backend", b.Name, "err", err)
				ids, raw := knownModels(b)
				answers[i] = answer{ids, raw}
				return
			}
			answers[i] = answer{l.IDs, l.Raw}
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
