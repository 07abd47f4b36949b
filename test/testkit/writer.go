package testkit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Event is one outbox row a Writer committed.
type Event struct {
	ID      int64
	Type    string // aggregate_type
	Agg     string // aggregate_id, the Kafka key
	Seq     int    // 1-based position within its aggregate, in commit order
	Written int    // events committed before this one (its place in the workload)
	Txn     int64  // the writer's PostgreSQL transaction (1, 2, ... in commit order)
	// EventID is the row's event_id column as committed (migration 0006),
	// "" when NULL or absent (a message event, a table not migrated).
	EventID string
}

// Identity is the event_id the relay publishes ev under: its EventID, else
// its id in decimal.
func (ev Event) Identity() string {
	if ev.EventID != "" {
		return ev.EventID
	}
	return strconv.FormatInt(ev.ID, 10)
}

// eventIDSQL reads the event_id column of the row o, NULL on a table
// without one.
const eventIDSQL = "to_jsonb(o)->>'event_id'"

// Headers every event carries (Check verifies them on each record).
const (
	TenantID    = "acme"
	Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// Writer commits outbox rows from one goroutine (Write, BigTxn, WriteMixed,
// Exec), so commit order is program order; Events, Count, Retries and
// LastLSN may be read from any goroutine. A Write transaction is one
// statement, retried across PostgreSQL restarts without ever writing a
// transaction twice; BigTxn and WriteMixed are not retried.
type Writer struct {
	DB      *pgxpool.Pool
	Table   string
	Rand    *rand.Rand       // picks aggregates; the caller's driver may draw from it too
	AggType func(int) string // aggregate_type of aggregate number a

	mu      sync.Mutex
	seqs    map[string]int
	txn     int64 // transaction number, in the payload: finds an ambiguous commit
	events  []Event
	lastLSN pglogrepl.LSN // WAL insert position inside the last event transaction (before its commit)
	retries int           // statements retried after an error
	written atomic.Int64
}

// NewWriter writes to table with rng picking aggregates.
func NewWriter(db *pgxpool.Pool, table string, rng *rand.Rand, aggType func(int) string) *Writer {
	return &Writer{DB: db, Table: table, Rand: rng, AggType: aggType, seqs: map[string]int{}}
}

// retry runs f until it succeeds, riding out PostgreSQL restarts (bounded).
func (w *Writer) retry(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		// A statement is never cut off by ctx: one cancelled while its COMMIT
		// is on the wire may still commit, and rows the test did not record
		// would count as "never written". ctx stops the writer between them.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := f(sctx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		w.mu.Lock()
		w.retries++
		w.mu.Unlock()
		select { // back off before the retry
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Exec runs one statement (not an event), retried like Write.
func (w *Writer) Exec(ctx context.Context, q string) error {
	return w.retry(ctx, func(ctx context.Context) error {
		_, err := w.DB.Exec(ctx, q)
		return err
	})
}

// Write commits one transaction of n events over aggregates 0..aggregates-1
// picked at random, plus, when other != "", one row of that table (which has
// a note column) in the same transaction.
func (w *Writer) Write(ctx context.Context, n, aggregates int, other string) error {
	w.txn++
	types, aggs, nums, seqs := w.plan(n, aggregates)
	q := w.insertSQL(other)
	var got []Event
	var last pglogrepl.LSN // stays 0 for a recovered commit: position unknown
	tried := false
	err := w.retry(ctx, func(ctx context.Context) error {
		got, last = got[:0], 0
		if tried {
			// The outcome of a statement cut off by a restart is unknown:
			// look for its rows before writing them again.
			if err := w.scan(ctx, w.DB, &got, nil, `SELECT id, aggregate_type, aggregate_id, (payload->>'seq')::int, `+eventIDSQL+` FROM `+w.Table+
				` o WHERE payload->>'txn' = $1 ORDER BY id`, strconv.FormatInt(w.txn, 10)); err != nil || len(got) > 0 {
				return err
			}
		}
		tried = true
		return w.scan(ctx, w.DB, &got, &last, q, types, aggs, seqs, nums, w.txn)
	})
	if err != nil {
		return fmt.Errorf("transaction %d: %w", w.txn, err)
	}
	return w.commit(got, n, last)
}

// WriteAround commits one transaction of n events like Write (no other
// table), with mid run inside it after the first half of the events and
// before the rest: a test puts a row of its own (a poison one) among the
// writer's, so the relay publishes it between them. mid's rows are not the
// writer's events. Not retried, like BigTxn; one goroutine, like Write.
func (w *Writer) WriteAround(ctx context.Context, n, aggregates int, mid func(context.Context, pgx.Tx) error) error {
	w.txn++
	types, aggs, nums, seqs := w.plan(n, aggregates)
	q := w.insertSQL("")
	var got []Event
	var last pglogrepl.LSN
	err := pgx.BeginFunc(ctx, w.DB, func(tx pgx.Tx) error {
		h := n / 2
		if err := w.scan(ctx, tx, &got, &last, q, types[:h], aggs[:h], seqs[:h], nums[:h], w.txn); err != nil {
			return err
		}
		if err := mid(ctx, tx); err != nil {
			return fmt.Errorf("mid: %w", err)
		}
		return w.scan(ctx, tx, &got, &last, q, types[h:], aggs[h:], seqs[h:], nums[h:], w.txn)
	})
	if err != nil {
		return fmt.Errorf("transaction %d: %w", w.txn, err)
	}
	return w.commit(got, n, last)
}

// plan picks the aggregates of n events and their seqs (after the ones
// written); the caller writes them in this order.
func (w *Writer) plan(n, aggregates int) (types, aggs []string, nums, seqs []int32) {
	types, aggs, nums, seqs = make([]string, n), make([]string, n), make([]int32, n), make([]int32, n)
	next := map[string]int{}
	for i := range n {
		a := w.Rand.IntN(aggregates)
		types[i], nums[i] = w.AggType(a), int32(a)
		aggs[i] = fmt.Sprintf("%s-%d", types[i], a)
		next[aggs[i]]++
		seqs[i] = int32(w.seqs[aggs[i]] + next[aggs[i]])
	}
	return types, aggs, nums, seqs
}

// insertSQL is Write's statement: $1..$4 the plan's types, aggregates,
// seqs and numbers, $5 the transaction number; it returns each row's id,
// type, aggregate, seq, event_id and the WAL insert position.
func (w *Writer) insertSQL(other string) string {
	otherSQL := "SELECT 1 WHERE false"
	if other != "" {
		otherSQL = "INSERT INTO " + other + " (note) VALUES ('not an event')"
	}
	return `WITH other AS (` + otherSQL + `)
		INSERT INTO ` + w.Table + ` AS o (aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT t, a, t || '.updated',
		       jsonb_build_object('aggregate', a, 'seq', s, 'txn', $5::bigint, 'note', 'café "quoted"', 'amount', k + 0.5),
		       jsonb_build_object('trace_id', 'trace-' || a || '-' || s, 'tenant_id', '` + TenantID + `', 'schema_version', 2,
		                          'traceparent', '` + Traceparent + `')
		FROM unnest($1::text[], $2::text[], $3::int[], $4::int[]) WITH ORDINALITY AS u(t, a, s, k, n) ORDER BY n
		RETURNING id, aggregate_type, aggregate_id, (payload->>'seq')::int, ` + eventIDSQL + `, pg_current_wal_insert_lsn()::text`
}

// commit records the n events of the writer's current transaction, got,
// committed with the WAL insert position last inside it.
func (w *Writer) commit(got []Event, n int, last pglogrepl.LSN) error {
	if len(got) != n {
		return fmt.Errorf("transaction %d: %d rows back, want %d", w.txn, len(got), n)
	}
	for i := range got {
		got[i].Txn = w.txn
	}
	w.add(got, last)
	return nil
}

// BigTxn commits n events in ONE transaction with a single INSERT ... SELECT,
// over k "order" aggregates (order-0, order-3, ...); use it on a writer
// that wrote nothing yet.
func (w *Writer) BigTxn(ctx context.Context, n, k int) error {
	w.txn++
	var got []Event
	err := w.scan(ctx, w.DB, &got, nil, `INSERT INTO `+w.Table+` AS o (aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT 'order', 'order-' || (g % $2) * 3, 'order.updated',
		       jsonb_build_object('aggregate', 'order-' || (g % $2) * 3, 'seq', g / $2 + 1),
		       jsonb_build_object('trace_id', 'trace-order-' || (g % $2) * 3 || '-' || (g / $2 + 1), 'tenant_id', '`+TenantID+`',
		                          'schema_version', 2, 'traceparent', '`+Traceparent+`')
		FROM generate_series(0, $1 - 1) AS g ORDER BY g
		RETURNING id, aggregate_type, aggregate_id, (payload->>'seq')::int, `+eventIDSQL, n, k)
	if err != nil {
		return fmt.Errorf("big transaction: %w", err)
	}
	for i := range got {
		got[i].Txn = w.txn
	}
	w.add(got, 0)
	return nil
}

func (w *Writer) add(got []Event, last pglogrepl.LSN) {
	w.mu.Lock()
	defer w.mu.Unlock()
	base := len(w.events)
	for i := range got {
		got[i].Written = base + i
		w.seqs[got[i].Agg] = max(w.seqs[got[i].Agg], got[i].Seq)
	}
	w.events = append(w.events, got...)
	w.lastLSN = max(w.lastLSN, last)
	w.written.Store(int64(len(w.events)))
}

// querier runs a query on the pool or in a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// scan runs q on db and appends its rows (id, type, aggregate, seq,
// event_id[, lsn]) to got; with last non-nil the sixth column is a WAL
// position, maximised into it.
func (w *Writer) scan(ctx context.Context, db querier, got *[]Event, last *pglogrepl.LSN, q string, args ...any) error {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ev Event
		var l string
		var eid *string
		dest := []any{&ev.ID, &ev.Type, &ev.Agg, &ev.Seq, &eid}
		if last != nil {
			dest = append(dest, &l)
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if eid != nil {
			ev.EventID = *eid
		}
		*got = append(*got, ev)
		if x, err := pglogrepl.ParseLSN(l); err == nil && last != nil {
			*last = max(*last, x)
		}
	}
	return rows.Err()
}

// Events is a copy of every event committed so far, in commit order.
func (w *Writer) Events() []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Event(nil), w.events...)
}

// Count is the number of events committed so far (lock-free).
func (w *Writer) Count() int64 { return w.written.Load() }

// Retries is the number of statements retried after an error.
func (w *Writer) Retries() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.retries
}

// LastLSN is the highest WAL insert position read inside an event
// transaction (before its commit) by Write or WriteMixed; BigTxn and a
// Write whose commit was only recovered after a restart add none. 0 before.
func (w *Writer) LastLSN() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastLSN
}
