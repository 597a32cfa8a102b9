package scheduler

import (
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/slo"
)

// ShedError is Route's error for a sheddable request that no candidate is
// predicted to serve within its objectives (slo.Choose): it is refused at
// once, before any load is taken, instead of being queued to miss them.
// Its OpenAI error is a 429 with Retry-After.
type ShedError struct {
	Objective slo.Objective
	// Pred is the best candidate's prediction.
	Pred slo.Prediction
}

func (e *ShedError) Error() string {
	return fmt.Sprintf("request shed: no backend is predicted to meet its objectives (ttft %v, itl %v; best predicted ttft %.3fs, itl %.3fs)",
		e.Objective.TTFT, e.Objective.ITL, e.Pred.TTFT, e.Pred.ITL)
}

// CodeShed is the error code of a request shed for its objectives.
const CodeShed = "slo_unattainable"

// OpenAI is the client's answer: 429 rate_limit_exceeded, code
// "slo_unattainable", with Retry-After and the reason.
func (e *ShedError) OpenAI() *openai.Error {
	return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: CodeShed,
		RetryAfter: slo.RetryAfter(e.Objective, e.Pred),
		Message:    "sheddable request refused: " + e.Error()}
}

// shed is the error for a decision the policy shed.
func shed(o slo.Objective, d policy.Decision) error {
	return &ShedError{Objective: o, Pred: d.Pred}
}
