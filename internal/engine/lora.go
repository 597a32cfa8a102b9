package engine

import (
	"fmt"
	"time"
)

// LoRA adapters, after vLLM v1 (vllm/v1/core/sched/scheduler.py and the
// worker's LRU adapter cache):
//
//   - A request names an adapter (Request.Adapter) or none (the base
//     model). Its prompt's blocks are salted with the adapter's name, so
//     an adapter's KV cache is never the base model's nor another
//     adapter's (vLLM puts the adapter's name among the extra keys of every
//     block hash).
//   - At most MaxLoras distinct adapters are in the running batch. A
//     waiting request whose adapter would be one too many is skipped, and
//     the scheduler goes on to the next waiting request (vLLM's
//     skipped_waiting_requests); a request held up for blocks still stops
//     admission, as before.
//   - MaxLoras adapters are resident in accelerator memory, least recently
//     used first out. A request whose adapter is not resident loads it when
//     it is admitted, evicting the least recently used resident adapter
//     that no running request uses; the step that admits it takes LoRALoad
//     longer per adapter loaded (vLLM activates a step's adapters before
//     running the model).
//
// vLLM also keeps evicted adapters in host memory (max_cpu_loras), which
// makes a reload cheaper than the first load; the model charges every load
// the same LoRALoad.

// loraSlot is one resident adapter.
type loraSlot struct {
	name    string
	running int           // running requests that use it
	used    time.Duration // when a request last started to use it
}

// LoRAInfo is what vLLM's vllm:lora_requests_info gauge reports: the
// distinct adapters of the running and of the waiting requests, each in
// the order of their first request, and the cap on adapters in a batch.
type LoRAInfo struct {
	Running, Waiting []string
	MaxLoras         int
}

// WithLoRA returns p serving LoRA adapters, as vLLM's --enable-lora with
// --max-loras: at most maxLoras adapters in a batch and resident, each load
// taking load (0 keeps the preset's LoRALoad).
func (p Preset) WithLoRA(maxLoras int, load time.Duration) (Preset, error) {
	if maxLoras < 0 {
		return Preset{}, fmt.Errorf("max-loras must be at least 0, got %d", maxLoras)
	}
	if load < 0 {
		return Preset{}, fmt.Errorf("lora load time must not be negative, got %v", load)
	}
	p.MaxLoras = maxLoras
	if load > 0 {
		p.LoRALoad = load
	}
	return p, nil
}

// loraAdmits reports whether r's adapter may join the running batch.
func (e *Engine) loraAdmits(r *Request) bool {
	if r.Adapter == "" {
		return true
	}
	active := 0
	for i := range e.loras {
		s := &e.loras[i]
		if s.running > 0 {
			if s.name == r.Adapter {
				return true
			}
			active++
		}
	}
	return active < e.p.MaxLoras
}

// loraStart makes r's adapter resident (loading it, and evicting the least
// recently used idle one when every slot is taken) and counts r among its
// running requests. loraAdmits has said yes.
func (e *Engine) loraStart(r *Request, now time.Duration) {
	if r.Adapter == "" || r.loraHeld {
		return
	}
	r.loraHeld = true
	i := e.loraSlotOf(r.Adapter)
	if i < 0 {
		if len(e.loras) < e.p.MaxLoras {
			e.loras = append(e.loras, loraSlot{name: r.Adapter})
			i = len(e.loras) - 1
		} else {
			i = -1
			for j := range e.loras {
				if e.loras[j].running == 0 && (i < 0 || e.loras[j].used < e.loras[i].used) {
					i = j
				}
			}
			e.loras[i] = loraSlot{name: r.Adapter}
		}
		e.stepLoads++
		e.stats.LoRALoads++
	}
	e.loras[i].running++
	e.loras[i].used = now
}

// loraStop drops r from its adapter's running requests.
func (e *Engine) loraStop(r *Request) {
	if !r.loraHeld {
		return
	}
	r.loraHeld = false
	if i := e.loraSlotOf(r.Adapter); i >= 0 {
		e.loras[i].running--
	}
}

func (e *Engine) loraSlotOf(name string) int {
	for i := range e.loras {
		if e.loras[i].name == name {
			return i
		}
	}
	return -1
}

// Resident returns the adapters loaded in accelerator memory, least
// recently used first.
func (e *Engine) Resident() []string {
	out := make([]string, 0, len(e.loras))
	for _, s := range e.loras {
		out = append(out, s.name)
	}
	for i := 1; i < len(out); i++ { // a handful: insertion sort by use
		for j := i; j > 0 && e.loras[e.loraSlotOf(out[j])].used < e.loras[e.loraSlotOf(out[j-1])].used; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// LoRA returns the adapters of the running and waiting requests, as vLLM's
// vllm:lora_requests_info reports them; nil slices when the engine serves
// no adapters.
func (e *Engine) LoRA() LoRAInfo {
	info := LoRAInfo{MaxLoras: e.p.MaxLoras}
	if e.p.MaxLoras == 0 {
		return info
	}
	for _, r := range e.running {
		info.Running = appendNew(info.Running, r.Adapter)
	}
	for i := range e.waiting.len() {
		info.Waiting = appendNew(info.Waiting, e.waiting.at(i).Adapter)
	}
	for _, r := range e.remote {
		info.Waiting = appendNew(info.Waiting, r.Adapter)
	}
	return info
}

// appendNew appends name to list unless it is empty or already there.
func appendNew(list []string, name string) []string {
	if name == "" {
		return list
	}
	for _, x := range list {
		if x == name {
			return list
		}
	}
	return append(list, name)
}
