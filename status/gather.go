// Package status answers "is the relay healthy, and is event N delivered?"
// from PostgreSQL alone, so it works while every relay is down: Gather reads
// the facts (lease, slot, delivery horizon, DLQ, oldest row, retention
// state), Evaluate turns them into checks (package report's, status's
// verdicts ok, warn and bad) each with what to do, and Text and JSON render
// the Report. `outbox-relay status` wires it.
package status

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/retention"
)

// SampleInterval is how often the leader samples the delivery horizon
// (retention.SampleInterval, not a config key): lag_seconds is an upper
// bound that overstates by up to two of them.
const SampleInterval = retention.SampleInterval

// Options is what Gather reads and how.
type Options struct {
	Table         outboxschema.Table
	Slot          string
	LeaderEnabled bool          // leader.enabled
	LeaseTTL      time.Duration // leader.lease_ttl
	// Keep is retention.keep; nil when not known (then no verdict depends
	// on it).
	Keep *time.Duration
	// UndeliveredLimit caps the undelivered count (default 100000).
	UndeliveredLimit int64
	// ScanTimeout bounds the full-table count of pre-slot rows (default 2s).
	ScanTimeout time.Duration
	// EventID > 0 asks only "is row EventID delivered?".
	EventID int64
	// MessagesPrefix is messages.prefix ("" when off): message events are
	// in no table, so the row counts do not see them.
	MessagesPrefix string
	// SlotFailover and StandbySlots are postgres.slot_failover and
	// postgres.standby_slots: when either is on, the failover checks say
	// whether it protects against phantom events now.
	SlotFailover bool
	StandbySlots []string
	// Mapped: the relay reads its tables through a column mapping
	// (compat, columns, tables): they have no delivery horizon, dead-letter
	// columns or created_at, so only the leader and the slot are read.
	Mapped bool
}

// Facts are the raw readings; JSON field names are stable (docs/commands.md).
type Facts struct {
	At    time.Time `json:"at"` // the server's clock; every age is against it
	Table string    `json:"table"`
	Slot  string    `json:"slot"`
	// MessagesPrefix is messages.prefix when set: undelivered and
	// oldest_row count outbox rows only, never message events.
	MessagesPrefix string          `json:"messages_prefix,omitempty"`
	Mapped         bool            `json:"mapped,omitempty"` // Options.Mapped: no delivery, DLQ, oldest row or retention facts
	Leader         *LeaderFacts    `json:"leader,omitempty"`
	SlotInfo       *SlotFacts      `json:"replication_slot,omitempty"`
	Delivery       *DeliveryFacts  `json:"delivery,omitempty"`
	DLQ            *DLQFacts       `json:"dlq,omitempty"`
	Oldest         *OldestFacts    `json:"oldest_row,omitempty"`
	Retention      *RetentionFacts `json:"retention,omitempty"`
	Event          *EventFacts     `json:"event,omitempty"`
	// Failover is read when postgres.slot_failover or standby_slots is on.
	Failover *pgsetup.FailoverFacts `json:"failover,omitempty"`
	// Options.SlotFailover and StandbySlots, for Evaluate.
	SlotFailover bool     `json:"slot_failover,omitempty"`
	StandbySlots []string `json:"standby_slots,omitempty"`
	// ConnectError is set when PostgreSQL could not be reached: the
	// driver's message, which may hold the password of the URL (the caller
	// removes it: `outbox-relay status` does).
	ConnectError string `json:"connect_error,omitempty"`
}

// LeaderFacts is the lease row of the slot.
type LeaderFacts struct {
	Enabled         bool       `json:"enabled"`
	LeaseTTLSeconds float64    `json:"lease_ttl_seconds"`
	TableMissing    bool       `json:"table_missing"`
	Found           bool       `json:"found"`
	Holder          string     `json:"holder,omitempty"`
	Epoch           int64      `json:"epoch,omitempty"`
	HolderPID       *int32     `json:"holder_pid,omitempty"`
	RenewedAt       *time.Time `json:"renewed_at,omitempty"`
	RenewedAge      float64    `json:"renewed_age_seconds"`
	Error           string     `json:"error,omitempty"`
}

// SlotFacts is the replication slot and its registry row.
type SlotFacts struct {
	Exists          bool       `json:"exists"`
	ActivePID       *int32     `json:"active_pid"`
	ConfirmedFlush  string     `json:"confirmed_flush_lsn,omitempty"`
	LagBytes        *int64     `json:"lag_bytes"`      // pg_current_wal_lsn() - confirmed_flush_lsn
	RetainedBytes   *int64     `json:"retained_bytes"` // pg_current_wal_lsn() - restart_lsn
	WALStatus       string     `json:"wal_status,omitempty"`
	SafeWALSize     *int64     `json:"safe_wal_size"` // null: max_slot_wal_keep_size = -1 (no limit)
	RegistryMissing bool       `json:"registry_missing"`
	Registered      bool       `json:"registered"`
	RegisteredAt    *time.Time `json:"registered_at,omitempty"`
	Error           string     `json:"error,omitempty"`
}

