package testkit

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// Message events (the table-less outbox, messages.prefix): WriteMixed
// commits transactions whose events are outbox rows and transactional
// logical decoding messages interleaved, with ids from the outbox table's
// own sequence, so that Check treats both alike (a message's event_id is
// that decimal id, a row's record carries it in outbox_id, and the
// envelope carries the payload and headers a row would).

// messageSQL emits one message event, taking its id from the table's
// sequence, and returns the id.
func (w *Writer) messageSQL() string {
	return `SELECT id, pg_logical_emit_message(true, $1::text, jsonb_build_object(
		'id', id::text, 'aggregate_type', $2::text, 'aggregate_id', $3::text, 'event_type', $2::text || '.updated',
		'payload', jsonb_build_object('aggregate', $3::text, 'seq', $4::int, 'txn', $5::bigint, 'note', 'café "quoted"', 'amount', $6::int + 0.5),
		'headers', jsonb_build_object('trace_id', 'trace-' || $3::text || '-' || $4::int, 'tenant_id', '` + TenantID + `',
		                              'schema_version', 2, 'traceparent', '` + Traceparent + `'))::text)::text
		, NULL::text FROM (SELECT nextval(pg_get_serial_sequence('` + w.Table + `', 'id')) AS id) s`
}

func (w *Writer) rowSQL() string {
	return `INSERT INTO ` + w.Table + ` AS o (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, $2, $1 || '.updated',
		        jsonb_build_object('aggregate', $2::text, 'seq', $3::int, 'txn', $4::bigint, 'note', 'café "quoted"', 'amount', $5::int + 0.5),
		        jsonb_build_object('trace_id', 'trace-' || $2 || '-' || $3::int, 'tenant_id', '` + TenantID + `', 'schema_version', 2,
		                           'traceparent', '` + Traceparent + `'))
		RETURNING id, 'row', ` + eventIDSQL
}

// WriteMixed commits one transaction of n events over aggregates
// 0..aggregates-1 picked at random, each a message with prefix (probability
// msgShare) or an outbox row, in one round trip. With rollback the
// transaction is rolled back instead: its events are not recorded, and their
// ids come back so a test can check none is ever published. It is not
// retried: use it without PostgreSQL faults.
func (w *Writer) WriteMixed(ctx context.Context, n, aggregates int, prefix string, msgShare float64, rollback bool) (rolledBack []int64, err error) {
	w.txn++
	tx, err := w.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	type pick struct {
		typ, agg string
		seq, num int
	}
	picks := make([]pick, n)
	next := map[string]int{}
	b := &pgx.Batch{}
	for i := range n {
		a := w.Rand.IntN(aggregates)
		p := pick{typ: w.AggType(a), num: a}
		p.agg = fmt.Sprintf("%s-%d", p.typ, a)
		next[p.agg]++
		p.seq = w.seqs[p.agg] + next[p.agg]
		picks[i] = p
		if w.Rand.Float64() < msgShare {
			b.Queue(w.messageSQL(), prefix, p.typ, p.agg, p.seq, w.txn, p.num)
		} else {
			b.Queue(w.rowSQL(), p.typ, p.agg, p.seq, w.txn, p.num)
		}
	}
	b.Queue("SELECT pg_current_wal_insert_lsn()::text")
	br := tx.SendBatch(ctx, b)
	got := make([]Event, n)
	for i := range n {
		var id int64
		var what string // the message's LSN, or "row"
		var eid *string // a row's event_id
		if err := br.QueryRow().Scan(&id, &what, &eid); err != nil {
			br.Close()
			return nil, fmt.Errorf("transaction %d event %d: %w", w.txn, i, err)
		}
		got[i] = Event{ID: id, Type: picks[i].typ, Agg: picks[i].agg, Seq: picks[i].seq}
		if eid != nil {
			got[i].EventID = *eid
		}
	}
	var last string
	if err := br.QueryRow().Scan(&last); err != nil {
		br.Close()
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	if rollback {
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
		ids := make([]int64, n)
		for i := range got {
			ids[i] = got[i].ID
		}
		return ids, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit transaction %d: %w", w.txn, err)
	}
	l, _ := pglogrepl.ParseLSN(last)
	w.add(got, l)
	return nil, nil
}
