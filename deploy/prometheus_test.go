package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// prometheusBin is Debian's prometheus package's server (apt-get install
// prometheus; .ci/run installs it).
const prometheusBin = "/usr/bin/prometheus"

// dashboardVars are what the dashboard's variables stand for when every
// value is chosen (their allValue), and Grafana's own.
var dashboardVars = strings.NewReplacer(`$__rate_interval`, "1m", `$__interval`, "15s", `$__range`, "1h",
	`$instance`, ".*", `$backend`, ".*", `$model`, ".*")

// TestDashboardInPrometheus evaluates every query of the dashboard in a
// real Prometheus that scrapes a live router (and its two test engines) on
// loopback: each must run without error and return data, so that no
// panel shows "No data" on a fleet with clean or light traffic.
func TestDashboardInPrometheus(t *testing.T) {
	if _, err := os.Stat(prometheusBin); err != nil {
		t.Skipf("%s not installed (apt-get install prometheus): the dashboard's queries are not evaluated", prometheusBin)
	}
	d := loadDashboard(t)
	l := newLiveFleet(t)
	prom := startPrometheus(t, l)

	// Traffic before and while Prometheus scrapes, so that rates have
	// two samples that differ.
	l.drive(t)
	for range 3 {
		if err := l.post(true); err != nil {
			t.Fatal(err)
		}
	}
	prom.waitScrapes(t, 4)

	var exprs []string
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				exprs = append(exprs, p.Title+"\x00"+tg.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, e := range exprs {
		title, expr, _ := strings.Cut(e, "\x00")
		q := dashboardVars.Replace(expr)
		n, err := prom.query(q)
		if err != nil {
			t.Errorf("panel %q: %s: %v", title, q, err)
		} else if n == 0 {
			t.Errorf("panel %q: %s: no data", title, q)
		}
	}
	if t.Failed() {
		// What a panel without data most often means: a target whose
		// last scrape failed (its gauges are stale).
		for _, q := range []string{"up", "scrape_duration_seconds"} {
			data, err := prom.get("/api/v1/query", url.Values{"query": {q}})
			t.Logf("%s: %s %v", q, data, err)
		}
	}
	// The query variables list values.
	for _, v := range queryVariables(t, d) {
		vals, err := prom.labelValues(v.label, dashboardVars.Replace(v.metric+v.selector))
		if err != nil || len(vals) == 0 {
			t.Errorf("variable %s (%s%s, %s): values %v, %v", v.name, v.metric, v.selector, v.label, vals, err)
		}
	}
}

// promServer is a Prometheus the test started.
type promServer struct {
	base   string
	client *http.Client
}

// startPrometheus runs Prometheus with a config of its own (every second:
// a scrape of a router under the race detector on a loaded machine can
// take more than 200 ms, and a failed scrape leaves its gauges stale;
// the routers as job kvroute, the engines as job engines) and a temporary
// data directory, and waits until it is ready. It is killed when the
// test ends.
func startPrometheus(t *testing.T, l *liveFleet) *promServer {
	t.Helper()
	dir := t.TempDir()
	host := func(u string) string { return strings.TrimPrefix(u, "http://") }
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvroute
    static_configs: [{targets: [%q, %q]}]
  - job_name: engines
    static_configs: [{targets: [%q, %q, %q, %q]}]
`, host(l.base), host(l.pd.base), host(l.good.URL), host(l.bad.URL), host(l.pd.engines[0]), host(l.pd.engines[1]))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// A free loopback port: Prometheus takes no listener from us.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(prometheusBin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &promServer{base: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := p.client.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitScrapes waits until Prometheus has scraped every target n times
// (by scrape count, not by wall-clock: a loaded machine only makes it
// slower).
func (p *promServer) waitScrapes(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	q := fmt.Sprintf(`min(count_over_time(up[10m])) >= %d and min(up) == 1`, n)
	for {
		got, err := p.query(q)
		if err == nil && got > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus did not scrape every target %d times in 2 minutes (%v)", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Error     string          `json:"error"`
	ErrorType string          `json:"errorType"`
	Data      json.RawMessage `json:"data"`
}

func (p *promServer) get(path string, params url.Values) (json.RawMessage, error) {
	resp, err := p.client.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// query evaluates an instant query now and returns how many series (or
// one for a scalar) it gave.
func (p *promServer) query(q string) (int, error) {
	data, err := p.get("/api/v1/query", url.Values{"query": {q}})
	if err != nil {
		return 0, err
	}
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return 0, err
	}
	if d.ResultType == "scalar" || d.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(d.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}

// labelValues lists the values of label on the series match selects.
func (p *promServer) labelValues(label, match string) ([]string, error) {
	data, err := p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {match}})
	if err != nil {
		return nil, err
	}
	var vals []string
	return vals, json.Unmarshal(data, &vals)
}
