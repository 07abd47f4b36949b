package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// curCTE reads the next xid to be assigned once per statement, to widen
// each row's 32-bit xmin to a 64-bit xid.
const curCTE = "c AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS cur)"

// widened is the 64-bit xid of row o's xmin: the same epoch as the next
// xid unless its low 32 bits are above the next xid's, then the previous
// one. Exact for every row younger than 2^31 transactions, which
// PostgreSQL's own wraparound protection keeps far away.
const widened = "(((c.cur >> 32) - (CASE WHEN o.xmin::text::bigint > (c.cur & 4294967295) THEN 1 ELSE 0 END)) << 32 | o.xmin::text::bigint)"

// DeliveredCond is the SQL condition "row o is delivered" for a statement
// whose FROM has the outbox as o and the CTE c (see With), with the floor
// and delivered xids bound to the parameters named (e.g. "$1", "$2").
// Pass the values from Args.
func DeliveredCond(floor, delivered string) string {
	return "(o.published_at IS NOT NULL OR (" + widened + " >= " + floor + " AND " + widened + " < " + delivered + "))"
}

// With is the WITH clause DeliveredCond needs.
func With() string { return "WITH " + curCTE + " " }

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
	floor, upto := st.Args()
	err = q.QueryRow(ctx, With()+"SELECT "+DeliveredCond("$2", "$3")+" FROM "+h.Table.Quoted()+" o, c WHERE o.id = $1 LIMIT 1",
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
	sql := "SELECT count(*) FROM (SELECT 1 FROM " + h.Table.Quoted() + " WHERE published_at IS NULL"
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
	var t *time.Time
	if err := q.QueryRow(ctx, "SELECT min(created_at) FROM "+h.Table.Quoted()).Scan(&t); err != nil {
		return at, false, fmt.Errorf("read the oldest row of %s: %w", h.Table, err)
	}
	if t == nil {
		return at, false, nil
	}
	return *t, true, nil
}

func xidString(x uint64) string { return strconv.FormatUint(x, 10) }
