package proxy

import (
	"net/url"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// A reload that moved a backend with a request in flight left two
// backends of one name (the old one draining), and /metrics answered 500
// (a series collected twice) in 17 of 24 scrapes. Each family has one
// series per name: the copy in rotation.
func TestMetricsOneSeriesPerName(t *testing.T) {
	f := fleet.New()
	now := time.Now()
	old := f.Add("a", &url.URL{Scheme: "http", Host: "10.0.0.1:8000"}, []string{"m"})
	ticket := old.Start(10, 10, 10, now)
	f.Remove(old, now)
	moved := f.Add("a", &url.URL{Scheme: "http", Host: "10.0.0.2:8000"}, []string{"m"})
	if len(f.Snapshot().All) != 2 || old == moved {
		t.Fatalf("want the draining copy and the new one: %d backends", len(f.Snapshot().All))
	}
	fams, err := NewMetrics(f).Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, fam := range fams {
		if fam.GetName() != "kvroute_backend_healthy" {
			continue
		}
		if n := len(fam.Metric); n != 1 {
			t.Errorf("kvroute_backend_healthy has %d series for one name", n)
		}
	}
	ticket.Done(now)
}
