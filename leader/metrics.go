package leader

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/metric"
)

// Metrics of the election.
type Metrics struct {
	leader      prometheus.Gauge
	epoch       prometheus.Gauge
	transitions prometheus.Counter
	canFence    prometheus.Gauge
}

// NewMetrics registers the election metrics with reg (nil: unregistered).
// Any goroutine; does not block.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leader: metric.Gauge("outbox_relay_leader",
			"1 while this instance holds the lease and streams, 0 on standby."),
		epoch: metric.Gauge("outbox_relay_leader_epoch",
			"Epoch of the lease: this instance's term when leader, the last one seen when standby."),
		transitions: metric.Counter("outbox_relay_leader_transitions_total",
			"Times this instance became leader or standby."),
		canFence: metric.Gauge("outbox_relay_leader_can_fence",
			"1 when this instance's role may terminate the lease holder's backends (checked at each lease connection), 0 when it cannot fence a stalled leader: see /role's fence_problem."),
	}
	m.canFence.Set(math.NaN()) // unknown until the first lease connection
	metric.Register(reg, m.leader, m.epoch, m.transitions, m.canFence)
	return m
}
