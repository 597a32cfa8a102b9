package fault

import (
	"context"
	"net/http"
	"sync/atomic"
)

// hangable serves h until hung, after which its writes block until the
// request ends: an engine that keeps its connections and sends nothing.
type hangable struct {
	h    http.Handler
	hung *atomic.Bool
}

func (g hangable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.h.ServeHTTP(&hangWriter{ResponseWriter: w, g: g, ctx: r.Context()}, r)
}

type hangWriter struct {
	http.ResponseWriter
	g   hangable
	ctx context.Context
}

func (w *hangWriter) Write(p []byte) (int, error) {
	if w.g.hung.Load() {
		<-w.ctx.Done()
		return 0, w.ctx.Err()
	}
	return w.ResponseWriter.Write(p)
}

func (w *hangWriter) Flush() {
	if !w.g.hung.Load() {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *hangWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