// DeliveryFacts is the slot's delivery horizon (package retention) and what
// it proves.
type DeliveryFacts struct {
	TableMissing bool       `json:"table_missing"`
	StateFound   bool       `json:"state_found"`
	FloorXID     uint64     `json:"floor_xid,omitempty"`
	DeliveredXID uint64     `json:"delivered_xid,omitempty"`
	DeliveredAt  *time.Time `json:"delivered_at,omitempty"`
	// LagSecondsBound is now - delivered_at: every event committed before
	// delivered_at is delivered, so the oldest undelivered one is younger.
	LagSecondsBound       *float64 `json:"lag_seconds_bound"`
	SampleIntervalSeconds float64  `json:"sample_interval_seconds"`
	Undelivered           *int64   `json:"undelivered"`
	UndeliveredCapped     bool     `json:"undelivered_capped"`
	// UndeliveredExact: the slot confirmed past the count's snapshot, so
	// Undelivered is exact (retention.Count); false: a bound.
	UndeliveredExact bool   `json:"undelivered_exact"`
	PreSlotRows      *int64 `json:"pre_slot_rows"`
	PreSlotMinID     int64  `json:"pre_slot_min_id,omitempty"`
	PreSlotMaxID     int64  `json:"pre_slot_max_id,omitempty"`
	PreSlotError     string `json:"pre_slot_error,omitempty"`
	PreSlotSQL       string `json:"pre_slot_sql,omitempty"`
	Error            string `json:"error,omitempty"`
}

// DLQFacts counts dead-lettered rows nobody replayed or resolved.
type DLQFacts struct {
	ColumnsMissing bool   `json:"columns_missing"`
	Unresolved     int64  `json:"unresolved"`
	Error          string `json:"error,omitempty"`
}

// OldestFacts is the oldest row of the outbox (min created_at).
type OldestFacts struct {
	Empty      bool       `json:"empty"`
	CreatedAt  *time.Time `json:"created_at,omitempty"`
	AgeSeconds float64    `json:"age_seconds"`
	Error      string     `json:"error,omitempty"`
}

// RetentionFacts is the retention state of the slot's delivery row.
type RetentionFacts struct {
	KeepSeconds  *float64   `json:"keep_seconds"` // null: retention.keep not known to this build
	PausedReason string     `json:"paused_reason,omitempty"`
	LastRunAt    *time.Time `json:"last_run_at,omitempty"`
	LastDeleted  int64      `json:"last_deleted"`
}

// EventFacts answers "is row ID delivered?".
type EventFacts struct {
	ID             int64      `json:"id"`
	Found          bool       `json:"found"`
	Delivered      bool       `json:"delivered"`
	Reason         string     `json:"reason"` // see the Reason* constants
	XID            uint64     `json:"xid,omitempty"`
	PublishedAt    *time.Time `json:"published_at,omitempty"`
	DeadLetteredAt *time.Time `json:"dead_lettered_at,omitempty"`
	Error          string     `json:"error,omitempty"`
}

// Reasons an event is or is not delivered (EventFacts.Reason).
const (
	ReasonPublished   = "published_at"       // published_at is set (replay or an earlier publisher)
	ReasonHorizon     = "horizon"            // its xid is in [floor_xid, delivered_xid)
	ReasonNewer       = "newer_than_horizon" // not yet: at or above delivered_xid
	ReasonPredates    = "predates_slot"      // below floor_xid: never proven by position
	ReasonUnstreamed  = "before_attach"      // written into its partition before it was attached: never streamed
	ReasonNoHorizon   = "no_horizon"         // no delivery state (or no promotion) yet
	ReasonNotFound    = "not_found"          // no such row: never inserted, or deleted after delivery
	ReasonUnreadable  = "error"              // the row or the state could not be read
	defaultLimit      = 100000
	defaultScanTimout = 2 * time.Second
)

