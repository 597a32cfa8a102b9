package members

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Model labels. A request's model becomes a label value of the per-backend
// families (Series), and every label value a backend carries is a series
// of each family, 54 lines of the page per model and backend: the models
// that may be labels are bounded. They are the base models: the ones the
// config names and the ones the engines list that are not LoRA adapters,
// at most MaxModelLabels over the fleet (the config's first). A request
// for an adapter is counted under its base model's label (engines list
// thousands of adapters; the router's page is not where to tell them
// apart: the engine's own lora metrics are); any other name is "other".
// Label values are sanitised (Label).
//
// The adapters the records list (their /v1/models' parents) are the
// fleet's known adapters, handed to the scheduler (Config.Adapters) each
// time a record comes or goes, so that an engine's adapters are forgotten
// with its record; at most MaxAdapters names and MaxAdapterBytes bytes
// of names and parents over the fleet, the first records' first.
const (
	// MaxModelLabels bounds the models that are label values.
	MaxModelLabels = 256
	// MaxAdapters and MaxAdapterBytes bound the fleet's known adapters.
	MaxAdapters     = 1 << 16
	MaxAdapterBytes = 8 << 20
	// maxLabelBytes bounds one label value.
	maxLabelBytes = 200
	// Other is the label of a model that is none of the above.
	Other = "other"
)

// modelLabels is one snapshot of the label of every known model name.
type modelLabels struct {
	of map[string]string
}

// ModelLabel is the label value of model for the per-backend families:
// a base model's (sanitised) name, an adapter's base model's, "" for a
// request that named none and "other" for any other name, so that
// clients and engines cannot mint series.
func (s *Set) ModelLabel(model string) string {
	if model == "" {
		return ""
	}
	if l := s.labels.Load(); l != nil {
		if v, ok := l.of[model]; ok {
			return v
		}
	}
	return Other
}

// Label sanitises a label value from outside (an engine's model name):
// control characters, invalid UTF-8 and the replacement character become
// '_', and it is cut to maxLabelBytes bytes on a character boundary.
func Label(v string) string {
	clean := func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }
	if len(v) <= maxLabelBytes && strings.IndexFunc(v, clean) < 0 {
		return v
	}
	var b strings.Builder
	for _, r := range v {
		if clean(r) {
			r = '_'
		}
		if b.Len()+utf8.RuneLen(r) > maxLabelBytes {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// baseModels are the models of m that may be labels: those its entry
// names, else those it listed that are not adapters.
func (m *Member) baseModels() []string {
	if len(m.Entry.Models) > 0 {
		return m.Entry.Models
	}
	var out []string
	for _, model := range m.B.Models {
		if _, adapter := m.adapters[model]; !adapter {
			out = append(out, model)
		}
	}
	return out
}

// refresh rebuilds the model labels and the fleet's known adapters from
// the records; the caller holds mu. Inside a batch (applyPool) it waits
// for the batch's end.
func (s *Set) refresh() {
	if s.batch {
		s.stale = true
		return
	}
	s.stale = false
	all := s.All()
	of := map[string]string{}
	for _, static := range []bool{true, false} { // configured models first
		for _, m := range all {
			if (len(m.Entry.Models) > 0) != static {
				continue
			}
			for _, model := range m.baseModels() {
				if _, ok := of[model]; !ok && len(of) < MaxModelLabels {
					of[model] = Label(model)
				}
			}
		}
	}
	adapters, size := map[string]string{}, 0
	for _, m := range all {
		for name, parent := range m.adapters {
			if _, ok := adapters[name]; ok {
				continue
			}
			if len(adapters) >= MaxAdapters || size+len(name)+len(parent) > MaxAdapterBytes {
				break
			}
			adapters[name] = parent
			size += len(name) + len(parent)
		}
	}
	for name, parent := range adapters {
		if _, base := of[name]; base {
			continue
		}
		if l, ok := of[parent]; ok {
			of[name] = l
		}
	}
	s.labels.Store(&modelLabels{of: of})
	for _, m := range all {
		m.initSeries(s.ModelLabel)
	}
	if s.c.Adapters != nil {
		s.c.Adapters(adapters)
	}
}
