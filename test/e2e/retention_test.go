//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

func (e *env) rows(t *testing.T, where string) int64 {
	t.Helper()
	var n int64
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// lastRun is the delivery table's last_run_at for the test's slot (zero
// before the first retention run).
func (e *env) lastRun(t *testing.T) time.Time {
	t.Helper()
	var at *time.Time
	err := e.DB.QueryRow(context.Background(), "SELECT last_run_at FROM "+e.Schema+".outbox_relay_delivery WHERE slot_name = $1", e.Slot).Scan(&at)
	if err != nil || at == nil {
		return time.Time{}
	}
	return *at
}

// deliveryState describes the slot's delivery row and the slot, for
// failure messages.
func (e *env) deliveryState(t *testing.T) string {
	t.Helper()
	var s *string
	err := e.DB.QueryRow(context.Background(), `SELECT row_to_json(d)::text || ' confirmed ' || coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots s WHERE s.slot_name = d.slot_name), 'none')
		FROM `+e.Schema+`.outbox_relay_delivery d WHERE slot_name = $1`, e.Slot).Scan(&s)
	if err != nil || s == nil {
		return fmt.Sprintf("no delivery state (%v)", err)
	}
	return *s
}

// waitRows waits until the outbox holds want rows matching where.
func (e *env) waitRows(t *testing.T, d time.Duration, what, where string, want int64) {
	t.Helper()
	if err := testkit.Poll(d, 100*time.Millisecond, func() (bool, error) { return e.rows(t, where) == want, nil }); err != nil {
		t.Fatalf("%s: %d rows where %s after %s, want %d; delivery state: %s", what, e.rows(t, where), where, d, want, e.deliveryState(t))
	}
}

func (e *env) cleanup(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append(append([]string{"cleanup"}, e.flags()...), args...)...)
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	return code, out
}

