// Package retention proves which outbox rows are delivered and removes
// them once they are older than retention.keep.
//
// The relay never updates a row per event (that would double the WAL and
// put an UPDATE on the hot path). Delivery is proven by transaction
// position instead, with a delivery horizon per slot:
//
//   - A sample reads H = pg_snapshot_xmin(pg_current_snapshot()) and then
//     L = pg_current_wal_insert_lsn(). A transaction leaves the proc array
//     only after its commit record is inserted, so every transaction with
//     an xid below H had finished before L.
//   - The relay confirms the slot past an event only once Kafka acked it
//     or it was dead-lettered. So once the slot's confirmed_flush_lsn >= L,
//     every transaction with an xid below H that committed is delivered:
//     the sample is promoted to the delivered horizon and a new one taken.
//   - Transactions with an xid below the slot's floor may predate the slot
//     (the slot never streamed them): they are never proven by position.
//
// A row is delivered iff published_at IS NOT NULL (set by `outbox-relay
// replay` after the ack, or by an earlier publisher) or the xid of its
// xmin is in [floor_xid, delivered_xid) and, in a partitioned outbox,
// above the xid that made its partition part of the outbox (the xmin of its
// pg_inherits rows: a row loaded into a table before ATTACH PARTITION was
// never streamed). An UPDATE gives a row a newer xmin, which only delays
// its proof.
//
// Every statement reads exactly the rows the slot streams: a plain outbox
// with FROM ONLY (an inheritance child's rows are never streamed as the
// outbox's; while it has children retention pauses, naming them), a
// partitioned one through its root.
//
// The Cleaner is the leader's loop: it samples the horizon, deletes (or
// archives) proven rows, and for a partitioned outbox keeps the partitions
// ahead of now and drops old ones whose rows are all proven. It creates
// no outbox table: `migrate` does (package migrations).
//
// The SQL builders (With, Removable, DeliveredCond, DeleteBatchSQL,
// DryRunSQL, KeepsRowSQL, UnstreamedSQL, PartitionVerdictSQL, CreatePartitionSQL,
// Horizon.PreSlotSQL) and the
// name and range helpers are pure: any goroutine, never blocking. The
// functions and methods that take a connection or a RowQuerier block on
// it, and the caller must not use it from another goroutine meanwhile.
package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// State is one slot's row of the delivery table.
type State struct {
	Slot         string
	FloorXID     uint64
	DeliveredXID uint64 // 0 until the first promotion
	DeliveredLSN pglogrepl.LSN
	DeliveredAt  time.Time // every transaction committed before it is delivered; zero until the first promotion
	PendingXID   uint64
	PendingLSN   pglogrepl.LSN
	PendingAt    time.Time
	PausedReason string // non-empty while retention is paused
	LastRunAt    time.Time
	LastDeleted  int64
}

// Proven reports whether a delivered horizon exists yet.
func (s State) Proven() bool { return s.DeliveredXID != 0 }

// Slot is what the horizon reads of the replication slot.
type Slot struct {
	Exists    bool
	Active    bool // a walsender streams from it now
	Confirmed pglogrepl.LSN
	WALStatus string
}

// Healthy reports why retention must pause, or "" when it may run. A
// missing or invalidated slot means rows may have to be replayed from the
// table: keep them all.
func (s Slot) Healthy() string {
	switch {
	case !s.Exists:
		return "the replication slot does not exist: rows may have to be replayed, so none is deleted"
	case s.WALStatus == "lost":
		return "the replication slot is invalidated (wal_status lost): rows may have to be replayed, so none is deleted"
	case s.WALStatus == "unreserved":
		return "the replication slot is about to lose WAL (wal_status unreserved): rows may have to be replayed, so none is deleted"
	}
	return ""
}

// Horizon reads and advances one slot's delivery horizon.
type Horizon struct {
	Table outboxschema.Table
	Slot  string
	// Publication is the slot's publication. When set, Advance checks that
	// it streams every insert of Table; "" skips the check.
	Publication string
}

func (h Horizon) delivery() string { return h.Table.Sibling(outboxschema.DeliveryTable).Quoted() }
func (h Horizon) registry() string { return h.Table.Sibling(outboxschema.SlotRegistry).Quoted() }

const stateCols = `floor_xid::text, coalesce(delivered_xid::text, '0'), coalesce(delivered_lsn::text, '0/0'), delivered_at,
	coalesce(pending_xid::text, '0'), coalesce(pending_lsn::text, '0/0'), pending_at,
	coalesce(paused_reason, ''), last_run_at, coalesce(last_deleted, 0)`

// ErrNoState is returned by ReadState when the slot has no row yet (the
// leader creates it on its first sample).
var ErrNoState = errors.New("no delivery state for the slot yet")

