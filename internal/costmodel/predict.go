package costmodel

// ITL is the predicted mean time between two output tokens, in seconds,
// of a stream that joins an engine decoding seqs sequences over ctx
// context tokens (the stream's own included), with pending prompt tokens
// still to prefill there, in steps of at most chunk tokens, over the
// stream's budget output tokens. Every decode step runs the batch
// (DecodeStep); the steps that also carry a chunk of the pending prefill
// take that chunk's token time more, spread over the stream's tokens:
//
//	itl = DecodeStep(seqs, ctx) + Token * min(pending, chunk*budget) / budget
//
// The prefill arriving after the stream joined is not known at routing;
// the live and simulated prediction error (kvroute_slo_prediction_ratio,
// the reports' ITL error column) shows what that leaves out.
func (c Coeffs) ITL(seqs, ctx float64, pending, chunk, budget int64) float64 {
	itl := c.DecodeStep(seqs, ctx)
	if budget <= 0 || pending <= 0 {
		return itl
	}
	return itl + c.Token*float64(min(pending, max(chunk, 1)*budget))/float64(budget)
}
