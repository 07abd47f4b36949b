package leader

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the election.
type Metrics struct {
	leader      prometheus.Gauge
	epoch       prometheus.Gauge
	transitions prometheus.Counter
}

// NewMetrics registers the election metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_leader",
			Help: "1 while this instance holds the lease and streams, 0 on standby."}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_leader_epoch",
			Help: "Epoch of the lease: this instance's term when leader, the last one seen when standby."}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_leader_transitions_total",
			Help: "Times this instance became leader or standby."}),
	}
	if reg != nil {
		reg.MustRegister(m.leader, m.epoch, m.transitions)
	}
	return m
}
