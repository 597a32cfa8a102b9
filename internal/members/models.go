package members

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/kvroute/kvroute/internal/adapter"
)

// ModelList is a backend's /v1/models answer.
type ModelList struct {
	// IDs are the models' ids, and Raw their entries as the backend sent
	// them (so that extensions such as vLLM's max_model_len pass through).
	IDs []string
	Raw []json.RawMessage
	// Lens are the context lengths it reported (vLLM's and SGLang's
	// max_model_len, llama.cpp's meta.n_ctx), by model id.
	Lens map[string]int
	// Parents are the LoRA adapters it listed, each with its base model
	// (vLLM's "parent").
	Parents map[string]string
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
	ms, err := adapter.ParseModels(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u.String(), err)
	}
	l := &ModelList{Lens: map[string]int{}, Parents: adapter.Adapters(ms)}
	for _, m := range ms {
		l.IDs = append(l.IDs, m.ID)
		l.Raw = append(l.Raw, m.Raw)
		if m.MaxModelLen > 0 {
			l.Lens[m.ID] = m.MaxModelLen
		}
	}
	return l, nil
}
