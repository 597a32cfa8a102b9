package adapter

import (
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// LoRA is an engine's report of its LoRA adapters.
//
// vLLM (vllm/v1/metrics/loggers.py) exports one gauge,
// vllm:lora_requests_info, whose labels carry the state and whose value is
// the time it was set (set_to_current_time):
//
//	vllm:lora_requests_info{max_lora="4",waiting_lora_adapters="b",running_lora_adapters="a,c"} 1.7331e+09
//
// running_lora_adapters and waiting_lora_adapters are the comma-separated
// names of the adapters of the running and of the waiting requests, and
// max_lora is --max-loras. Every change of the labels adds a series and
// none is ever removed, so the current state is the series of the latest
// time, the largest value (as the Gateway API inference extension reads
// it).
//
// SGLang exports counts without names (python/sglang/srt/metrics/
// collector.py, with --enable-lora): sglang:lora_pool_slots_used and
// sglang:lora_pool_slots_total, the adapter slots of its GPU pool in use
// and in all.
type LoRA struct {
	// Running and Waiting are the adapters of the running and the waiting
	// requests, in the engine's order, without repeats or empty names;
	// both nil when the engine reports no names (Named false).
	Running, Waiting []string
	Named            bool
	// Max is the engine's cap on adapters (vLLM's max_lora, SGLang's
	// slots in all); Used is how many of them are taken (vLLM: the
	// distinct adapters running or waiting; SGLang: the slots in use).
	Max, Used int
}

// Bounds on what a LoRA report may hold: more than any engine holds,
// low enough that a hostile exporter cannot make the router keep much.
const (
	// MaxLoRAs bounds max_lora and the adapters listed (vLLM's
	// --max-loras is a handful; each adapter takes accelerator memory).
	MaxLoRAs = 256
	// MaxAdapterName bounds an adapter's name in bytes.
	MaxAdapterName = 1 << 10
)

const (
	vllmLoRAInfo   = "vllm:lora_requests_info"
	sglLoRAUsed    = "sglang:lora_pool_slots_used"
	sglLoRATotal   = "sglang:lora_pool_slots_total"
	labelMaxLoRA   = "max_lora"
	labelRunning   = "running_lora_adapters"
	labelWaitingLo = "waiting_lora_adapters"
)

// vllmLoRA reads vllm:lora_requests_info; nil when absent or unreadable.
func vllmLoRA(f *dto.MetricFamily) *LoRA {
	if f == nil || len(f.Metric) == 0 {
		return nil
	}
	latest := f.Metric[0]
	for _, m := range f.Metric[1:] {
		if value(m) > value(latest) { // NaN never wins
			latest = m
		}
	}
	// Several series may carry the latest time: llm-d's simulator sets
	// the gauge to the time in whole seconds, and the exposition orders
	// series by their labels, not by time. Their adapters are read
	// together: each was running or waiting within that second.
	var running, waiting []string
	maxLoRA := -1
	for _, m := range f.Metric {
		if m != latest && value(m) != value(latest) {
			continue
		}
		for _, lp := range m.Label {
			switch lp.GetName() {
			case labelMaxLoRA:
				maxLoRA = max(maxLoRA, atoi(lp.GetValue()))
			case labelRunning:
				running = appendAdapters(running, lp.GetValue())
			case labelWaitingLo:
				waiting = appendAdapters(waiting, lp.GetValue())
			}
		}
	}
	if maxLoRA < 0 || maxLoRA > MaxLoRAs {
		return nil
	}
	return NamedLoRA(running, waiting, maxLoRA)
}

// NamedLoRA is the report of an engine that names the adapters of its
// running and waiting requests and may hold max: an adapter slot is taken
// by each adapter running or waiting (as llm-d counts them).
func NamedLoRA(running, waiting []string, max int) *LoRA {
	l := &LoRA{Running: running, Waiting: waiting, Named: true, Max: max, Used: len(running)}
	for _, w := range waiting {
		if !contains(running, w) {
			l.Used++
		}
	}
	return l
}

// sglangLoRA reads SGLang's LoRA pool gauges; nil when absent or
// unreadable.
func sglangLoRA(fams map[string]*dto.MetricFamily) *LoRA {
	total, used := maxOf(fams[sglLoRATotal]), maxOf(fams[sglLoRAUsed])
	if !(total >= 0 && total <= MaxLoRAs && used >= 0 && used <= total) {
		return nil
	}
	return &LoRA{Max: int(total), Used: int(used)}
}

// appendAdapters adds to out the names of the comma-separated list s
// that it lacks, dropping empty names and repeats, and keeping at most
// MaxLoRAs names of at most MaxAdapterName bytes.
func appendAdapters(out []string, s string) []string {
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" || len(name) > MaxAdapterName || contains(out, name) {
			continue
		}
		if len(out) == MaxLoRAs {
			break
		}
		out = append(out, name)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// HasRunning reports whether adapter is among the running requests'.
func (l *LoRA) HasRunning(adapter string) bool { return contains(l.Running, adapter) }

// HasWaiting reports whether adapter is among the waiting requests'.
func (l *LoRA) HasWaiting(adapter string) bool { return contains(l.Waiting, adapter) }

// Free reports whether the engine can take one more adapter without
// evicting one a request uses.
func (l *LoRA) Free() bool { return l.Used < l.Max }

// WaitsForAdapterSlot reports whether the engine names a waiting adapter
// that cannot join its batch: one that no running request uses while the
// running requests' adapters already fill its cap (vLLM's scheduler passes
// such a request over and leaves it waiting). Its requests wait for an
// adapter slot, not for a sequence slot or KV cache. False when the engine
// names no adapters (SGLang's counts do not say who waits).
func (l *LoRA) WaitsForAdapterSlot() bool {
	if !l.Named || len(l.Running) < l.Max {
		return false
	}
	for _, w := range l.Waiting {
		if !contains(l.Running, w) {
			return true
		}
	}
	return false
}
