package proxy

import (
	"time"

	"github.com/kvroute/kvroute/internal/admin"
)

// record logs the settled routing decision of a scheduled request: its
// final backend and reason (or the error code of a request the router
// answered itself), how many retries it took, and its status. It reads the
// exchange's view, never its body.
func (ex *exchange) record() {
	if ex.view == nil || ex.s.decisions == nil {
		return
	}
	d := admin.Decision{Time: ex.start, Model: ex.view.Model, Session: ex.view.SessionKey, PromptTokens: ex.view.PromptTokens,
		TTFTMillis: float64(ex.ttft) / float64(time.Millisecond), Retries: ex.retries, Status: ex.status, Reason: ex.rejected}
	if ex.target != nil {
		d.Backend = ex.target.B.Name
	}
	if ex.a != nil {
		d.Reason = ex.a.Reason
	}
	ex.s.decisions.Record(d)
}
