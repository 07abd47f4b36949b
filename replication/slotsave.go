package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/metric"
	"github.com/outbox-relay/outbox-relay/internal/pg"
)

// SlotSaveInterval is how often, at most, a SlotSaver has the server log a
// running-transactions record (while the relay's confirmed position moves).
const SlotSaveInterval = time.Second

// slotSaveQuery makes the server write an xl_running_xacts record: creating
// a logical slot logs one (ReplicationSlotReserveWal) before it builds its
// snapshot. The slot is temporary and dropped by the same statement (a
// failed statement drops it too; so does the end of the session). Its name
// is unique per backend, so relays on other slots never collide.
const slotSaveQuery = "SELECT pg_drop_replication_slot(slot_name) FROM pg_create_logical_replication_slot('outbox_relay_save_' || pg_backend_pid(), 'pgoutput', true)"

// SlotSaver makes PostgreSQL write the slot's confirmed position to disk
// soon after the relay confirms it, so that a PostgreSQL restart or crash
// takes the slot back by about SlotSaveInterval, not to wherever it was
// last written.
//
// Why it is needed: before PostgreSQL 17 the server writes a logical slot's
// confirmed_flush_lsn to disk only when a status update also moves the
// slot's restart_lsn or catalog_xmin (LogicalConfirmReceivedLocation); a
// shutdown checkpoint writes only slots so marked (17 also writes a slot
// whose confirmed position moved, at shutdown; a crash loses it on every
// version). restart_lsn and catalog_xmin move only when a status update
// confirms past a running-transactions record decoded through the slot,
// and the server writes those only every 15 s (bgwriter, under write load)
// and at checkpoints. So after a restart the slot is back where it was up
// to 15 s or more before, and a new session starts there (startFrom: the
// relay never starts past the slot). Here, each interval in which the
// relay's confirmed position moved, one statement on a normal connection
// logs such a record; the next status update past it makes the server
// write the slot.
//
// It changes nothing the relay confirms or where it starts. It needs the
// REPLICATION attribute (the relay has it) and one free slot of
// max_replication_slots for a moment; failures are counted, logged once
// per outage and retried on a pg.Keeper (a new connection, at the next
// interval the position moved), never fatal. The leader's term runs one.
type SlotSaver struct {
	url       string
	interval  time.Duration
	confirmed func() pglogrepl.LSN
	events    func() pglogrepl.LSN
	log       zerolog.Logger
	m         *SlotSaveMetrics
}

// SlotSaveMetrics count what SlotSavers did. They live as long as the
// process: build them once and give them to every term's SlotSaver. Safe
// for concurrent use.
type SlotSaveMetrics struct{ counts }

// NewSlotSaveMetrics registers the counters on reg (nil: unregistered).
// Any goroutine; does not block.
func NewSlotSaveMetrics(reg prometheus.Registerer) *SlotSaveMetrics {
	return &SlotSaveMetrics{newCounts(reg,
		metric.Counter("outbox_relay_slot_saves_total",
			"Running-transactions records the leader had PostgreSQL write (a temporary logical slot) so that its next confirmation makes the server write the slot's confirmed position to disk."),
		metric.Counter("outbox_relay_slot_save_errors_total",
			"Failed attempts to have PostgreSQL write such a record; while they fail, a PostgreSQL restart may put the slot back further (duplicates, no loss)."))}
}

// NewSlotSaver allocates; it does not connect. confirmed returns the flush
// position of the relay's last status update (Stream.Confirmed); events the
// commit LSN of the newest transaction with events the relay read (nil:
// any confirmation counts). Run calls both from its goroutine every tick,
// so they must not block. m may be nil (unregistered counters). Any
// goroutine; does not block.
func NewSlotSaver(cfg Config, interval time.Duration, confirmed, events func() pglogrepl.LSN, log zerolog.Logger, m *SlotSaveMetrics) *SlotSaver {
	if m == nil {
		m = NewSlotSaveMetrics(nil)
	}
	return &SlotSaver{url: cfg.URL, interval: interval, confirmed: confirmed, events: events, m: m,
		log: log.With().Str("component", "slot-save").Logger()}
}

// Run logs a running-transactions record at most every interval, whenever
// the confirmed position moved since the last one and a transaction with
// events came after that one, until ctx ends; it returns nil. Without
// events the slot going back after a restart republishes nothing, and a
// record a second would keep itself going: the relay confirms past it (the
// idle slot advance) and so moves the confirmed position again. It blocks;
// call it once, from the term's goroutine for it.
func (s *SlotSaver) Run(ctx context.Context) error {
	var (
		last, next pglogrepl.LSN
		tried      time.Time
	)
	// Look often, write at most every interval, the first time as soon as
	// the term confirmed something: a term starts after a PostgreSQL
	// restart, and another restart may follow within the second.
	pg.NewKeeper(pg.KeeperConfig{
		Connect: s.connect,
		Every:   min(s.interval/10, 100*time.Millisecond), Ticked: true,
		Due: func() bool {
			next = s.confirmed()
			if next == 0 || next <= last || time.Since(tried) < s.interval {
				return false // nothing new to keep, or too soon
			}
			if s.events != nil && s.events() <= last {
				return false // only transactions without events since the last record
			}
			tried = time.Now()
			return true
		},
		Done: s.m.done, Errors: s.m.errors,
		Failed: func(f pg.Failure) {
			if f.First {
				s.log.Warn().Err(f.Err).Str("hint", slotSaveHint(f.Err)).
					Msg("cannot make PostgreSQL write the slot's confirmed position; after a PostgreSQL restart events acked since its last write are published again (duplicates, no loss); retrying")
			}
		},
		Recovered: func() { s.log.Info().Msg("slot's confirmed position written by PostgreSQL again") },
	}).Run(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		if err := s.save(ctx, conn); err != nil {
			return err
		}
		last = next
		return nil
	})
	return nil
}

// connect opens the saver's connection with its statement timeout.
func (s *SlotSaver) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pg.Connect(ctx, s.url)
	if err != nil {
		return nil, err
	}
	// Building the temporary slot's snapshot waits for the transactions
	// running at the record; the record is written first, so giving up
	// early loses nothing.
	if _, err := c.Exec(ctx, "SET statement_timeout = '1s'"); err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("set statement_timeout: %w", err)
	}
	return c, nil
}

// save logs one running-transactions record on conn. A statement timeout
// is not a failure: the record is written first; only the temporary
// slot's snapshot waited for a long transaction, which pins the slot
// anyway until it ends.
func (s *SlotSaver) save(ctx context.Context, conn *pgx.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(qctx, slotSaveQuery); err != nil {
		err = fmt.Errorf("log a running-transactions record (a temporary logical slot): %w", err)
		if isStatementTimeout(err) {
			s.log.Debug().Err(err).Msg("slot save: a long transaction is running; the slot's restart_lsn cannot pass it until it ends")
			return nil
		}
		return err
	}
	return nil
}

// isStatementTimeout reports a statement cancelled by statement_timeout
// (SQLSTATE 57014).
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// slotSaveHint says what to do about errors retrying cannot fix.
func slotSaveHint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "53400": // configuration_limit_exceeded: all replication slots are in use
		return "raise max_replication_slots by one: the relay needs a free slot for a moment"
	case "42501": // insufficient_privilege
		return "the relay's role needs the REPLICATION attribute (ALTER ROLE <role> REPLICATION)"
	}
	return ""
}
