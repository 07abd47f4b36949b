package testkit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outbox is one test's private outbox on the shared services: its own
// schema, table, publication, slot and topic prefix. The relay's migrate
// makes them; Close drops them.
type Outbox struct {
	Schema, Table, Slot, Pub string // Table is Schema.outbox
	Prefix                   string // topic prefix: topics are Prefix.<aggregate_type>
	DB                       *pgxpool.Pool
	// KeepTopics: Close leaves the topics (a throwaway cluster where
	// deleting them is not safe: see test/chaos's cluster scenario).
	KeepTopics bool
	brokers    []string
}

// NewOutbox names an outbox kind_name_<suffix> (topics kind.name.<suffix>)
// and connects to PostgreSQL.
func NewOutbox(ctx context.Context, s *Services, kind, name string) (*Outbox, error) {
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	id := kind + "_" + name + "_" + suffix
	db, err := pgxpool.New(ctx, s.PGURL)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	return &Outbox{Schema: id, Table: id + ".outbox", Slot: id, Pub: id, Prefix: kind + "." + name + "." + suffix, DB: db, brokers: s.Brokers}, nil
}

// Close drops the slot (once its walsender let go), the publication, the
// schema and every topic under the prefix, and closes the pool.
func (o *Outbox) Close(ctx context.Context) error {
	errs := []error{DropSlot(ctx, o.DB, o.Slot)}
	for _, q := range []string{"DROP PUBLICATION IF EXISTS " + pgx.Identifier{o.Pub}.Sanitize(), "DROP SCHEMA IF EXISTS " + o.Schema + " CASCADE"} {
		if _, err := o.DB.Exec(ctx, q); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", q, err))
		}
	}
	o.DB.Close()
	if !o.KeepTopics {
		errs = append(errs, DeleteTopics(o.brokers, o.Prefix+"."))
	}
	return errors.Join(errs...)
}

// DropSlot waits (up to 30s) for the slot's walsender to let go, then drops
// it; a missing slot is fine.
func DropSlot(ctx context.Context, db *pgxpool.Pool, name string) error {
	gone := false
	err := Poll(30*time.Second, 100*time.Millisecond, func() (bool, error) {
		var active *bool
		err := db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			gone = true
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("read slot %s: %w", name, err)
		}
		return active == nil || !*active, nil
	})
	if gone || (err != nil && ctx.Err() != nil) {
		return err
	}
	// Still active after the wait: the drop below says so.
	if _, err := db.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", name); err != nil {
		return fmt.Errorf("drop slot %s: %w", name, err)
	}
	return nil
}

// LSN runs a query returning one pg_lsn (as text); 0 when it yields NULL.
func (o *Outbox) LSN(ctx context.Context, q string, args ...any) (pglogrepl.LSN, error) {
	var s *string
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := o.DB.QueryRow(ctx, q, args...).Scan(&s); err != nil {
		return 0, fmt.Errorf("%s: %w", q, err)
	}
	if s == nil {
		return 0, nil
	}
	return pglogrepl.ParseLSN(*s)
}

// CurrentLSN is pg_current_wal_lsn().
func (o *Outbox) CurrentLSN(ctx context.Context) (pglogrepl.LSN, error) {
	return o.LSN(ctx, "SELECT pg_current_wal_lsn()::text")
}

// Confirmed is the slot's confirmed_flush_lsn; a missing slot is an error,
// never 0 (which would make every comparison pass).
func (o *Outbox) Confirmed(ctx context.Context) (pglogrepl.LSN, error) {
	l, err := o.LSN(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name=$1", o.Slot)
	if err == nil && l == 0 {
		err = fmt.Errorf("slot %s has no confirmed_flush_lsn", o.Slot)
	}
	return l, err
}

// WaitConfirmed waits up to d until the slot confirmed lsn.
func (o *Outbox) WaitConfirmed(ctx context.Context, lsn pglogrepl.LSN, d time.Duration) error {
	var c pglogrepl.LSN
	err := Poll(d, 200*time.Millisecond, func() (bool, error) {
		var err error
		c, err = o.Confirmed(ctx)
		return c >= lsn, err
	})
	if err != nil {
		return fmt.Errorf("slot confirmed only %s of %s: %w", c, lsn, err)
	}
	return nil
}

// WalsenderPID is the pid of the walsender serving the slot, 0 if none.
func (o *Outbox) WalsenderPID(ctx context.Context) (int, error) {
	var pid *int
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := o.DB.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name=$1", o.Slot).Scan(&pid); err != nil {
		return 0, fmt.Errorf("slot %s: %w", o.Slot, err)
	}
	if pid == nil {
		return 0, nil
	}
	return *pid, nil
}
