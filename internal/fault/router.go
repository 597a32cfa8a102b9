package fault

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// migrations is the router's family of moves, and moved the outcome of a
// stream continued on another engine.
const (
	migrations = "kvroute_migrations_total"
	moved      = "moved"
)

// movedIn sums the moved streams of the router's metric families.
func movedIn(fams []*dto.MetricFamily) int {
	n := 0.0
	for _, f := range fams {
		if f.GetName() != migrations {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == moved {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}

// Local is a router in this process: its fleet, drained and undrained as
// the admin API does, and its metrics' registry.
type Local struct {
	Fleet   *fleet.Fleet
	Metrics prometheus.Gatherer
}

func (l Local) backend(name string) (*fleet.Backend, error) {
	for _, b := range l.Fleet.Snapshot().All {
		if b.Name == name {
			return b, nil
		}
	}
	return nil, fmt.Errorf("no backend %s", name)
}

// Drain implements Router.
func (l Local) Drain(name string) error {
	b, err := l.backend(name)
	if err == nil {
		l.Fleet.Drain(b, time.Now())
	}
	return err
}

// Undrain implements Router.
func (l Local) Undrain(name string) error {
	b, err := l.backend(name)
	if err == nil {
		l.Fleet.Undrain(b)
	}
	return err
}

// InFlight implements Router: the router's own requests on the backend.
func (l Local) InFlight(name string) (int64, error) {
	b, err := l.backend(name)
	if err != nil {
		return 0, err
	}
	return b.OwnLoad().InFlight, nil
}

// Moved implements Router.
func (l Local) Moved() (int, error) {
	fams, err := l.Metrics.Gather()
	if err != nil {
		return 0, fmt.Errorf("router metrics: %w", err)
	}
	return movedIn(fams), nil
}

// Admin is a router in another process, reached over its admin API
// (POST /admin/backends/{name}/drain and /undrain, GET /admin/backends:
// the admin token needed) and its /metrics.
type Admin struct {
	// URL is the router's base URL (http://host:port) on the listener
	// that serves the admin API and /metrics (admin.listen when set).
	URL string
	// Token is the admin token.
	Token string
	// Client makes the calls; nil: one with a 10s timeout.
	Client *http.Client
}

var defaultClient = &http.Client{Timeout: 10 * time.Second}

// do sends method to the router's path (its elements joined and
// escaped), with the admin token, and returns a 200's body.
func (a Admin) do(method string, path ...string) (io.ReadCloser, error) {
	u, err := url.Parse(a.URL)
	if err != nil {
		return nil, fmt.Errorf("router URL %q: %w", a.URL, err)
	}
	u = u.JoinPath(path...)
	req, err := http.NewRequest(method, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	c := a.Client
	if c == nil {
		c = defaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u.Path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb openai.ErrorBody
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
			msg = eb.Error.Message
		}
		return nil, fmt.Errorf("%s %s: status %d: %s", method, u.Path, resp.StatusCode, msg)
	}
	return resp.Body, nil
}

// post sends POST /admin/backends/{name}/{action}.
func (a Admin) post(name, action string) error {
	body, err := a.do(http.MethodPost, "admin", "backends", name, action)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, body)
	return body.Close()
}

// Drain implements Router.
func (a Admin) Drain(name string) error {
	return a.post(name, "drain")
}

// Undrain implements Router.
func (a Admin) Undrain(name string) error {
	return a.post(name, "undrain")
}

// InFlight implements Router: the backend's in_flight in GET
// /admin/backends (the router's known load: its own requests and, with
// replicas, its peers').
func (a Admin) InFlight(name string) (int64, error) {
	var page struct {
		Backends []admin.Backend `json:"backends"`
	}
	body, err := a.do(http.MethodGet, "admin", "backends")
	if err != nil {
		return 0, err
	}
	defer body.Close()
	if err := json.NewDecoder(body).Decode(&page); err != nil {
		return 0, fmt.Errorf("GET /admin/backends: %w", err)
	}
	for _, b := range page.Backends {
		if b.Name == name {
			return b.Load.InFlight, nil
		}
	}
	return 0, fmt.Errorf("the router has no backend %s", name)
}

// Moved implements Router: kvroute_migrations_total{outcome="moved"}
// summed over its reasons, from the router's /metrics.
func (a Admin) Moved() (int, error) {
	// The admin token reads the whole page where API keys hide parts.
	body, err := a.do(http.MethodGet, "metrics")
	if err != nil {
		return 0, fmt.Errorf("router metrics: %w", err)
	}
	defer body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return 0, fmt.Errorf("router metrics: %w", err)
	}
	list := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		list = append(list, f)
	}
	return movedIn(list), nil
}

// Interface guards.
var (
	_ Router = Local{}
	_ Router = Admin{}
)
