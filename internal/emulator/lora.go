package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LoRAModule is one adapter the emulated engine serves, as vLLM's
// --lora-modules names it: name=path, or the JSON form
// {"name": ..., "path": ..., "base_model_name": ...}.
type LoRAModule struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Base is the base model's name, "" for the served model.
	Base string `json:"base_model_name"`
}

// maxLoRAModule bounds one --lora-modules value.
const maxLoRAModule = 4096

// ParseLoRAModule parses one value of vLLM's --lora-modules.
func ParseLoRAModule(s string) (LoRAModule, error) {
	if len(s) > maxLoRAModule {
		return LoRAModule{}, fmt.Errorf("lora module of %d bytes, more than %d", len(s), maxLoRAModule)
	}
	var m LoRAModule
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		d := json.NewDecoder(strings.NewReader(s))
		d.DisallowUnknownFields()
		if err := d.Decode(&m); err != nil {
			return LoRAModule{}, fmt.Errorf("lora module %q: %w", s, err)
		}
		if d.More() {
			return LoRAModule{}, fmt.Errorf("lora module %q: data after the object", s)
		}
	} else {
		name, path, ok := strings.Cut(s, "=")
		if !ok {
			return LoRAModule{}, fmt.Errorf("lora module %q: want name=path or a JSON object", s)
		}
		m = LoRAModule{Name: name, Path: path}
	}
	if m.Name == "" || m.Path == "" || strings.ContainsAny(m.Name, ", \t\n") {
		return LoRAModule{}, fmt.Errorf("lora module %q: want a name (no commas or spaces) and a path", s)
	}
	return m, nil
}

// LoRAModules is a flag.Value that collects --lora-modules values.
type LoRAModules []LoRAModule

// String implements flag.Value.
func (l *LoRAModules) String() string {
	parts := make([]string, 0, len(*l))
	for _, m := range *l {
		parts = append(parts, m.Name+"="+m.Path)
	}
	return strings.Join(parts, " ")
}

// Set implements flag.Value: one module.
func (l *LoRAModules) Set(s string) error {
	m, err := ParseLoRAModule(s)
	if err != nil {
		return err
	}
	*l = append(*l, m)
	return nil
}

// checkLoRA validates the served adapters against the engine and indexes
// them by name.
func (s *Server) checkLoRA(mods []LoRAModule) error {
	if len(mods) == 0 {
		return nil
	}
	if s.preset.MaxLoras == 0 {
		return errors.New("emulator: LoRA modules on an engine without adapter slots (max-loras 0)")
	}
	s.loras = make(map[string]LoRAModule, len(mods))
	for _, m := range mods {
		if m.Base != "" && m.Base != s.model {
			return fmt.Errorf("emulator: lora module %s: base model %q is not the served %q", m.Name, m.Base, s.model)
		}
		if _, dup := s.loras[m.Name]; dup || m.Name == s.model {
			return fmt.Errorf("emulator: lora module name %q served twice", m.Name)
		}
		s.loras[m.Name] = m
	}
	return nil
}

// modelCard is one entry of vLLM's GET /v1/models (its ModelCard): an
// adapter's root is its path and its parent the base model; the base
// model's parent is null.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// modelCards lists the base model, then the adapters in flag order.
func (s *Server) modelCards(order []LoRAModule) []modelCard {
	created := s.start.Unix()
	maxLen := s.preset.MaxModelLen
	out := []modelCard{{ID: s.model, Object: "model", Created: created, OwnedBy: "vllm", Root: s.model, MaxModelLen: &maxLen}}
	for _, m := range order {
		base := s.model
		out = append(out, modelCard{ID: m.Name, Object: "model", Created: created, OwnedBy: "vllm", Root: m.Path, Parent: &base})
	}
	return out
}

// loraHistory is vLLM's vllm:lora_requests_info: a gauge with one series
// per state it has been in (max_lora, waiting_lora_adapters,
// running_lora_adapters), each set to the time it was last the state
// (set_to_current_time), so that the current state is the series of the
// largest value. vLLM keeps every series for the life of the process; the
// emulator keeps the latest maxLoRASeries, which readers of the latest
// series see alike.
type loraHistory struct {
	mu     sync.Mutex
	desc   *prometheus.Desc
	series map[[3]string]float64
}

const maxLoRASeries = 32

func newLoRAHistory() *loraHistory {
	return &loraHistory{
		desc: prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, nil),
		series: map[[3]string]float64{},
	}
}

// observe records labels as the state at now and sends every series.
func (h *loraHistory) observe(labels [3]string, now time.Time, ch chan<- prometheus.Metric) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.series[labels] = float64(now.UnixNano()) / 1e9
	for len(h.series) > maxLoRASeries {
		var oldest [3]string
		first := true
		for k, v := range h.series {
			if first || v < h.series[oldest] {
				oldest, first = k, false
			}
		}
		delete(h.series, oldest)
	}
	for k, v := range h.series {
		ch <- prometheus.MustNewConstMetric(h.desc, prometheus.GaugeValue, v, k[:]...)
	}
}
