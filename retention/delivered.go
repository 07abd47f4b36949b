package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// curCTE reads the next xid to be assigned once per statement, to widen
// each row's 32-bit xmin to a 64-bit xid.
const curCTE = "c AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS cur)"

// widen is the 64-bit xid of a 32-bit xid (e.g. "o.xmin"): the same
// epoch as the next xid unless its low 32 bits are above the next xid's,
// then the previous one. Exact for every xid younger than 2^31
// transactions, which PostgreSQL's own wraparound protection keeps far
// away; an older one reads as newer, never older.
func widen(x string) string {
	return "(((c.cur >> 32) - (CASE WHEN " + x + "::text::bigint > (c.cur & 4294967295) THEN 1 ELSE 0 END)) << 32 | " + x + "::text::bigint)"
}

// widened is the 64-bit xid of row o's xmin (see widen).
var widened = widen("o.xmin")

// attachedCTE is, for each leaf partition of the outbox root (a quoted
// name), the 64-bit xid that made it, and every partition above it, a
// partition of the outbox: the newest xmin of their pg_inherits rows
// (written by CREATE TABLE ... PARTITION OF and by ATTACH PARTITION). A
// row written at or before it was written into a table that was not yet
// part of the outbox, so the slot never streamed it (see unstreamed).
// Empty for a plain table read with ONLY.
func attachedCTE(root string) string {
	tree := "pg_partition_tree(to_regclass(" + outboxschema.QuoteLiteral(root) + "))"
	return "a AS MATERIALIZED (SELECT t.relid AS rel, max(" + widen("i.xmin") + ") AS x FROM " + tree + " t, " + tree + " m, c, " +
		"LATERAL pg_partition_ancestors(t.relid) p, pg_inherits i " +
		"WHERE t.isleaf AND m.relid = p.relid AND m.level > 0 AND i.inhrelid = p.relid GROUP BY t.relid)"
}

// unstreamed is the SQL condition "row o was written into its partition
// before that partition was attached to the outbox" (the CTE a of With):
// the slot never streamed it, so no position proves it; only published_at
// (`outbox-relay replay`) does.
var unstreamed = "(" + widened + " <= coalesce((SELECT a.x FROM a WHERE a.rel = o.tableoid), 0))"

// DeliveredCond is the SQL condition "row o is delivered" for a statement
// whose FROM has the outbox as o and the CTEs of With, with the floor and
// delivered xids bound to the parameters named (e.g. "$1", "$2"). Pass
// the values from Args.
func DeliveredCond(floor, delivered string) string {
	return "(o.published_at IS NOT NULL OR (" + widened + " >= " + floor + " AND " + widened + " < " + delivered + " AND NOT " + unstreamed + "))"
}

// With is the WITH clause DeliveredCond needs, for the outbox root (a
// quoted name; a partition's rows are judged by the root's tree).
func With(root string) string { return "WITH " + curCTE + ", " + attachedCTE(root) + " " }

// Args are the floor and delivered xids for DeliveredCond's parameters.
// Before the first promotion nothing is proven by position.
func (s State) Args() (floor, delivered int64) {
	if s.DeliveredXID == 0 {
		return 0, 0
	}
	return int64(s.FloorXID), int64(s.DeliveredXID)
}

// IsDelivered answers "is outbox row id delivered?" for status and tests.
// found is false when no such row exists (never inserted, or deleted).
func (h Horizon) IsDelivered(ctx context.Context, q RowQuerier, st State, id int64) (delivered, found bool, err error) {
	from, err := h.From(ctx, q)
	if err != nil {
		return false, false, err
	}
	floor, upto := st.Args()
	err = q.QueryRow(ctx, With(h.Table.Quoted())+"SELECT "+DeliveredCond("$2", "$3")+" FROM "+from+" o, c WHERE o.id = $1 LIMIT 1",
		id, floor, upto).Scan(&delivered)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("is row %d of %s delivered: %w", id, h.Table, err)
	}
	return delivered, true, nil
}

// ProofWait is how long Count waits, at most, for the slot to confirm past
// its snapshot. The relay confirms within about status_interval plus
// heartbeat.interval (1 s each by default).
const ProofWait = 3 * time.Second

// Count is an undelivered count.
type Count struct {
	// N rows not proven delivered; with Capped the count stopped at the
	// limit: at least N.
	N      int64
	Capped bool
	// Exact: the slot confirmed past every transaction the count's
	// snapshot saw, so every row it left out is delivered and each row
	// it counted is not (published_at unset and below the slot's floor:
	// written before the slot, never streamed by it). Then N is 0 when
	// the relay is caught up.
	//
	// Not Exact: N is a bound by the stored delivered horizon. It
	// over-counts the rows delivered since that horizon's sample (about
	// two sample intervals of writes) and misses undelivered rows whose
	// created_at is older than the sample (transactions open since before
	// it, a created_at set by hand).
	Exact bool
}

