package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// auditCollector exports the audit of the prefix picture (prefix.Audit) at
// scrape time: per backend and policy, the routing regret counters (cached
// tokens predicted, reported by the engine and held at best by any
// candidate, the TTFT estimated and observed), and per backend the audit's
// verdicts, trust and capacity. The counters cover the requests whose
// engine reported its cached tokens; the current policy's are shown at 0
// before its first such request.
type auditCollector struct {
	f     *fleet.Fleet
	sched *scheduler.Scheduler
}

var (
	descAuditPrompt = prometheus.NewDesc("kvroute_cache_audited_prompt_tokens_total",
		"Prompt tokens (the router's estimate) of the requests whose engine reported its cached tokens: the denominator of the predicted, reported and best hit rates.", []string{"backend", "policy"}, nil)
	descAuditPredicted = prometheus.NewDesc("kvroute_cache_predicted_tokens_total",
		"Prompt tokens the router's prefix index predicted the chosen backend to hold, for the requests whose engine reported its cached tokens.", []string{"backend", "policy"}, nil)
	descAuditReported = prometheus.NewDesc("kvroute_cache_reported_tokens_total",
		"Prompt tokens the engine reported reusing from its prefix cache (usage.prompt_tokens_details.cached_tokens, llama.cpp timings), scaled to the router's token estimate.", []string{"backend", "policy"}, nil)
	descAuditBest = prometheus.NewDesc("kvroute_cache_best_tokens_total",
		"Prompt tokens the best-placed candidate held at decision time, as the index saw it: what was available elsewhere (regret is best minus predicted).", []string{"backend", "policy"}, nil)
	descAuditTTFTRequests = prometheus.NewDesc("kvroute_ttft_estimated_requests_total",
		"Streamed requests whose policy estimated a TTFT and whose TTFT was observed.", []string{"backend", "policy"}, nil)
	descAuditEstTTFT = prometheus.NewDesc("kvroute_ttft_estimated_seconds_total",
		"Sum of the policy's TTFT estimates of those requests.", []string{"backend", "policy"}, nil)
	descAuditTTFT = prometheus.NewDesc("kvroute_ttft_observed_seconds_total",
		"Sum of the observed TTFTs of those requests.", []string{"backend", "policy"}, nil)
	descAuditActions = prometheus.NewDesc("kvroute_prefix_audit_actions_total",
		"Verdicts of the prefix audit on the backend's picture: forget (its blocks dropped), shrink and grow (its capacity in the index), untrust and trust (its matches counted as 0, or again).", []string{"backend", "action"}, nil)
	descAuditTrusted = prometheus.NewDesc("kvroute_prefix_trusted",
		"1 while the backend's prefix picture is trusted, 0 while the audit counts its matches as 0.", []string{"backend"}, nil)
	descAuditCapacity = prometheus.NewDesc("kvroute_prefix_capacity_blocks",
		"The backend's capacity in the prefix index, in blocks: its KV cache's size, or less where the audit shrank it.", []string{"backend"}, nil)
)

func (c *auditCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAuditPrompt, descAuditPredicted, descAuditReported, descAuditBest,
		descAuditTTFTRequests, descAuditEstTTFT, descAuditTTFT, descAuditActions, descAuditTrusted, descAuditCapacity} {
		ch <- d
	}
}

func (c *auditCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	audit, current := c.sched.Audit(), c.sched.Policy().Name()
	for _, b := range fleet.Named(c.f.Snapshot().All) {
		a := audit.Backend(b.ID)
		if _, ok := a.Totals[current]; !ok {
			a.Totals[current] = prefix.Totals{}
		}
		for pol, t := range a.Totals {
			counter(descAuditPrompt, float64(t.Prompt), b.Name, pol)
			counter(descAuditPredicted, float64(t.Predicted), b.Name, pol)
			counter(descAuditReported, float64(t.Reported), b.Name, pol)
			counter(descAuditBest, float64(t.Best), b.Name, pol)
			counter(descAuditTTFTRequests, float64(t.TTFTRequests), b.Name, pol)
			counter(descAuditEstTTFT, t.EstTTFTSeconds, b.Name, pol)
			counter(descAuditTTFT, t.TTFTSeconds, b.Name, pol)
		}
		for _, v := range prefix.Verdicts {
			counter(descAuditActions, float64(a.Actions[v.String()]), b.Name, v.String())
		}
		trusted := 1.0
		if a.Untrusted {
			trusted = 0
		}
		ch <- prometheus.MustNewConstMetric(descAuditTrusted, prometheus.GaugeValue, trusted, b.Name)
		ch <- prometheus.MustNewConstMetric(descAuditCapacity, prometheus.GaugeValue, float64(a.Capacity), b.Name)
	}
}
