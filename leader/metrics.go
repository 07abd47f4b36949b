package leader

import (
	"math"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/metric"
)

// Metrics of the election.
type Metrics struct {
	leader      prometheus.GaugeFunc
	valid       atomic.Pointer[Elector] // whose lease outbox_relay_leader reports; set by New
	epoch       prometheus.Gauge
	transitions prometheus.Counter
	canFence    prometheus.Gauge
}

// NewMetrics registers the election metrics with reg (nil: unregistered).
// Any goroutine; does not block.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		epoch: metric.Gauge("outbox_relay_leader_epoch",
			"Epoch of the lease: this instance's term when leader, the last one seen when standby."),
		transitions: metric.Counter("outbox_relay_leader_transitions_total",
			"Times this instance became leader or standby."),
		canFence: metric.Gauge("outbox_relay_leader_can_fence",
			"1 when this instance's role may terminate the lease holder's backends (checked at each lease connection), 0 when it cannot fence a stalled leader: see /role's fence_problem."),
	}
	// Read at each scrape, like /role: 1 exactly while Valid, so a stopped
	// leader whose lease ran out says 0 the moment it wakes, before its
	// term has wound down.
	m.leader = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_leader",
		Help: "1 while this instance holds an unexpired lease (it may publish and confirm), 0 otherwise; the epoch is outbox_relay_leader_epoch."},
		func() float64 {
			if e := m.valid.Load(); e != nil && e.Valid() {
				return 1
			}
			return 0
		})
	m.canFence.Set(math.NaN()) // unknown until the first lease connection
	metric.Register(reg, m.leader, m.epoch, m.transitions, m.canFence)
	return m
}