// RowQuerier is the part of a pgx connection, pool or transaction that
// reads one row.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadState returns the slot's row of the delivery table: ErrNoState when
// the leader has not sampled yet. A missing table (migration 0005 not
// applied) is an error that says to run migrate.
func (h Horizon) ReadState(ctx context.Context, q RowQuerier) (State, error) {
	var (
		st                            State
		floor, dxid, dlsn, pxid, plsn string
		dat, pat, run                 *time.Time
	)
	err := q.QueryRow(ctx, "SELECT "+stateCols+" FROM "+h.delivery()+" WHERE slot_name = $1", h.Slot).
		Scan(&floor, &dxid, &dlsn, &dat, &pxid, &plsn, &pat, &st.PausedReason, &run, &st.LastDeleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{Slot: h.Slot}, ErrNoState
	}
	if err != nil {
		return State{Slot: h.Slot}, fmt.Errorf("read %s for slot %q: %w (run `outbox-relay migrate`: migration 0005 creates it)", h.delivery(), h.Slot, err)
	}
	st.Slot = h.Slot
	var perr error
	parse := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 10, 64)
		perr = errors.Join(perr, err)
		return v
	}
	lsn := func(s string) pglogrepl.LSN {
		v, err := pglogrepl.ParseLSN(s)
		perr = errors.Join(perr, err)
		return v
	}
	st.FloorXID, st.DeliveredXID, st.PendingXID = parse(floor), parse(dxid), parse(pxid)
	st.DeliveredLSN, st.PendingLSN = lsn(dlsn), lsn(plsn)
	for _, p := range []struct {
		from *time.Time
		to   *time.Time
	}{{dat, &st.DeliveredAt}, {pat, &st.PendingAt}, {run, &st.LastRunAt}} {
		if p.from != nil {
			*p.to = *p.from
		}
	}
	if perr != nil {
		return st, fmt.Errorf("parse %s for slot %q: %w", h.delivery(), h.Slot, perr)
	}
	return st, nil
}

// ReadSlot reads the slot's confirmed position and WAL status.
func ReadSlot(ctx context.Context, q RowQuerier, slot string) (Slot, error) {
	var s Slot
	var confirmed, status *string
	err := q.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, wal_status, active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed, &status, &s.Active)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read slot %q: %w", slot, err)
	}
	s.Exists = true
	if status != nil {
		s.WALStatus = *status
	}
	if confirmed != nil {
		if s.Confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return s, fmt.Errorf("parse confirmed_flush_lsn of slot %q: %w", slot, err)
		}
	}
	return s, nil
}

// Advance is one step of the sampler: it creates the slot's state row if
// missing, promotes the pending sample once the slot's confirmed position
// has passed it, takes a new sample when none is pending, and records
// whether retention must pause. Only the leader calls it.
func (h Horizon) Advance(ctx context.Context, conn *pgx.Conn) (State, Slot, error) {
	slot, err := ReadSlot(ctx, conn, h.Slot)
	if err != nil {
		return State{}, slot, err
	}
	reg, err := h.readRegistry(ctx, conn)
	if err != nil {
		return State{}, slot, err
	}
	if err := h.ensureRow(ctx, conn, reg); err != nil {
		return State{}, slot, err
	}
	st, err := h.ReadState(ctx, conn)
	if err != nil {
		return st, slot, err
	}
	reason := slot.Healthy()
	// The publication must stream every insert of the table: an insert it
	// skips is passed by the slot all the same, and its position would
	// prove it delivered. While it does not, pause and raise the floor
	// over every xid assigned so far; raise it once more on the first
	// sample after it is right again, since the last raise may predate
	// the fix.
	pubProblem, err := h.publicationProblem(ctx, conn)
	if err != nil {
		return st, slot, err
	}
	raise := pubProblem != "" || strings.HasPrefix(st.PausedReason, PublicationPause)
	if pubProblem != "" {
		reason = PublicationPause + pubProblem
	}
	// Inheritance children: their rows are never streamed, and every
	// statement here reads the outbox with ONLY, so none is deleted; but
	// the events written into them are lost until moved: say so.
	in, err := pgsetup.ReadInheritance(ctx, conn, h.Table)
	if err != nil {
		return st, slot, err
	}
	if p := in.Problem(); p != "" && reason == "" {
		reason = InheritancePause + p + ". Move their rows into the outbox and detach them: " + in.Fix()
	}
	if raise {
		var xmax string
		if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&xmax); err != nil {
			return st, slot, fmt.Errorf("read the next xid: %w", err)
		}
		x, err := strconv.ParseUint(xmax, 10, 64)
		if err != nil {
			return st, slot, fmt.Errorf("parse xmax %q: %w", xmax, err)
		}
		st = State{Slot: h.Slot, FloorXID: max(x, st.FloorXID, reg.createdXID)}
	}
	switch {
	case reg.missing && reason == "":
		reason = "the slot is not in the slot registry (" + h.registry() + "): it may have been recreated; start the relay (or run migrate) to register it"
	case reg.createdXID > st.FloorXID:
		// The slot was recreated since the floor was set: transactions
		// between the two slots were never streamed, so start over.
		st = State{Slot: h.Slot, FloorXID: reg.createdXID}
	}
	if reason == "" && st.PendingXID != 0 && slot.Confirmed >= st.PendingLSN {
		st.DeliveredXID, st.DeliveredLSN, st.DeliveredAt = st.PendingXID, st.PendingLSN, st.PendingAt
		st.PendingXID = 0
	}
	if reason == "" && st.PendingXID == 0 {
		// Two statements, in this order: the snapshot first, then the
		// insert position. Every xid below xmin had finished (its commit
		// record inserted) before the position is read.
		var xmin string
		var at time.Time
		if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text, clock_timestamp()").Scan(&xmin, &at); err != nil {
			return st, slot, fmt.Errorf("sample the delivery horizon of slot %q: %w", h.Slot, err)
		}
		var lsn string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
			return st, slot, fmt.Errorf("sample the delivery horizon of slot %q: %w", h.Slot, err)
		}
		x, err := strconv.ParseUint(xmin, 10, 64)
		if err != nil {
			return st, slot, fmt.Errorf("parse snapshot xmin %q: %w", xmin, err)
		}
		l, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			return st, slot, fmt.Errorf("parse insert lsn %q: %w", lsn, err)
		}
		// The floor can only rise to a sample that is already proven:
		// never prove a transaction below the floor.
		st.PendingXID, st.PendingLSN, st.PendingAt = max(x, st.FloorXID), l, at
	}
	st.PausedReason = reason
	_, err = conn.Exec(ctx, "UPDATE "+h.delivery()+` SET floor_xid = $9::xid8, delivered_xid = nullif($2, '0')::xid8, delivered_lsn = $3::pg_lsn,
		delivered_at = $4, pending_xid = nullif($5, '0')::xid8, pending_lsn = $6::pg_lsn, pending_at = $7,
		paused_reason = nullif($8, ''), updated_at = now() WHERE slot_name = $1`,
		h.Slot, xidString(st.DeliveredXID), st.DeliveredLSN.String(), nullTime(st.DeliveredAt),
		xidString(st.PendingXID), st.PendingLSN.String(), nullTime(st.PendingAt), reason, xidString(st.FloorXID))
	if err != nil {
		return st, slot, fmt.Errorf("write %s for slot %q: %w", h.delivery(), h.Slot, err)
	}
	return st, slot, nil
}

