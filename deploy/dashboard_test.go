package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
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
	if vars["datasource"] != "datasource" || vars["backend"] != "query" {
		t.Errorf("template variables %v: want datasource (datasource) and backend (query)", vars)
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
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`).FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: definition %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		used[m[1]] = append(used[m[1]], "variable "+v.Name)
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

// TestMetricNames checks the expression tokenizer itself, so that a
// misspelled name cannot slip through it.
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
		{`sum(kvroute_backend_healthy) without (backend) > bool 0`, []string{"kvroute_backend_healthy"}},
	}
	for _, tt := range tests {
		got, err := metricNames(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %v, %v; want %v", tt.expr, got, err, tt.want)
		}
	}
	for _, bad := range []string{`rat(x[5m])`, `sum(x`, `x{a="b"`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q): no error", bad)
		}
	}
}

// promqlFuncs are PromQL's functions and aggregation operators: an
// identifier followed by "(" must be one of them.
var promqlFuncs = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year days_in_month
		delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
		histogram_sum holt_winters double_exponential_smoothing hour idelta increase irate label_join label_replace ln log2 log10
		minute month predict_linear rate resets round scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp
		vector year avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time
		stdvar_over_time last_over_time present_over_time mad_over_time acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh
		deg pi rad`) {
		promqlFuncs[f] = true
	}
}

// metricNames returns the sorted metric names a PromQL expression
// selects. It is a small tokenizer, not a parser: it skips strings, label
// matchers ({...}), ranges ([...]), numbers, Grafana variables and the
// label lists of by/without/on/ignoring/group_left/group_right, and takes
// every other identifier as a function or aggregation (one of
// promqlFuncs; any other identifier before "(" is an error), a keyword, or
// a metric name.
func metricNames(expr string) ([]string, error) {
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && strings.IndexByte(" \t\r\n", expr[i]) >= 0 {
			i++
		}
		return i
	}
	// closeAt returns the index after the bracket closing the one at i,
	// skipping strings inside.
	closeAt := func(i int, open, close byte) (int, error) {
		depth := 0
		for j := i; j < len(expr); j++ {
			switch c := expr[j]; {
			case c == '"' || c == '\'' || c == '`':
				k := strings.IndexByte(expr[j+1:], c)
				if k < 0 {
					return 0, fmt.Errorf("unterminated string in %q", expr)
				}
				j += k + 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unclosed %c in %q", open, expr)
	}
	names := map[string]bool{}
	parens := 0
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '{' || c == '[':
			close := byte('}')
			if c == '[' {
				close = ']'
			}
			j, err := closeAt(i, c, close)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '"' || c == '\'' || c == '`':
			k := strings.IndexByte(expr[i+1:], c)
			if k < 0 {
				return nil, fmt.Errorf("unterminated string in %q", expr)
			}
			i += k + 2
		case c == '$':
			i++
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '{' || expr[i] == '}') {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++ // numbers and durations (5m, 1e3)
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			next := skipSpace(j)
			switch word {
			case "by", "without", "on", "ignoring", "group_left", "group_right":
				if next < len(expr) && expr[next] == '(' {
					k, err := closeAt(next, '(', ')')
					if err != nil {
						return nil, err
					}
					j = k
				}
			case "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN":
			default:
				switch {
				case promqlFuncs[word]:
					// a function, or an aggregation whose by/without
					// clause comes before its "("
				case next < len(expr) && expr[next] == '(':
					return nil, fmt.Errorf("unknown PromQL function %q in %q", word, expr)
				default:
					names[word] = true
				}
			}
			i = j
		case c == '(':
			parens++
			i++
		case c == ')':
			parens--
			i++
		default:
			i++
		}
	}
	if parens != 0 {
		return nil, fmt.Errorf("unbalanced parentheses in %q", expr)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}