// TxQuerier is the part of a pgx connection Count uses.
type TxQuerier interface {
	RowQuerier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Count counts the rows not proven delivered, cheaply: among the rows with
// published_at unset and created_at after the delivered horizon's sample
// (all of them before the first promotion; an index range scan on
// created_at), at most limit, those the horizon does not prove.
//
// It counts in a read-only REPEATABLE READ snapshot S, then reads the WAL
// insert position L. Every transaction S sees had inserted its commit
// record before L. Once the slot has confirmed L, every row S sees with an
// xid at or above the slot's floor is delivered, so the count is exact.
// Count polls the slot for that (every 100 ms, up to wait; not at all when
// no walsender streams from it), only while the state is proven sound (a
// state row, retention not paused, the slot registered as the floor's and
// healthy). Otherwise, or when the slot does not confirm in time, it
// returns the bound by the stored horizon (Exact false). st is the state
// as read or advanced just before. It blocks on q (at most about wait plus
// the queries), which the caller must not use meanwhile.
func (h Horizon) Count(ctx context.Context, q TxQuerier, st State, limit int64, wait time.Duration) (Count, error) {
	provable := st.FloorXID != 0 && st.PausedReason == ""
	from, err := h.From(ctx, q)
	if err != nil {
		return Count{}, err
	}
	tx, err := q.Begin(ctx)
	if err != nil {
		return Count{}, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return Count{}, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	// Two statements, in this order: the snapshot first (the first
	// statement of the transaction takes it), then the insert position.
	var xmax string
	var recovery bool
	if err := tx.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text, pg_is_in_recovery()").Scan(&xmax, &recovery); err != nil {
		return Count{}, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	provable = provable && !recovery
	var at pglogrepl.LSN
	if provable {
		var l string
		if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&l); err != nil {
			return Count{}, fmt.Errorf("count undelivered rows of %s: read the WAL insert position: %w", h.Table, err)
		}
		if at, err = pglogrepl.ParseLSN(l); err != nil {
			return Count{}, fmt.Errorf("parse insert lsn %q: %w", l, err)
		}
	}
	floor, upto := st.Args()
	fresh := int64(0) // proves nothing unless provable
	if provable {
		x, err := strconv.ParseUint(xmax, 10, 64)
		if err != nil {
			return Count{}, fmt.Errorf("parse snapshot xmax %q: %w", xmax, err)
		}
		fresh = int64(x)
	}
	sql := With(h.Table.Quoted()) + "SELECT count(*), count(*) FILTER (WHERE NOT " + DeliveredCond("$2", "$3") + "), count(*) FILTER (WHERE NOT " + DeliveredCond("$4", "$5") + ")" +
		" FROM (SELECT o.xmin, o.published_at, o.tableoid FROM " + from + " o WHERE o.published_at IS NULL"
	args := []any{limit, floor, upto, int64(st.FloorXID), fresh}
	if st.Proven() {
		sql += " AND o.created_at > $6"
		args = append(args, st.DeliveredAt)
	}
	sql += " LIMIT $1) o, c"
	var seen, bound, exact int64
	if err := tx.QueryRow(ctx, sql, args...).Scan(&seen, &bound, &exact); err != nil {
		return Count{}, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Count{}, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	c := Count{N: bound, Capped: seen >= limit}
	if !provable {
		return c, nil
	}
	ok, err := h.waitConfirmed(ctx, q, at, wait)
	if err != nil || !ok {
		return c, err
	}
	// Read after the wait: a slot recreated meanwhile (registered with a
	// newer created_xid) never streamed what the old one left.
	reg, err := h.readRegistry(ctx, q)
	if err != nil || reg.missing || reg.createdXID > st.FloorXID {
		return c, err
	}
	c.N, c.Exact = exact, true
	return c, nil
}

// waitConfirmed polls the slot until it is healthy and has confirmed lsn
// (true), or wait passes, or no walsender streams from it (false).
func (h Horizon) waitConfirmed(ctx context.Context, q RowQuerier, lsn pglogrepl.LSN, wait time.Duration) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		s, err := ReadSlot(ctx, q, h.Slot)
		if err != nil {
			return false, err
		}
		if s.Healthy() != "" {
			return false, nil
		}
		if s.Confirmed >= lsn {
			return true, nil
		}
		if !s.Active || !time.Now().Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
		}
	}
}

// OldestRow returns the created_at of the oldest row (ok false when the
// table is empty), by the created_at index.
func (h Horizon) OldestRow(ctx context.Context, q RowQuerier) (at time.Time, ok bool, err error) {
	from, err := h.From(ctx, q)
	if err != nil {
		return at, false, err
	}
	var t *time.Time
	if err := q.QueryRow(ctx, "SELECT min(created_at) FROM "+from).Scan(&t); err != nil {
		return at, false, fmt.Errorf("read the oldest row of %s: %w", h.Table, err)
	}
	if t == nil {
		return at, false, nil
	}
	return *t, true, nil
}

// From is the FROM item that reads exactly the outbox rows the slot
// streams (pgsetup.From): ONLY for a plain table. Blocks on one query.
func (h Horizon) From(ctx context.Context, q RowQuerier) (string, error) {
	return pgsetup.From(ctx, q, h.Table)
}

func xidString(x uint64) string { return strconv.FormatUint(x, 10) }
