// Package metric builds the relay's Prometheus collectors, one call per
// metric, and registers a package's set of them at once on a Registerer
// that may be nil (tests and one-shot commands register nothing).
package metric

import "github.com/prometheus/client_golang/prometheus"

// Counter builds an unregistered counter. Any goroutine; does not block.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// Gauge builds an unregistered gauge. Any goroutine; does not block.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec builds an unregistered gauge vector with labels. Any goroutine;
// does not block.
func GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// Register registers cs on reg; a nil reg registers nothing. It panics
// like prometheus.MustRegister on a name registered twice. Any goroutine;
// does not block.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) {
	if reg != nil {
		reg.MustRegister(cs...)
	}
}