// ensureRow creates the slot's state row. Its floor is the slot registry's
// created_xid, read right after the slot was created; for a slot created
// before migration 0005 (or without a registry) it is the current xmax,
// later than the slot's start: rows before it stay unproven, never wrongly
// proven.
func (h Horizon) ensureRow(ctx context.Context, conn *pgx.Conn, reg registration) error {
	floor, args := "pg_snapshot_xmax(pg_current_snapshot())", []any{h.Slot}
	if reg.createdXID != 0 {
		floor, args = "$2::text::xid8", append(args, xidString(reg.createdXID))
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+h.delivery()+" (slot_name, floor_xid) VALUES ($1, "+floor+") ON CONFLICT (slot_name) DO NOTHING", args...); err != nil {
		return fmt.Errorf("create the delivery state of slot %q in %s: %w (run `outbox-relay migrate`: migration 0005 creates the table; the relay's role needs SELECT, INSERT, UPDATE on it)", h.Slot, h.delivery(), err)
	}
	return nil
}

type registration struct {
	missing    bool   // the registry exists and has no row for the slot
	createdXID uint64 // 0 when unknown (registered before migration 0005)
}

func (h Horizon) readRegistry(ctx context.Context, conn RowQuerier) (registration, error) {
	var r registration
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", h.registry()).Scan(&exists); err != nil || !exists {
		return r, err
	}
	var xid *string
	err := conn.QueryRow(ctx, "SELECT created_xid::text FROM "+h.registry()+" WHERE slot_name = $1", h.Slot).Scan(&xid)
	if errors.Is(err, pgx.ErrNoRows) {
		r.missing = true
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("read slot registry %s: %w", h.registry(), err)
	}
	if xid != nil {
		if r.createdXID, err = strconv.ParseUint(*xid, 10, 64); err != nil {
			return r, fmt.Errorf("parse created_xid %q of slot %q: %w", *xid, h.Slot, err)
		}
	}
	return r, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// PublicationPause starts the paused_reason Advance records while the
// publication does not stream every insert of the outbox.
const PublicationPause = "the publication does not stream every insert of the outbox table, so the slot passes rows it never delivered (rows written until it is fixed stay until replayed): "

// InheritancePause starts the paused_reason Advance records while a plain
// outbox table has inheritance children (pgsetup.Inheritance).
const InheritancePause = "inheritance children of the outbox table hold events the slot never streams: "

// publicationProblem says why h.Publication does not stream every insert
// of h.Table whole (pgsetup.Shape.Problems, with their fixes), or "".
func (h Horizon) publicationProblem(ctx context.Context, conn *pgx.Conn) (string, error) {
	if h.Publication == "" {
		return "", nil
	}
	shape, err := pgsetup.ReadShape(ctx, conn, h.Publication, outboxschema.DefaultMapping(h.Table), []outboxschema.Table{h.Table})
	if err != nil {
		return "", err
	}
	var ps []string
	for _, p := range shape.Problems() {
		ps = append(ps, p.What+" (fix: "+pgsetup.Statement(p.Fix)+")")
	}
	return strings.Join(ps, "; "), nil
}