// Querier is the part of *pgx.Conn Gather uses.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Gather reads every fact from PostgreSQL; a failed reading is recorded in
// its section (Error, TableMissing), never fatal, so one missing migration
// still shows everything else. It only reads. Blocks; one goroutine.
func Gather(ctx context.Context, q Querier, o Options) Facts {
	if o.UndeliveredLimit <= 0 {
		o.UndeliveredLimit = defaultLimit
	}
	if o.ScanTimeout <= 0 {
		o.ScanTimeout = defaultScanTimout
	}
	f := Facts{Table: o.Table.String(), Slot: o.Slot, MessagesPrefix: o.MessagesPrefix, SlotFailover: o.SlotFailover, StandbySlots: o.StandbySlots}
	if err := q.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&f.At); err != nil {
		f.ConnectError = err.Error()
		return f
	}
	if o.EventID <= 0 && (o.SlotFailover || len(o.StandbySlots) > 0) {
		ff := pgsetup.ReadFailover(ctx, q, o.Slot, o.StandbySlots)
		f.Failover = &ff
	}
	if o.Mapped {
		f.Mapped = true
		f.Leader = gatherLeader(ctx, q, o, f.At)
		f.SlotInfo = gatherSlot(ctx, q, o)
		return f
	}
	h := retention.Horizon{Table: o.Table, Slot: o.Slot}
	d, st := gatherDelivery(ctx, q, h, o, f.At)
	if o.EventID > 0 {
		f.Event = gatherEvent(ctx, q, h, d, st, o.EventID)
		return f
	}
	f.Delivery = d
	f.Leader = gatherLeader(ctx, q, o, f.At)
	f.SlotInfo = gatherSlot(ctx, q, o)
	f.DLQ = gatherDLQ(ctx, q, o)
	f.Oldest = gatherOldest(ctx, q, h, f.At)
	f.Retention = &RetentionFacts{PausedReason: st.PausedReason, LastDeleted: st.LastDeleted, LastRunAt: timePtr(st.LastRunAt)}
	if o.Keep != nil {
		k := o.Keep.Seconds()
		f.Retention.KeepSeconds = &k
	}
	return f
}

func tableExists(ctx context.Context, q Querier, t outboxschema.Table) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Quoted()).Scan(&ok)
	return ok, err
}

func gatherLeader(ctx context.Context, q Querier, o Options, now time.Time) *LeaderFacts {
	l := &LeaderFacts{Enabled: o.LeaderEnabled, LeaseTTLSeconds: o.LeaseTTL.Seconds()}
	lease := o.Table.Sibling(outboxschema.LeaseTable)
	ok, err := tableExists(ctx, q, lease)
	if err != nil {
		l.Error = err.Error()
		return l
	}
	if !ok {
		l.TableMissing = true
		return l
	}
	var renewed time.Time
	err = q.QueryRow(ctx, "SELECT holder, epoch, holder_pid, renewed_at FROM "+lease.Quoted()+" WHERE slot_name = $1", o.Slot).
		Scan(&l.Holder, &l.Epoch, &l.HolderPID, &renewed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		l.Error = fmt.Sprintf("read %s: %v", lease, err)
	default:
		l.Found, l.RenewedAt, l.RenewedAge = true, &renewed, now.Sub(renewed).Seconds()
	}
	return l
}

func gatherSlot(ctx context.Context, q Querier, o Options) *SlotFacts {
	s := &SlotFacts{}
	var confirmed, walStatus *string
	err := q.QueryRow(ctx, `SELECT active_pid, confirmed_flush_lsn::text, (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint,
		(pg_current_wal_lsn() - restart_lsn)::bigint, wal_status, safe_wal_size FROM pg_replication_slots WHERE slot_name = $1`, o.Slot).
		Scan(&s.ActivePID, &confirmed, &s.LagBytes, &s.RetainedBytes, &walStatus, &s.SafeWALSize)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		s.Error = fmt.Sprintf("read slot %q: %v", o.Slot, err)
	default:
		s.Exists = true
		s.ConfirmedFlush, s.WALStatus = deref(confirmed), deref(walStatus)
	}
	reg := o.Table.Sibling(outboxschema.SlotRegistry)
	ok, err := tableExists(ctx, q, reg)
	switch {
	case err != nil:
		s.Error = joinErr(s.Error, err.Error())
	case !ok:
		s.RegistryMissing = true
	default:
		var at time.Time
		err := q.QueryRow(ctx, "SELECT created_at FROM "+reg.Quoted()+" WHERE slot_name = $1", o.Slot).Scan(&at)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			s.Error = joinErr(s.Error, fmt.Sprintf("read %s: %v", reg, err))
		default:
			s.Registered, s.RegisteredAt = true, &at
		}
	}
	return s
}