// The "Done when": with retention.keep 3s, delivered rows
// disappear, while rows written during a broker stall survive past keep
// until they are delivered, and then go. Every row deleted was read by a
// real consumer.
func TestRetentionDeletesOnlyDeliveredRows(t *testing.T) {
	e := newEnv(t, "retention")
	kpx, kafkaAddr := kafkaProxy(t)
	r := e.startRelay("--kafka-brokers", kafkaAddr, "--retention-keep", "3s", "--retention-interval", "1s")
	if !strings.Contains(r.log(), "retention.keep is under 1h") {
		t.Errorf("no warning about a keep under 1h in the start log")
	}
	ctx := context.Background()
	w := e.newWriter(111)
	if err := w.run(ctx, 200, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 60*time.Second, "delivered rows deleted", func() bool { return e.rows(t, "true") == 0 })
	t.Logf("200 delivered rows deleted %s after the last write (keep 3s, interval 1s); deleted_rows_total %v",
		time.Since(start).Round(100*time.Millisecond), r.metric("outbox_relay_retention_deleted_rows_total"))
	if got := r.metric("outbox_relay_retention_deleted_rows_total"); got != 200 {
		t.Errorf("outbox_relay_retention_deleted_rows_total = %v, want 200", got)
	}

	kpx.Blackhole()
	if err := w.run(ctx, 40, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	stalled := time.Now()
	waitFor(t, 30*time.Second, "events in flight", func() bool { return r.metric("outbox_relay_inflight_events") > 0 })
	// Past keep, and a retention run after that: the stalled rows stay.
	waitFor(t, 60*time.Second, "a retention run 3s past keep", func() bool { return e.lastRun(t).After(stalled.Add(6 * time.Second)) })
	if n := e.rows(t, "true"); n != 40 {
		t.Fatalf("%d rows left during the stall, want the 40 undelivered rows", n)
	}
	if u := r.metric("outbox_relay_undelivered_events"); u < 40 {
		t.Errorf("outbox_relay_undelivered_events = %v during the stall, want >= 40", u)
	}
	if age := r.metric("outbox_relay_oldest_row_age_seconds"); age < 3 {
		t.Errorf("outbox_relay_oldest_row_age_seconds = %v during the stall, want >= 3", age)
	}
	if age := r.metric("outbox_relay_delivered_horizon_age_seconds"); age < 3 {
		t.Errorf("outbox_relay_delivered_horizon_age_seconds = %v during the stall, want >= 3", age)
	}
	t.Logf("stall: 40 rows kept %s past their write; undelivered %v", time.Since(stalled).Round(100*time.Millisecond), r.metric("outbox_relay_undelivered_events"))

	kpx.Heal()
	healed := time.Now()
	waitFor(t, 90*time.Second, "stalled rows deleted once delivered", func() bool { return e.rows(t, "true") == 0 })
	t.Logf("stalled rows deleted %s after the heal; deleted_rows_total %v", time.Since(healed).Round(100*time.Millisecond),
		r.metric("outbox_relay_retention_deleted_rows_total"))
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), true)
	if p := r.metric("outbox_relay_retention_paused"); p != 0 {
		t.Errorf("outbox_relay_retention_paused = %v, want 0", p)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// Retention pauses while the slot is dropped; a recreated slot resets the
// floor, so rows written under the old slot are no longer proven and stay
// until published_at is set (replay); cleanup --dry-run says why they
// stay, and refuses while paused or with keep 0.
func TestRetentionPausesAndRespectsTheFloor(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "retpause")
	r := e.startRelay("--retention-keep", "1h")
	ctx := context.Background()
	w := e.newWriter(112)
	if err := w.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "events published", func() bool { return r.metric("outbox_relay_events_published_total") >= 30 })
	// The relay's sampler proves them (two samples: taken, then passed).
	waitFor(t, 60*time.Second, "rows proven delivered", func() bool {
		code, out := e.cleanup(t, "--dry-run", "--retention-keep", "1ms")
		return code == 0 && strings.Contains(out, "30 rows of "+e.Table+" older than 1ms would be removed")
	})
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if code, out := e.cleanup(t, "--retention-keep", "0"); code == 0 || !strings.Contains(out, "retention.keep is 0") {
		t.Errorf("cleanup with keep 0: exit %d, %q; want a refusal naming retention.keep", code, out)
	}

	if err := testkit.DropSlot(ctx, e.DB, e.Slot); err != nil {
		t.Fatal(err)
	}
	code, out := e.cleanup(t, "--retention-keep", "1ms")
	if code == 0 || !strings.Contains(out, "retention is paused: the replication slot does not exist") {
		t.Errorf("cleanup with the slot dropped: exit %d, %q; want a refusal naming the missing slot", code, out)
	}
	if n := e.rows(t, "true"); n != 30 {
		t.Fatalf("%d rows left with the slot dropped, want 30", n)
	}

	// The operator follows the relay's message: forget the slot, start
	// again; the relay creates a fresh slot and registers its floor.
	mustExec(t, e, "DELETE FROM "+e.Schema+".outbox_relay_slots WHERE slot_name = $1", e.Slot)
	r = e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	if err := w.run(ctx, 20, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	e.waitRows(t, 60*time.Second, "rows written under the new slot deleted", "true", 30)
	waitFor(t, 30*time.Second, "a retention run after that", func() bool { return e.lastRun(t).After(time.Now().Add(-time.Second)) })
	if n := e.rows(t, "true"); n != 30 {
		t.Fatalf("%d rows left, want the 30 written under the dropped slot (below the new floor)", n)
	}
	code, out = e.cleanup(t, "--dry-run", "--retention-keep", "1ms")
	if code != 0 || !strings.Contains(out, "30 below the slot's floor") {
		t.Errorf("cleanup --dry-run: exit %d, %q; want 30 rows below the floor", code, out)
	}
	t.Logf("cleanup --dry-run:\n%s", out)

	// Replay (or an earlier publisher) sets published_at: then they go.
	mustExec(t, e, "UPDATE "+e.Table+" SET published_at = now()")
	waitFor(t, 30*time.Second, "rows with published_at deleted", func() bool { return e.rows(t, "true") == 0 })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// Rows written before the slot existed (an outbox adopted by the relay)
// are never proven by position: retention keeps them until published_at.
func TestRetentionKeepsPreSlotRows(t *testing.T) {
	t.Parallel() // waits on its own relay and outbox (no shared proxy, no service fault): runs beside the other waiting tests, after the sequential ones
	e := newEnv(t, "retpre")
	ctx := context.Background()
	w := e.newWriter(113)
	if err := w.run(ctx, 10, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	// Simulate a slot created after these rows: its floor is above them.
	mustExec(t, e, "UPDATE "+e.Schema+".outbox_relay_slots SET created_xid = pg_snapshot_xmax(pg_current_snapshot()) WHERE slot_name = $1", e.Slot)
	r := e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	if err := w.run(ctx, 10, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "rows after the floor deleted", func() bool { return e.rows(t, "true") == 10 })
	waitFor(t, 30*time.Second, "another retention run", func() bool { return e.lastRun(t).After(time.Now().Add(-time.Second)) })
	if n := e.rows(t, "published_at IS NULL"); n != 10 {
		t.Fatalf("%d pre-slot rows left, want 10", n)
	}
	mustExec(t, e, "UPDATE "+e.Table+" SET published_at = now()")
	waitFor(t, 30*time.Second, "pre-slot rows deleted after published_at", func() bool { return e.rows(t, "true") == 0 })
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// retention.archive moves rows to <table>_archive (partitioned by month)
// in the transaction that deletes them: every delivered row is in the
// archive, none is left in the outbox.
func TestRetentionArchive(t *testing.T) {
	t.Setenv("OUTBOX_RELAY_RETENTION_ARCHIVE", "true")
	e := newEnv(t, "retarch")
	if !e.exists(t, e.Schema+".outbox_archive") {
		t.Fatal("migrate with retention.archive did not create the archive table")
	}
	r := e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	ctx := context.Background()
	w := e.newWriter(114)
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "rows archived", func() bool { return e.rows(t, "true") == 0 })
	var n, ids int64
	var parted bool
	if err := e.DB.QueryRow(ctx, "SELECT count(*), count(DISTINCT id), (SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass) FROM "+e.Schema+".outbox_archive",
		e.Schema+".outbox_archive").Scan(&n, &ids, &parted); err != nil {
		t.Fatal(err)
	}
	if n != 50 || ids != 50 || !parted {
		t.Errorf("archive holds %d rows (%d ids), partitioned %v: want the 50 rows in a partitioned table", n, ids, parted)
	}
	var inDefault int64
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM "+e.Schema+".outbox_archive_default").Scan(&inDefault); err != nil {
		t.Fatal(err)
	}
	if inDefault != 0 {
		t.Errorf("%d archived rows in the DEFAULT partition: the month's partition should take them", inDefault)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// pausedReason is the delivery table's paused_reason for the test's slot.
func (e *env) pausedReason(t *testing.T) string {
	t.Helper()
	var r *string
	_ = e.DB.QueryRow(context.Background(), "SELECT paused_reason FROM "+e.Schema+".outbox_relay_delivery WHERE slot_name = $1", e.Slot).Scan(&r)
	if r == nil {
		return ""
	}
	return *r
}

// Rows inserted while the publication does not cover the outbox are never
// streamed, yet the slot passes them: the position alone would prove them
// delivered. Retention pauses while the publication is wrong and raises
// the floor above every row written until it is right again, so those
// rows stay until published_at is set.
func TestRetentionKeepsRowsThePublicationSkipped(t *testing.T) {
	t.Parallel() // waits on its own relay and outbox (no shared proxy, no service fault): runs beside the other waiting tests, after the sequential ones
	e := newEnv(t, "retpub")
	r := e.startRelay("--retention-keep", "3s", "--retention-interval", "1s")
	ctx := context.Background()
	w := e.newWriter(115)
	if err := w.run(ctx, 10, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "delivered rows deleted", func() bool { return e.rows(t, "true") == 0 })

	mustExec(t, e, "ALTER PUBLICATION "+e.Pub+" DROP TABLE "+e.Table)
	waitFor(t, 30*time.Second, "retention paused on the publication", func() bool {
		return strings.Contains(e.pausedReason(t), "publication")
	})
	if p := r.metric("outbox_relay_retention_paused"); p != 1 {
		t.Errorf("outbox_relay_retention_paused = %v with the table out of the publication, want 1", p)
	}
	// Written while the publication skips the table: never streamed.
	mustExec(t, e, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) SELECT 'order', 'skipped', 'created', '{}' FROM generate_series(1, 5)")
	mustExec(t, e, "ALTER PUBLICATION "+e.Pub+" ADD TABLE "+e.Table)
	waitFor(t, 30*time.Second, "retention resumed", func() bool { return e.pausedReason(t) == "" })
	if err := w.run(ctx, 10, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "rows written after the fix deleted", func() bool { return e.rows(t, "aggregate_id <> 'skipped'") == 0 })
	waitFor(t, 30*time.Second, "another retention run", func() bool { return e.lastRun(t).After(time.Now().Add(-time.Second)) })
	if n := e.rows(t, "aggregate_id = 'skipped'"); n != 5 {
		t.Fatalf("%d of the 5 rows the publication skipped are left: retention deleted rows that were never streamed", n)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}
