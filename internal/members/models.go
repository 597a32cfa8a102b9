package members

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// maxModelsBody bounds a backend's /v1/models answer.
const maxModelsBody = 4 << 20

// ModelList is a backend's /v1/models answer.
type ModelList struct {
	// IDs are the models' ids, and Raw their entries as the backend sent
	// them (so that extensions such as vLLM's max_model_len pass through).
	IDs []string
	Raw []json.RawMessage
	// Lens are the context lengths it reported (vLLM's and SGLang's
	// max_model_len, llama.cpp's meta.n_ctx), by model id.
	Lens map[string]int
}

// FetchModels asks the backend at base for its /v1/models, bounded by
// health.timeout.
func (s *Set) FetchModels(ctx context.Context, base *url.URL) (*ModelList, error) {
	ctx, cancel := context.WithTimeout(ctx, s.c.Health.Timeout)
	defer cancel()
	u := *base
	u.Path += "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.c.Transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", u.String(), resp.StatusCode)
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET %s: %w", u.String(), err)
	}
	l := &ModelList{Lens: map[string]int{}}
	for _, m := range list.Data {
		var e struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
			Meta        struct {
				NCtx int `json:"n_ctx"`
			} `json:"meta"`
		}
		if json.Unmarshal(m, &e) == nil && e.ID != "" {
			l.IDs = append(l.IDs, e.ID)
			l.Raw = append(l.Raw, m)
			switch {
			case e.MaxModelLen > 0:
				l.Lens[e.ID] = e.MaxModelLen
			case e.Meta.NCtx > 0: // llama.cpp
				l.Lens[e.ID] = e.Meta.NCtx
			}
		}
	}
	return l, nil
}
