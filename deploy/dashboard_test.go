package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// engineMetrics are the engines' own metrics the dashboard may query,
// each with where its exact name was read. prometheus_client (Python)
// exposes a Counter named x as x_total.
var engineMetrics = map[string]string{
	// vllm-project/vllm, vllm/v1/metrics/loggers.py (PrometheusStatLogger),
	// read at commit 005a810bc40faa25b8870fbc8559c3462581eee3.
	"vllm:num_requests_running":       "vllm/v1/metrics/loggers.py: Gauge vllm:num_requests_running",
	"vllm:num_requests_waiting":       "vllm/v1/metrics/loggers.py: Gauge vllm:num_requests_waiting",
	"vllm:kv_cache_usage_perc":        "vllm/v1/metrics/loggers.py: Gauge vllm:kv_cache_usage_perc",
	"vllm:gpu_cache_usage_perc":       "vllm/v1/metrics/loggers.py: Gauge vllm:gpu_cache_usage_perc (deprecated in 0.9 for kv_cache_usage_perc)",
	"vllm:prefix_cache_queries_total": "vllm/v1/metrics/loggers.py: Counter vllm:prefix_cache_queries (tokens queried)",
	"vllm:prefix_cache_hits_total":    "vllm/v1/metrics/loggers.py: Counter vllm:prefix_cache_hits (tokens found cached)",
	"vllm:lora_requests_info":         "vllm/v1/metrics/loggers.py: Gauge vllm:lora_requests_info (labels max_lora, waiting_lora_adapters, running_lora_adapters; the value the time of the state)",
	// sgl-project/sglang, python/sglang/srt/metrics/collector.py
	// (SchedulerMetricsCollector), read at commit
	// 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538.
	"sglang:num_running_reqs": "python/sglang/srt/metrics/collector.py: Gauge sglang:num_running_reqs",
	"sglang:num_queue_reqs":   "python/sglang/srt/metrics/collector.py: Gauge sglang:num_queue_reqs",
	"sglang:token_usage":      "python/sglang/srt/metrics/collector.py: Gauge sglang:token_usage",
	"sglang:cache_hit_rate":   "python/sglang/srt/metrics/collector.py: Gauge sglang:cache_hit_rate",
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/kvroute.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/kvroute.json: %v", err)
	}
	return &d
}

// TestDashboardMetrics checks that every metric the dashboard queries
// exists: kvroute's own as a live router serves them, the engines' as
// listed in engineMetrics.
func TestDashboardMetrics(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 39 {
		t.Errorf("dashboard uid %q, title %q, schemaVersion %d: want a uid, a title and a current schema", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["backend"] != "query" || vars["instance"] != "query" || vars["model"] != "query" {
		t.Errorf("template variables %v: want datasource (datasource), instance, backend and model (query)", vars)
	}

	known := kvrouteMetrics(t)
	used := map[string][]string{} // metric -> where
	var exprs int
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs++
				names, err := metricNames(tg.Expr)
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
				}
				if len(names) == 0 {
					t.Errorf("panel %q: query %q selects no metric", p.Title, tg.Expr)
				}
				for _, n := range names {
					used[n] = append(used[n], p.Title)
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range queryVariables(t, d) {
		used[v.metric] = append(used[v.metric], "variable "+v.name)
	}
	if exprs < 20 {
		t.Errorf("only %d queries found; the dashboard lost its panels?", exprs)
	}
	for n, where := range used {
		if !known[n] && engineMetrics[n] == "" {
			t.Errorf("metric %q (used by %q) is neither one kvroute serves nor a listed engine metric", n, where)
		}
	}
	// Every kvroute family the docs promise is on the dashboard, so that
	// a new metric does not go unwatched by accident.
	for n := range known {
		if strings.HasPrefix(n, "kvroute_") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") {
			base := strings.TrimSuffix(n, "_bucket")
			if used[n] == nil && used[base+"_bucket"] == nil && used[base+"_count"] == nil {
				t.Errorf("kvroute serves %s but no panel shows it", n)
			}
		}
	}
}

// queryVariable is a dashboard variable label_values(metric{selector}, label).
type queryVariable struct{ name, metric, selector, label string }

// queryVariables are the dashboard's query variables; one that is not
// label_values fails the test.
func queryVariables(t *testing.T, d *dashboard) []queryVariable {
	t.Helper()
	var out []queryVariable
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: definition %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		out = append(out, queryVariable{name: v.Name, metric: m[1], selector: m[2], label: m[3]})
	}
	return out
}

// labelValues matches a variable's label_values(metric{selector}, label):
// the metric, its optional selector and the label.
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// TestMetricNames checks the extraction itself, so that a misspelled
// name cannot slip through it.
func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (status) (rate(kvroute_requests_total{backend=~"$backend|none"}[$__rate_interval]))`, []string{"kvroute_requests_total"}},
		{`histogram_quantile(0.9, sum by (le, backend) (rate(kvroute_ttft_secnds_bucket{backend=~"$backend"}[5m])))`, []string{"kvroute_ttft_secnds_bucket"}},
		{`sum(rate(a_total[1m])) / sum(rate(b_total[1m]))`, []string{"a_total", "b_total"}},
		{`max by (instance) (vllm:kv_cache_usage_perc) or max by (instance) (vllm:gpu_cache_usage_perc)`, []string{"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"}},
		{`x{a="{)"} offset 5m + on (job) group_left (pod) y`, []string{"x", "y"}},
		{`{__name__="z"}`, []string{"z"}},
	}
	for _, tt := range tests {
		got, err := metricNames(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %v, %v; want %v", tt.expr, got, err, tt.want)
		}
	}
	for _, bad := range []string{`rat(x[5m])`, `sum(x`, `x{a="b"`, `{__name__=~"kvroute_.*"}`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q): no error", bad)
		}
	}
}

// grafanaVars stand in for the dashboard variables a query may hold
// outside a string, so that it parses as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// metricNames parses a PromQL expression (with Prometheus's own parser,
// which also refuses an unknown function) and returns the sorted names of
// the metrics it selects. A selector must name its metric exactly: a
// regular expression over __name__ could not be checked.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	names := map[string]bool{}
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if m.Type != labels.MatchEqual {
					bad = fmt.Errorf("query %q: selector %s does not name its metric exactly", expr, vs)
				}
				name = m.Value
			}
		}
		names[name] = true
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}
