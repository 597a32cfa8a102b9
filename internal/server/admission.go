package server

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// newAdmission builds the admission queue from the admission section, or
// returns nil when no limit is set: a nil controller admits everything at
// the cost of a nil check.
func newAdmission(cfg *config.Config, f *fleet.Fleet, reg prometheus.Registerer) (*admission.Controller, error) {
	a := cfg.Admission
	if !a.Enabled() {
		// The queue's metrics exist at zero all the same: a dashboard
		// shows an empty queue, not No data.
		if reg == nil {
			return nil, nil
		}
		return nil, admission.RegisterMetrics(reg)
	}
	order, err := admission.ParseOrder(a.QueueOrder())
	if err != nil {
		return nil, fmt.Errorf("admission.order: %w", err)
	}
	lim := admission.Limits{
		MaxInFlight:       int64(a.MaxInFlightPerBackend),
		MaxPendingPrefill: a.PendingPrefillLimit(),
		MaxEngineWaiting:  a.MaxEngineWaiting,
		// An engine's queue counts as long as the engine reader itself
		// trusts the report.
		EngineMaxAge: cfg.Engines.Interval * time.Duration(cfg.Engines.StaleAfter),
	}
	return admission.New(admission.Config{MaxQueue: a.MaxQueue, MaxWait: a.MaxWait, Order: order, Slack: a.DeadlineSlack, Cap: a.DeadlineCap}, lim.Saturated(f), reg)
}
