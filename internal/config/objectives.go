package config

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"
)

// Objectives are the latency objectives requests get when their headers
// set none (X-Kvroute-Slo-Ttft-Ms and X-Kvroute-Slo-Tpot-Ms, or llm-d's
// x-llm-d-slo-ttft-ms and x-llm-d-slo-tpot-ms), and their criticality.
// A request's own header wins over its API key's default, which wins over
// its model's. With nothing configured and no header, a request has no
// objective and is routed exactly as before (docs/routing.md,
// "Objectives").
type Objectives struct {
	// Models are per-model defaults.
	Models []ModelObjective `yaml:"models"`
	// Keys are per-tenant defaults, a tenant being an API key (the
	// bearer token of Authorization).
	Keys []KeyObjective `yaml:"keys"`
	// InferenceObjectives name the Gateway API InferenceObjectives a
	// request may name in x-llm-d-inference-objective, with their
	// priorities: negative is sheddable, positive critical, 0 standard.
	InferenceObjectives []InferenceObjective `yaml:"inference_objectives"`
}

// ModelObjective is one model's default objectives.
type ModelObjective struct {
	// Model is the model name as requests send it.
	Model string `yaml:"model"`
	// TTFT is the time to first token promised; 0: none.
	TTFT time.Duration `yaml:"ttft"`
	// ITL is the mean inter-token latency promised (llm-d's TPOT); 0:
	// none.
	ITL time.Duration `yaml:"itl"`
}

// KeyObjective is one API key's default objectives and criticality.
type KeyObjective struct {
	// Key is the key, or better "sha256:<64 hex digits>", its digest.
	Key  string        `yaml:"key"`
	TTFT time.Duration `yaml:"ttft"`
	ITL  time.Duration `yaml:"itl"`
	// Criticality is "critical", "standard" (the default) or "sheddable".
	Criticality string `yaml:"criticality"`
}

// InferenceObjective is one InferenceObjective's name and priority.
type InferenceObjective struct {
	Name     string `yaml:"name"`
	Priority int    `yaml:"priority"`
}

// KeyDigests returns each keys entry's digest with its entry.
func (o Objectives) KeyDigests() (map[[sha256.Size]byte]KeyObjective, error) {
	out := map[[sha256.Size]byte]KeyObjective{}
	for i, k := range o.Keys {
		where := fmt.Sprintf("objectives.keys[%d].key", i)
		d, ok, err := keyDigest(where, k.Key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: empty", where)
		}
		out[d] = k
	}
	return out, nil
}

// validate reports what is wrong with the section.
func (o Objectives) validate(bad func(format string, args ...any)) {
	for i, m := range o.Models {
		if strings.TrimSpace(m.Model) == "" {
			bad("objectives.models[%d].model: empty", i)
		}
		if m.TTFT < 0 || m.ITL < 0 {
			bad("objectives.models[%d]: ttft and itl must not be negative", i)
		}
	}
	for i, k := range o.Keys {
		if k.TTFT < 0 || k.ITL < 0 {
			bad("objectives.keys[%d]: ttft and itl must not be negative", i)
		}
		switch strings.ToLower(strings.TrimSpace(k.Criticality)) {
		case "", "critical", "standard", "sheddable":
		default:
			bad("objectives.keys[%d].criticality: %q is not critical, standard or sheddable", i, k.Criticality)
		}
	}
	if _, err := o.KeyDigests(); err != nil {
		bad("%v", err)
	}
	for i, io := range o.InferenceObjectives {
		if strings.TrimSpace(io.Name) == "" {
			bad("objectives.inference_objectives[%d].name: empty", i)
		}
		if io.Priority < -MaxPriority || io.Priority > MaxPriority {
			bad("objectives.inference_objectives[%d].priority: %d is outside [-%d, %d]", i, io.Priority, MaxPriority, MaxPriority)
		}
	}
}
