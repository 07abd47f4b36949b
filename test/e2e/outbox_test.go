//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// outbox.Write writes in the caller's transaction, through pgx (INSERT and,
// from outbox.CopyThreshold events, COPY) and database/sql: a rollback
// leaves nothing, a commit leaves every event in order with its headers.
func TestOutboxWriteInCallersTransaction(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "outboxwrite")
	ctx := outbox.WithTracestate(outbox.WithTraceparent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "congo=t61rcWkgMzE")
	w, err := outbox.NewWriter(outbox.WithTable(e.Table))
	if err != nil {
		t.Fatal(err)
	}
	events := func(tag string, n int) []outbox.Event {
		out := make([]outbox.Event, n)
		for i := range out {
			out[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", tag, i%3), EventType: "order.created",
				SchemaVersion: 2, Payload: map[string]any{"tag": tag, "i": i}, Headers: map[string]string{"tenant_id": "acme"}}
		}
		return out
	}
	count := func(tag string) int {
		var n int
		if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Table+" WHERE payload->>'tag' = $1", tag).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	sqlDB := stdlib.OpenDBFromPool(e.DB)
	defer sqlDB.Close()
	type txn struct {
		exec     func(q string) error
		tx       any
		rollback func() error
		commit   func() error
	}
	begin := map[string]func() txn{
		"pgx": func() txn {
			tx, err := e.DB.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return txn{func(q string) error { _, err := tx.Exec(ctx, q); return err }, tx,
				func() error { return tx.Rollback(ctx) }, func() error { return tx.Commit(ctx) }}
		},
		"database/sql": func() txn {
			tx, err := sqlDB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return txn{func(q string) error { _, err := tx.ExecContext(ctx, q); return err }, tx, tx.Rollback, tx.Commit}
		},
	}
	if _, err := e.DB.Exec(ctx, "CREATE TABLE "+e.Schema+".orders (tag text, n int)"); err != nil {
		t.Fatal(err)
	}
	for name, b := range begin {
		for _, n := range []int{1, 7, outbox.CopyThreshold, 2 * outbox.CopyThreshold} {
			t.Run(fmt.Sprintf("%s/%d", name, n), func(t *testing.T) {
				for _, commit := range []bool{false, true} {
					tag := fmt.Sprintf("%s-%d-%v", strings.ReplaceAll(name, "/", ""), n, commit)
					tx := b()
					if err := tx.exec(fmt.Sprintf("INSERT INTO %s.orders VALUES ('%s', %d)", e.Schema, tag, n)); err != nil {
						t.Fatal(err)
					}
					if err := w.Write(ctx, tx.tx, events(tag, n)...); err != nil {
						t.Fatal(err)
					}
					if got := count(tag); got != 0 {
						t.Fatalf("%d events visible outside the transaction before its commit", got)
					}
					end := tx.rollback
					if commit {
						end = tx.commit
					}
					if err := end(); err != nil {
						t.Fatal(err)
					}
					want := 0
					if commit {
						want = n
					}
					if got := count(tag); got != want {
						t.Fatalf("commit=%v: %d events in the outbox, want %d", commit, got, want)
					}
				}
				tag := fmt.Sprintf("%s-%d-true", strings.ReplaceAll(name, "/", ""), n)
				rows, err := e.DB.Query(context.Background(), "SELECT aggregate_id, payload, headers FROM "+e.Table+" WHERE payload->>'tag' = $1 ORDER BY id", tag)
				if err != nil {
					t.Fatal(err)
				}
				i := 0
				for rows.Next() {
					var agg string
					var payload map[string]any
					var headers map[string]string
					if err := rows.Scan(&agg, &payload, &headers); err != nil {
						t.Fatal(err)
					}
					if agg != fmt.Sprintf("%s-%d", tag, i%3) || payload["i"] != float64(i) {
						t.Errorf("row %d: aggregate %s payload %v: out of order", i, agg, payload)
					}
					want := map[string]string{"tenant_id": "acme", "schema_version": "2",
						"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"}
					if fmt.Sprint(headers) != fmt.Sprint(want) {
						t.Errorf("row %d: headers %v, want %v", i, headers, want)
					}
					i++
				}
				if rows.Err() != nil || i != n {
					t.Fatalf("%d rows read back (%v), want %d", i, rows.Err(), n)
				}
			})
		}
	}
	// A pool or a connection is not the business transaction: refused.
	for _, notTx := range []any{e.DB, sqlDB} {
		if err := w.Write(ctx, notTx, events("pool", 1)...); err == nil || !strings.Contains(err.Error(), "pgx.Tx or *sql.Tx") {
			t.Errorf("Write(%T): %v, want a refusal", notTx, err)
		}
	}
	// An invalid event writes nothing, not even the valid ones before it.
	tx, err := e.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	bad := append(events("bad", 2), outbox.Event{AggregateType: "order", AggregateID: "x", EventType: "t", Payload: json.RawMessage(`{`)})
	if err := w.Write(ctx, tx, bad...); err == nil || !strings.Contains(err.Error(), "event 2: Payload is not valid JSON") {
		t.Errorf("invalid event: %v", err)
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+e.Table+" WHERE payload->>'tag' = 'bad'").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written before the invalid event (%v)", n, err)
	}
}
