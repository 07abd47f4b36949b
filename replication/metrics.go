package replication

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/metric"
	"github.com/outbox-relay/outbox-relay/internal/pg"
)

// Metrics are the replication gauges and counters, one set per leader
// term: the Stream and the LagPoller write them. Build with NewMetrics;
// safe for concurrent use.
type Metrics struct {
	received       prometheus.Gauge
	confirmed      prometheus.Gauge
	reconnects     prometheus.Counter
	historyChanges prometheus.Counter
	slotLag        prometheus.Gauge
	slotRetained   prometheus.Gauge
	slotActive     prometheus.Gauge
	slotWALStatus  *prometheus.GaugeVec
	lagPollErrors  prometheus.Counter
	lastLagSuccess prometheus.Gauge
	streaming      prometheus.Gauge
	catchingUp     prometheus.Gauge
}

// NewMetrics registers the metrics on reg; a nil reg leaves them unregistered
// (tests). Any goroutine; does not block.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		received: metric.Gauge("outbox_relay_received_lsn",
			"Highest WAL position received from the slot, as a number."),
		confirmed: metric.Gauge("outbox_relay_confirmed_lsn",
			"WAL position last confirmed to PostgreSQL (flush/apply): every event before it is acked by Kafka."),
		reconnects: metric.Counter("outbox_relay_replication_reconnects_total",
			"Replication sessions that ended with an error and were retried."),
		historyChanges: metric.Counter("outbox_relay_server_history_changes_total",
			"Replication sessions that found the server on another history (IDENTIFY_SYSTEM system id or timeline changed) and resumed from the slot, discarding the in-memory ack watermark."),
		slotLag: metric.Gauge("outbox_relay_slot_lag_bytes",
			"pg_current_wal_lsn() - confirmed_flush_lsn of the slot."),
		slotRetained: metric.Gauge("outbox_relay_slot_retained_wal_bytes",
			"pg_current_wal_lsn() - restart_lsn of the slot: WAL the server keeps for it."),
		slotActive: metric.Gauge("outbox_relay_slot_active",
			"1 when a walsender is attached to the slot."),
		slotWALStatus: metric.GaugeVec("outbox_relay_slot_wal_status",
			"1 for the slot's current wal_status (reserved, extended, unreserved, lost).", "status"),
		lagPollErrors: metric.Counter("outbox_relay_slot_lag_poll_errors_total",
			"Failed reads of slot lag."),
		lastLagSuccess: metric.Gauge("outbox_relay_slot_lag_last_success_timestamp_seconds",
			"Unix time of the last successful slot lag read."),
		streaming: metric.Gauge("outbox_relay_streaming",
			"1 when the replication session streams in-progress transactions (postgres.streaming; pgoutput protocol 2)."),
		catchingUp: metric.Gauge("outbox_relay_replication_catching_up",
			"1 while the stream is more than 256 KiB of WAL behind the server's end (a backlog): reads and produce requests are batched."),
	}
	metric.Register(reg, m.received, m.confirmed, m.reconnects, m.historyChanges, m.slotLag, m.slotRetained, m.slotActive,
		m.slotWALStatus, m.lagPollErrors, m.lastLagSuccess, m.streaming, m.catchingUp)
	return m
}

// counts are what a job on a pg.Keeper counts (KeeperConfig.Done and
// Errors): its attempts done and failed.
type counts struct{ done, errors prometheus.Counter }

// newCounts registers done and errors on reg (nil: unregistered).
func newCounts(reg prometheus.Registerer, done, errors prometheus.Counter) counts {
	metric.Register(reg, done, errors)
	return counts{done: done, errors: errors}
}

// LagPoller reads the slot's lag into Metrics on a normal connection every
// postgres.lag_poll_interval. NewLagPoller allocates; Run polls until ctx
// ends, on a pg.Keeper: a failed poll is counted
// (outbox_relay_slot_lag_poll_errors_total), logged at Debug, and the next
// poll, on the next tick, reconnects. It never stops the relay. The
// leader's term runs one.
type LagPoller struct {
	cfg Config
	m   *Metrics
	log zerolog.Logger
}

// NewLagPoller allocates; it does not connect. Any goroutine; does not
// block.
func NewLagPoller(cfg Config, m *Metrics, log zerolog.Logger) *LagPoller {
	return &LagPoller{cfg: cfg, m: m, log: log.With().Str("component", "lag").Logger()} // the caller's logger carries slot
}

// Run polls at once and then every postgres.lag_poll_interval until ctx
// ends, then returns nil. It blocks; call it once, from the term's
// goroutine for it.
func (p *LagPoller) Run(ctx context.Context) error {
	cfg, m, log := p.cfg, p.m, p.log
	pg.NewKeeper(pg.KeeperConfig{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, cfg.URL) },
		Every:   cfg.LagPollInterval, Ticked: true,
		Errors: m.lagPollErrors,
		Failed: func(f pg.Failure) {
			if f.Connecting {
				log.Debug().Err(f.Err).Msg("lag poll connect failed")
			} else {
				log.Debug().Err(f.Err).Msg("lag poll failed")
			}
		},
	}).Run(ctx, func(ctx context.Context, conn *pgx.Conn) error { return pollOnce(ctx, conn, cfg.Slot, m) })
	return nil
}

func pollOnce(ctx context.Context, conn *pgx.Conn, slot string, m *Metrics) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var (
		lag, retained *int64
		walStatus     *string
		active        bool
	)
	err := conn.QueryRow(qctx, `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint,
		(pg_current_wal_lsn() - restart_lsn)::bigint, wal_status, active
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lag, &retained, &walStatus, &active)
	if err == pgx.ErrNoRows {
		// No slot: lag is unknown, not zero. Leave the last values and say so.
		m.slotWALStatus.Reset()
		m.slotWALStatus.WithLabelValues("missing").Set(1)
		return nil
	}
	if err != nil {
		return err
	}
	if lag != nil {
		m.slotLag.Set(float64(*lag))
	}
	if retained != nil {
		m.slotRetained.Set(float64(*retained))
	}
	if active {
		m.slotActive.Set(1)
	} else {
		m.slotActive.Set(0)
	}
	m.slotWALStatus.Reset()
	if walStatus != nil {
		m.slotWALStatus.WithLabelValues(*walStatus).Set(1)
	}
	m.lastLagSuccess.SetToCurrentTime()
	return nil
}
