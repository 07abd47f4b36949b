//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/retention"
)

// The delivery horizon proves a row delivered only after the slot passed
// its transaction, and a transaction open across samples holds the proof
// back for every later row until it commits and is delivered.
func TestDeliveryHorizonProvesOnlyDeliveredRows(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "horizon")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tbl, err := outboxschema.ParseTable(e.Table)
	if err != nil {
		t.Fatal(err)
	}
	h := retention.Horizon{Table: tbl, Slot: e.Slot}
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	insert := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int64 {
		var id int64
		if err := q.QueryRow(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'created', '{}') RETURNING id").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	delivered := func(id int64) bool {
		st, err := h.ReadState(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		ok, found, err := h.IsDelivered(ctx, conn, st, id)
		if err != nil || !found {
			t.Fatalf("row %d: found %v err %v", id, found, err)
		}
		return ok
	}
	advance := func() retention.State {
		st, _, err := h.Advance(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	open, err := e.DB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.Background())
	held := insert(open)
	before := insert(e.DB)
	advance()
	if delivered(before) {
		t.Fatalf("row %d proven delivered with no relay running", before)
	}

	r := e.startRelay()
	defer r.stop(15, 30*time.Second)
	after := insert(e.DB)
	// With the relay running, samples are promoted; the open transaction
	// keeps every later xid above the horizon.
	for i := 0; i < 3; i++ {
		cur, err := e.CurrentLSN(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.WaitConfirmed(ctx, cur, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		advance()
	}
	if delivered(before) || delivered(after) {
		t.Fatalf("rows proven delivered while an older transaction is open: before %v after %v", delivered(before), delivered(after))
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every row proven delivered", func() bool {
		cur, err := e.CurrentLSN(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.WaitConfirmed(ctx, cur, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		advance()
		return delivered(before) && delivered(after) && delivered(held)
	})
	st := advance()
	if n, err := h.Count(ctx, conn, st, 1000, 0); err != nil || n.N > 3 {
		t.Fatalf("undelivered %+v, %v", n, err)
	}
	// A row written now is not proven until the slot passes it.
	fresh := insert(e.DB)
	advance()
	if delivered(fresh) {
		t.Fatalf("row %d proven at once", fresh)
	}
}
