//go:build e2e

package e2e

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// streamingURL is the relay's PostgreSQL URL with the walsender's
// logical_decoding_work_mem at its minimum (a per-session setting, sent in
// the startup packet), so any transaction of more than a few hundred rows
// is streamed before it commits.
func streamingURL() string {
	sep := "?"
	if strings.Contains(pgURL, "?") {
		sep = "&"
	}
	return pgURL + sep + "logical_decoding_work_mem=64kB"
}

// bigRows inserts n outbox rows in tx over k aggregates named after base
// (order-<base+i>), as one statement, and returns them as written events.
func bigRows(ctx context.Context, tx pgx.Tx, table string, base, n, k int) ([]written, error) {
	rows, err := tx.Query(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT 'order', 'order-' || ($3 + g % $2), 'order.updated',
		       jsonb_build_object('aggregate', 'order-' || ($3 + g % $2), 'seq', g / $2 + 1, 'pad', repeat('x', 64)),
		       jsonb_build_object('trace_id', 'trace-order-' || ($3 + g % $2) || '-' || (g / $2 + 1), 'tenant_id', '`+testkit.TenantID+`',
		                          'schema_version', 2, 'traceparent', '`+testkit.Traceparent+`')
		FROM generate_series(0, $1 - 1) AS g ORDER BY g
		RETURNING id, aggregate_type, aggregate_id, (payload->>'seq')::int`, n, k, base)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (written, error) {
		var ev written
		err := r.Scan(&ev.ID, &ev.Type, &ev.Agg, &ev.Seq)
		return ev, err
	})
}

// slotStreamStats reads pg_stat_replication_slots for the test's slot.
func (e *env) slotStreamStats(t *testing.T) (streamTxns, streamBytes, spillBytes int64) {
	t.Helper()
	err := e.DB.QueryRow(context.Background(), `SELECT stream_txns, stream_bytes, spill_bytes
		FROM pg_stat_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&streamTxns, &streamBytes, &spillBytes)
	if err != nil {
		t.Fatalf("read pg_stat_replication_slots: %v", err)
	}
	return
}

// Large transactions streamed before their commit (postgres.streaming,
// pgoutput protocol 2) with logical_decoding_work_mem at 64kB: two big
// transactions interleaved with each other and with small ones, one of them
// aborted; one with an aborted subtransaction, during whose streaming the
// relay is killed (kill -9) and restarted. A real consumer reads every
// committed event exactly once, in order per aggregate, and none of the
// aborted rows; the server's statistics prove the streaming path ran.
func TestStreamingLargeTransactions(t *testing.T) {
	e := newEnv(t, "streaming")
	flags := []string{"--postgres-url", streamingURL(), "--max-inflight-bytes", "1048576"}
	r := e.startRelay(flags...)
	ctx := context.Background()
	const big = 25000
	// begin opens a transaction that is rolled back if the test stops
	// early: an open one would block the cleanup's DROP SCHEMA for ever.
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := e.DB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		return tx
	}

	// Small transactions all along the first phase, on aggregates of their own.
	small := testkit.NewWriter(e.DB, e.Table, rand.New(rand.NewPCG(31, 99)), func(int) string { return "payment" })
	smallDone := make(chan error, 1)
	stopSmall := make(chan struct{})
	var stopOnce sync.Once
	stop := func() error {
		err := error(nil)
		stopOnce.Do(func() { close(stopSmall); err = <-smallDone })
		return err
	}
	t.Cleanup(func() { stop() })
	go func(stopSmall <-chan struct{}) {
		for i := 0; ; i++ {
			select {
			case <-stopSmall:
				smallDone <- nil
				return
			default:
			}
			if err := small.Write(ctx, 1+i%5, 40, ""); err != nil {
				smallDone <- err
				return
			}
		}
	}(stopSmall)

	// Phase 1: A (committed) and B (aborted) interleaved, 2 x 25 000 rows each.
	txA, txB := begin(), begin()
	var ws, aborted []written
	for i := range 2 {
		a, err := bigRows(ctx, txA, e.Table, 100000+i*1000, big, 200)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, a...)
		b, err := bigRows(ctx, txB, e.Table, 200000+i*1000, big, 200)
		if err != nil {
			t.Fatal(err)
		}
		aborted = append(aborted, b...)
	}
	// B's rows were streamed before its abort: the relay holds them, unpublished.
	waitFor(t, 60*time.Second, "the relay to hold streamed, uncommitted rows", func() bool {
		return r.metric("outbox_relay_streamed_open_bytes") > 0
	})
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := txB.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ws = append(ws, small.Events()...)
	waitFor(t, 120*time.Second, "phase 1 published", func() bool {
		return r.metric("outbox_relay_events_published_total") >= float64(len(ws))
	})
	if err := e.WaitConfirmed(ctx, e.currentLSN(t), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := r.metric("outbox_relay_streamed_transactions_aborted_total"); n < 1 {
		t.Fatalf("outbox_relay_streamed_transactions_aborted_total = %v, want >= 1 (B)", n)
	}
	if n := r.metric("outbox_relay_streamed_transactions_spilled_total"); n < 1 {
		t.Fatalf("outbox_relay_streamed_transactions_spilled_total = %v, want >= 1: 1 MiB in flight cannot hold A in memory", n)
	}

	// Phase 2: C keeps 20 000 rows, rolls back a savepoint of 20 000 and
	// adds 5 000; the relay is killed while C is being streamed.
	txC := begin()
	c1, err := bigRows(ctx, txC, e.Table, 300000, 20000, 200)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the relay to hold C's streamed rows", func() bool {
		return r.metric("outbox_relay_streamed_open_bytes") > 0
	})
	r.Kill()
	r = e.startRelay(flags...)
	if _, err := txC.Exec(ctx, "SAVEPOINT s1"); err != nil {
		t.Fatal(err)
	}
	c2, err := bigRows(ctx, txC, e.Table, 400000, 20000, 200)
	if err != nil {
		t.Fatal(err)
	}
	aborted = append(aborted, c2...)
	if _, err := txC.Exec(ctx, "ROLLBACK TO SAVEPOINT s1"); err != nil {
		t.Fatal(err)
	}
	c3, err := bigRows(ctx, txC, e.Table, 500000, 5000, 200)
	if err != nil {
		t.Fatal(err)
	}
	if err := txC.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ws = append(append(ws, c1...), c3...)

	rs := consume(t, e.topics(), len(ws), 240*time.Second, 3*time.Second)
	abortedIDs := map[int64]bool{}
	for _, ev := range aborted {
		abortedIDs[ev.ID] = true
	}
	leaked := 0
	for _, rec := range rs {
		if id, err := testkit.RecordID(rec); err == nil && abortedIDs[id] {
			leaked++
		}
	}
	if leaked > 0 {
		t.Fatalf("%d records of aborted rows (transaction B or savepoint s1) were published", leaked)
	}
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, false)
	streamTxns, streamBytes, spillBytes := e.slotStreamStats(t)
	t.Logf("%d events committed, %d aborted; server: stream_txns %d, stream_bytes %d, spill_bytes %d",
		len(ws), len(aborted), streamTxns, streamBytes, spillBytes)
	if streamTxns == 0 {
		t.Fatal("pg_stat_replication_slots.stream_txns = 0: the server never streamed, the test proves nothing")
	}
	if n := r.metric("outbox_relay_streaming"); n != 1 {
		t.Fatalf("outbox_relay_streaming = %v, want 1", n)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
