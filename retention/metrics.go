package retention

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/metric"
)

// Metrics are the retention and delivery metrics. Built once per process
// (the relay's base registry), so a standby exports them as 0.
type Metrics struct {
	deleted     prometheus.Counter
	paused      prometheus.Gauge
	undelivered prometheus.Gauge
	// undeliveredExact is 1 when undelivered is exact, 0 when a bound.
	undeliveredExact prometheus.Gauge
	oldestAge        prometheus.Gauge
	horizonAge       prometheus.Gauge
	sampleErrors     prometheus.Counter
}

// NewMetrics builds the metrics and registers them with reg (nil: not
// registered, for tests and the cleanup command). Any goroutine; does not
// block.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deleted: metric.Counter("outbox_relay_retention_deleted_rows_total",
			"Outbox rows removed by retention (deleted, archived, or in dropped partitions)."),
		paused: metric.Gauge("outbox_relay_retention_paused",
			"1 while retention deletes nothing because delivery cannot be proven: the slot is missing or unhealthy, the publication does not stream every insert, or the outbox has inheritance children (see outbox-relay status)."),
		undelivered: metric.Gauge("outbox_relay_undelivered_events",
			"Outbox rows not proven delivered (capped at 1000000): exact when outbox_relay_undelivered_exact is 1 (the slot confirmed past the count's snapshot; 0 when the relay is caught up), else a bound by the delivered horizon's sample (see docs/metrics.md)."),
		undeliveredExact: metric.Gauge("outbox_relay_undelivered_exact",
			"1 when outbox_relay_undelivered_events is exact (the slot confirmed past the count's snapshot within 3 s), 0 when it is a bound."),
		oldestAge: metric.Gauge("outbox_relay_oldest_row_age_seconds",
			"Age of the oldest row in the outbox table (min created_at); 0 when empty."),
		horizonAge: metric.Gauge("outbox_relay_delivered_horizon_age_seconds",
			"Seconds since the delivered horizon's sample: every transaction committed before it is delivered."),
		sampleErrors: metric.Counter("outbox_relay_retention_errors_total",
			"Failed delivery horizon samples or retention runs (each retried; the relay goes on)."),
	}
	metric.Register(reg, m.deleted, m.paused, m.undelivered, m.undeliveredExact, m.oldestAge, m.horizonAge, m.sampleErrors)
	return m
}

// zero is what a standby exports: it does not sample.
func (m *Metrics) zero() {
	m.paused.Set(0)
	m.undelivered.Set(0)
	m.undeliveredExact.Set(0)
	m.oldestAge.Set(0)
	m.horizonAge.Set(0)
}
