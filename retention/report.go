package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Row is what `outbox-relay status --id N` needs to say why one outbox
// row is or is not delivered.
type Row struct {
	XID            uint64     // the 64-bit xid of the row's xmin (see widened)
	PublishedAt    *time.Time // set by replay or an earlier publisher
	DeadLetteredAt *time.Time // the event went to the dead-letter topic
	// Unstreamed: written into its partition before that partition was
	// attached to the outbox, so the slot never streamed it.
	Unstreamed bool
}

// Row reads outbox row id's xid and marks; found is false when no such row
// exists. Read only; any goroutine; blocks on one query.
func (h Horizon) Row(ctx context.Context, q RowQuerier, id int64) (r Row, found bool, err error) {
	from, err := h.From(ctx, q)
	if err != nil {
		return r, false, err
	}
	var xid string
	err = q.QueryRow(ctx, With(h.Table.Quoted())+"SELECT "+widened+"::text, o.published_at, o.dead_lettered_at, "+unstreamed+" FROM "+from+" o, c WHERE o.id = $1 LIMIT 1", id).
		Scan(&xid, &r.PublishedAt, &r.DeadLetteredAt, &r.Unstreamed)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read row %d of %s: %w", id, h.Table, err)
	}
	if r.XID, err = strconv.ParseUint(xid, 10, 64); err != nil {
		return r, true, fmt.Errorf("parse the xid %q of row %d: %w", xid, id, err)
	}
	return r, true, nil
}

// PreSlot is the set of rows that may predate the slot: published_at unset
// and an xid below the slot's floor, so never proven delivered and never
// deleted by retention.
type PreSlot struct {
	Rows         int64
	MinID, MaxID int64 // 0 when Rows is 0
}

// PreSlotSQL is the query PreSlotRows runs, with the floor xid as $1, for an
// operator to run by hand; from is the outbox's FROM item (Horizon.From).
func (h Horizon) PreSlotSQL(from string) string {
	return With(h.Table.Quoted()) + "SELECT count(*), coalesce(min(o.id), 0), coalesce(max(o.id), 0) FROM " + from +
		" o, c WHERE o.published_at IS NULL AND " + widened + " < $1"
}

// PreSlotRows counts the rows below st's floor that are not published. It
// reads the whole table (no index holds xmin): run it under a
// statement_timeout. Read only; any goroutine; blocks on one query.
func (h Horizon) PreSlotRows(ctx context.Context, q RowQuerier, st State) (PreSlot, error) {
	var p PreSlot
	from, err := h.From(ctx, q)
	if err != nil {
		return p, err
	}
	if err := q.QueryRow(ctx, h.PreSlotSQL(from), int64(st.FloorXID)).Scan(&p.Rows, &p.MinID, &p.MaxID); err != nil {
		return p, fmt.Errorf("count the rows of %s that predate slot %q: %w", h.Table, h.Slot, err)
	}
	return p, nil
}
