package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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

// Undelivered counts rows not yet proven delivered, cheaply: the rows
// created after the delivered horizon's sample time (an index range scan
// on created_at), at most limit (capped then reports true). The bound:
// it over-counts the rows delivered since that sample (about two sample
// intervals of writes when healthy) and misses undelivered rows whose
// created_at is older than the sample: transactions open since before it,
// or a created_at set by hand. Before the first promotion it counts the
// rows with published_at unset.
func (h Horizon) Undelivered(ctx context.Context, q RowQuerier, st State, limit int64) (n int64, capped bool, err error) {
	from, err := h.From(ctx, q)
	if err != nil {
		return 0, false, err
	}
	sql := "SELECT count(*) FROM (SELECT 1 FROM " + from + " WHERE published_at IS NULL"
	args := []any{limit}
	if st.Proven() {
		sql += " AND created_at > $2"
		args = append(args, st.DeliveredAt)
	}
	sql += " LIMIT $1) u"
	if err := q.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("count undelivered rows of %s: %w", h.Table, err)
	}
	return n, n >= limit, nil
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
