package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// models answers GET /v1/models with the union of the healthy backends'
// models, deduplicated by id, in backend order, kept for
// upstream.models_cache_ttl (modelCache). A backend that does not answer
// contributes its known model names.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		s.reject(w, r, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on /v1/models; use GET"})
		return
	}
	healthy := s.fleet.Snapshot().Healthy
	if len(healthy) == 0 {
		s.reject(w, r, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend", Message: "no healthy backend", RetryAfter: 1})
		return
	}
	body, err := s.modelList.get(r.Context(), healthy, s.cfg.Upstream.ModelsCacheTTL, s.fetchModels)
	if err != nil {
		s.reject(w, r, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// fetchModels asks every backend in healthy for its models and renders
// the union as the /v1/models answer.
func (s *Server) fetchModels(ctx context.Context, healthy []*fleet.Backend) ([]byte, error) {
	type answer struct {
		ids []string
		raw []json.RawMessage
	}
	answers := make([]answer, len(healthy))
	var wg sync.WaitGroup
	for i, b := range healthy {
		wg.Go(func() {
			l, err := s.set.FetchModels(ctx, b.URL)
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
	return append(body, '\n'), err
}

// modelCache keeps the last /v1/models answer for
// upstream.models_cache_ttl, so that clients polling it do not fan out to
// every backend each time. An answer is for one set of healthy backends:
// when the set changes, the next request asks again. Concurrent requests
// that find no fresh answer wait for the one that fetches it.
type modelCache struct {
	mu      sync.Mutex
	body    []byte
	at      time.Time
	healthy []int // the IDs the answer is for
}

// get returns the cached answer for healthy if it is younger than ttl,
// else fetches a new one (not kept when ctx ended during the fetch, since
// the backends then did not answer).
func (c *modelCache) get(ctx context.Context, healthy []*fleet.Backend, ttl time.Duration,
	fetch func(context.Context, []*fleet.Backend) ([]byte, error)) ([]byte, error) {
	if ttl <= 0 {
		return fetch(ctx, healthy)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.body != nil && now.Sub(c.at) < ttl && slices.EqualFunc(c.healthy, healthy, func(id int, b *fleet.Backend) bool { return id == b.ID }) {
		return c.body, nil
	}
	body, err := fetch(ctx, healthy)
	if err != nil || ctx.Err() != nil {
		return body, err
	}
	c.body, c.at, c.healthy = body, now, c.healthy[:0]
	for _, b := range healthy {
		c.healthy = append(c.healthy, b.ID)
	}
	return body, nil
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
