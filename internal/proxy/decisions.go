package proxy

import (
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/lifecycle"
)

// decisionLog is the admin API's decision log as the lifecycle's
// Recorder: a settled routed request as the log shows it.
type decisionLog struct{ log *admin.Log }

// Decided records r's settled routing decision: its final backend and
// reason (or the error code of a request the router answered itself), how
// many retries it took, and its status; for a split request each leg.
func (d decisionLog) Decided(r *lifecycle.Request) {
	dec := admin.Decision{Time: r.Start, Model: r.View.Model, Session: r.View.SessionKey, PromptTokens: r.View.PromptTokens,
		TTFTMillis: float64(r.TTFT) / float64(time.Millisecond), Retries: r.Retries(), Status: r.Status, Reason: r.Code, Whole: r.Whole}
	l := r.Leg()
	if l.Target != nil {
		dec.Backend = l.Target.B.Name
	}
	if l.A != nil {
		dec.Reason = r.Reason()
	}
	if len(r.Legs) > 1 {
		dec.Legs = make([]admin.Leg, len(r.Legs))
		for i := range r.Legs {
			dec.Legs[i] = legDecision(r, &r.Legs[i])
		}
	}
	d.log.Record(dec)
}

// legDecision is leg l of r as the decision log shows it.
func legDecision(r *lifecycle.Request, l *lifecycle.Leg) admin.Leg {
	d := admin.Leg{Role: l.Role, Attempts: l.Attempts(), Skipped: l.SkipReason()}
	if l.Target != nil {
		d.Backend = l.Target.B.Name
	}
	if l.A != nil && !l.Skipped() {
		d.Reason = l.A.Reason
		if l.ServedWhole(r) {
			d.Whole = true
		}
	}
	return d
}

// recorder is the lifecycle's Recorder over log, nil without one.
func recorder(log *admin.Log) lifecycle.Recorder {
	if log == nil {
		return nil
	}
	return decisionLog{log}
}

var _ lifecycle.Recorder = decisionLog{}
