package replay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// row is one outbox row as read for replay.
type row struct {
	id      int64
	text    decoder.RowText
	created time.Time
}

// filter is the part of the WHERE clause beside the id bounds: which dead
// letters, the created_at range and the type filters, with its arguments
// numbered from $first. created_at ranges can use the
// <table>_created_at_idx index.
func (o Options) filter(first int) (string, []any) {
	// A dead-lettered row is left out unless asked for, and a resolved one
	// always: dlq replay published its event again as a new row (which a
	// replay covers: same event_id, so this one would only repeat it),
	// and dlq resolve closed it on purpose.
	sql := []string{"dead_lettered_at IS NULL"}
	if o.IncludeDeadLetters {
		sql[0] = "dlq_resolved_at IS NULL"
	}
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		sql = append(sql, fmt.Sprintf(cond, "$"+strconv.Itoa(first+len(args)-1)))
	}
	if !o.Since.IsZero() {
		add("created_at >= %s", o.Since)
	}
	if !o.Until.IsZero() {
		add("created_at < %s", o.Until)
	}
	if o.AggregateType != "" {
		add("aggregate_type = %s", o.AggregateType)
	}
	if o.EventType != "" {
		add("event_type = %s", o.EventType)
	}
	return " AND " + strings.Join(sql, " AND "), args
}

// queries are the SQL statements of one replay of table (quoted).
type queries struct {
	lo, hi string // the id bounds, when they come from the created_at range ("" = from the flags)
	count  string // $1 lo, $2 hi, then the filter's
	page   string // $1 after, $2 hi, $3 limit, then the filter's
	args   []any  // the filter's arguments
	pageAt int    // first filter argument of page
}

// columns says which optional columns the table has: headers, and the
// identity columns of migration 0006 (event_id uuid, dlq_replay_of bigint).
type columns struct{ headers, eventID, replayOf bool }

// buildQueries returns the statements for a table with cols. Every
// statement reads an id range (the primary key) or a created_at range (the
// created_at index), never with OFFSET.
func buildQueries(table string, cols columns, o Options) queries {
	var q queries
	if o.FromID == 0 {
		q.lo = "SELECT min(id) FROM " + table + " WHERE created_at >= $1"
	}
	switch {
	case o.ToID > 0:
	case !o.Until.IsZero():
		q.hi = "SELECT max(id) FROM " + table + " WHERE created_at < $1"
	default:
		q.hi = "SELECT max(id) FROM " + table
	}
	where, args := o.filter(3)
	q.count = "SELECT count(*) FROM " + table + " WHERE id >= $1 AND id <= $2" + where
	opt := func(has bool, col string) string {
		if has {
			return col + "::text"
		}
		return "NULL::text"
	}
	where, _ = o.filter(4)
	// Text output of every column: the bytes pgoutput sends for them.
	q.page = "SELECT id, id::text AS id_text, aggregate_type::text AS aggregate_type_text, aggregate_id::text AS aggregate_id_text, " +
		"event_type::text AS event_type_text, payload::text AS payload_text, " + opt(cols.headers, "headers") + " AS headers_text, " +
		opt(cols.eventID, "event_id") + " AS event_id_text, " + opt(cols.replayOf, "dlq_replay_of") + " AS dlq_replay_of_text, " +
		"created_at FROM " + table + " WHERE id > $1 AND id <= $2" + where + " ORDER BY id LIMIT $3"
	q.args = args
	return q
}

// pageFunc reads at most limit rows with id > after, in id order.
type pageFunc func(ctx context.Context, after int64, limit int) ([]row, error)

// readPages reads every row with id > after through page, size rows at a
// time (keyset pagination: each page starts after the last id of the one
// before), and calls emit on each in id order. It stops at the first short
// page, or when emit or page fails. At most one page is held in memory.
func readPages(ctx context.Context, page pageFunc, after int64, size int, emit func(row) error) error {
	for {
		rows, err := page(ctx, after, size)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.id <= after {
				return fmt.Errorf("read outbox rows: id %d after id %d: rows must come in increasing id order", r.id, after)
			}
			if err := emit(r); err != nil {
				return err
			}
			after = r.id
		}
		if len(rows) < size {
			return nil
		}
	}
}
