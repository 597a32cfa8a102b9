package admission

import "github.com/prometheus/client_golang/prometheus"

// metrics are the queue's Prometheus metrics. The queue length carries no
// priority label: the priority is a client-chosen integer, and a label on
// it would let clients mint series without bound.
type metrics struct {
	length     prometheus.Gauge
	wait       *prometheus.HistogramVec
	rejections *prometheus.CounterVec
	admitted   prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		length: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_queue_length",
			Help: "Requests waiting in the router's admission queue because every backend for their model is saturated.",
		}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_queue_wait_seconds",
			Help:    "Time requests spent in the admission queue, by how the wait ended (admitted, timeout, cancelled). Requests admitted without waiting are not observed.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_queue_rejections_total",
			Help: "Requests answered 429 by the admission queue: full (the queue was full on arrival) or timeout (waited the limit).",
		}, []string{"reason"}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_queue_admitted_total",
			Help: "Requests admitted from the admission queue after waiting (bound to a backend when one freed up). Requests admitted without waiting are not counted.",
		}),
	}
	// Known label values are created up front so that rates start at 0.
	for _, r := range []string{"full", "timeout"} {
		m.rejections.WithLabelValues(r)
	}
	for _, o := range []string{"admitted", "timeout", "cancelled"} {
		m.wait.WithLabelValues(o)
	}
	return m
}

// RegisterMetrics registers the queue's metrics, at zero, for a router
// without an admission queue, so that they exist from startup whether
// the queue is on or not.
func RegisterMetrics(reg prometheus.Registerer) error {
	return newMetrics().register(reg)
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.length, m.wait, m.rejections, m.admitted} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