func gatherDelivery(ctx context.Context, q Querier, h retention.Horizon, o Options, now time.Time) (*DeliveryFacts, retention.State) {
	d := &DeliveryFacts{SampleIntervalSeconds: SampleInterval.Seconds()}
	ok, err := tableExists(ctx, q, h.Table.Sibling(outboxschema.DeliveryTable))
	if err != nil {
		d.Error = err.Error()
		return d, retention.State{}
	}
	if !ok {
		d.TableMissing = true
		return d, retention.State{}
	}
	st, err := h.ReadState(ctx, q)
	switch {
	case errors.Is(err, retention.ErrNoState):
	case err != nil:
		d.Error = err.Error()
		return d, st
	default:
		d.StateFound, d.FloorXID, d.DeliveredXID = true, st.FloorXID, st.DeliveredXID
		if st.Proven() {
			d.DeliveredAt = &st.DeliveredAt
			lag := max(now.Sub(st.DeliveredAt).Seconds(), 0)
			d.LagSecondsBound = &lag
		}
	}
	if o.EventID > 0 {
		return d, st
	}
	n, err := h.Count(ctx, q, st, o.UndeliveredLimit, retention.ProofWait)
	if err != nil {
		d.Error = joinErr(d.Error, err.Error())
	} else {
		d.Undelivered, d.UndeliveredCapped, d.UndeliveredExact = &n.N, n.Capped, n.Exact
	}
	if d.StateFound {
		if from, err := h.From(ctx, q); err == nil {
			d.PreSlotSQL = h.PreSlotSQL(from)
		}
		p, err := preSlot(ctx, q, h, st, o.ScanTimeout)
		if err != nil {
			d.PreSlotError = err.Error()
		} else {
			d.PreSlotRows, d.PreSlotMinID, d.PreSlotMaxID = &p.Rows, p.MinID, p.MaxID
		}
	}
	return d, st
}

// preSlot counts pre-slot rows under a statement_timeout in a read-only
// transaction, so a huge table costs at most the timeout.
func preSlot(ctx context.Context, q Querier, h retention.Horizon, st retention.State, timeout time.Duration) (retention.PreSlot, error) {
	tx, err := q.Begin(ctx)
	if err != nil {
		return retention.PreSlot{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = %d", timeout.Milliseconds())); err != nil {
		return retention.PreSlot{}, err
	}
	p, err := h.PreSlotRows(ctx, tx, st)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "57014" {
		return p, fmt.Errorf("not counted: the scan of %s took longer than %s", h.Table, timeout)
	}
	return p, err
}

func gatherDLQ(ctx context.Context, q Querier, o Options) *DLQFacts {
	d := &DLQFacts{}
	var has bool
	err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
		o.Table.Quoted(), outboxschema.ColDLQResolvedAt).Scan(&has)
	if err != nil {
		d.Error = err.Error()
		return d
	}
	if !has {
		d.ColumnsMissing = true
		return d
	}
	from, err := pgsetup.From(ctx, q, o.Table)
	if err != nil {
		d.Error = err.Error()
		return d
	}
	if err := q.QueryRow(ctx, "SELECT count(*) FROM "+from+" WHERE dead_lettered_at IS NOT NULL AND dlq_resolved_at IS NULL").Scan(&d.Unresolved); err != nil {
		d.Error = fmt.Sprintf("count dead-lettered rows of %s: %v", o.Table, err)
	}
	return d
}

func gatherOldest(ctx context.Context, q Querier, h retention.Horizon, now time.Time) *OldestFacts {
	o := &OldestFacts{}
	at, ok, err := h.OldestRow(ctx, q)
	switch {
	case err != nil:
		o.Error = err.Error()
	case !ok:
		o.Empty = true
	default:
		o.CreatedAt, o.AgeSeconds = &at, max(now.Sub(at).Seconds(), 0)
	}
	return o
}

func gatherEvent(ctx context.Context, q Querier, h retention.Horizon, d *DeliveryFacts, st retention.State, id int64) *EventFacts {
	e := &EventFacts{ID: id, Reason: ReasonUnreadable}
	switch {
	case d.Error != "":
		e.Error = d.Error
		return e
	case d.TableMissing:
		e.Error = "the delivery table " + h.Table.Sibling(outboxschema.DeliveryTable).String() + " does not exist: run `outbox-relay migrate` (migration 0005)"
		return e
	}
	delivered, found, err := h.IsDelivered(ctx, q, st, id)
	if err != nil {
		e.Error = err.Error()
		return e
	}
	if !found {
		e.Reason = ReasonNotFound
		return e
	}
	r, found, err := h.Row(ctx, q, id)
	if err != nil || !found { // deleted between the two reads
		e.Error = fmt.Sprintf("read row %d: %v", id, err)
		return e
	}
	e.Found, e.Delivered, e.XID, e.PublishedAt, e.DeadLetteredAt = true, delivered, r.XID, r.PublishedAt, r.DeadLetteredAt
	e.Reason = EventReason(r, st)
	return e
}

// EventReason says why a row is or is not delivered under state st (the
// same rule as retention.DeliveredCond). Pure.
func EventReason(r retention.Row, st retention.State) string {
	switch {
	case r.PublishedAt != nil:
		return ReasonPublished
	case r.Unstreamed:
		return ReasonUnstreamed
	case st.FloorXID != 0 && r.XID < st.FloorXID:
		return ReasonPredates
	case !st.Proven():
		return ReasonNoHorizon
	case r.XID < st.DeliveredXID:
		return ReasonHorizon
	}
	return ReasonNewer
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
