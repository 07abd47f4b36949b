//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

func requireClean(t *testing.T, rep report, allowDups bool) {
	t.Helper()
	t.Logf("written %d, delivered %d, lost %d, duplicates %d, order violations %d, partition violations %d",
		rep.Written, rep.Delivered, rep.Lost, rep.Duplicates, rep.OrderViolations, rep.PartitionViolations)
	if rep.Lost != 0 || rep.OrderViolations != 0 || rep.PartitionViolations != 0 || len(rep.Problems) != 0 ||
		(!allowDups && rep.Duplicates != 0) {
		t.Fatalf("delivery check failed:\n  %s", strings.Join(rep.Problems, "\n  "))
	}
}

// Property 1 and 2: N events in M transactions over K aggregates arrive
// exactly once with every header; per aggregate the read order is commit
// order, in the one partition murmur2(key) selects.
func TestCleanRunExactlyOnceInOrder(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "clean")
	r := e.startRelay()
	w := e.newWriter(1)
	start := time.Now()
	if err := w.run(context.Background(), 3000, 20, 60, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 2*time.Second)
	t.Logf("%d events in %s (write + deliver)", len(ws), time.Since(start).Round(time.Millisecond))
	parts := e.partitions(t)
	for tp, n := range parts {
		if n < 2 {
			t.Fatalf("topic %s has %d partition(s); the partition check needs several", tp, n)
		}
	}
	requireClean(t, check(t, ws, rs, parts), false)
	if got := r.metric("outbox_relay_events_published_total"); got != float64(len(ws)) {
		t.Fatalf("outbox_relay_events_published_total = %v, want %d", got, len(ws))
	}
	for _, m := range []string{"outbox_relay_publish_errors_total", "outbox_relay_inflight_events", "outbox_relay_received_lsn",
		"outbox_relay_confirmed_lsn", "outbox_relay_slot_lag_bytes", "outbox_relay_slot_retained_wal_bytes", "outbox_relay_commit_to_ack_seconds_count"} {
		if r.metric(m) < 0 && m != "outbox_relay_publish_errors_total" {
			t.Errorf("metric %s missing", m)
		}
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("SIGTERM exit code %d, want 0", code)
	}
	if strings.Contains(r.log(), passwordOf(pgURL)) {
		t.Fatal("the relay log contains the PostgreSQL password")
	}
}

func passwordOf(url string) string {
	at := strings.LastIndex(url, "@")
	colon := strings.LastIndex(url[:at], ":")
	return url[colon+1 : at]
}

// Property 3: SIGTERM mid-stream, restart: nothing lost, nothing duplicated.
func TestSigtermRestartNoLossNoDuplicates(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "sigterm")
	r := e.startRelay()
	w := e.newWriter(3)
	errc := make(chan error, 1)
	go func() { errc <- w.run(context.Background(), 4000, 10, 40, 8*time.Second, "") }()
	waitFor(t, 30*time.Second, "first events published", func() bool { return r.metric("outbox_relay_events_published_total") > 200 })
	mid := len(w.written())
	stopped := time.Now()
	if code := r.stop(syscall.SIGTERM, 40*time.Second); code != 0 {
		t.Fatalf("SIGTERM exit code %d, want 0", code)
	}
	if d := time.Since(stopped); d > 10*time.Second {
		t.Errorf("graceful stop took %s: in-flight acks were not drained promptly", d)
	}
	r2 := e.startRelay()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	if mid >= len(ws) {
		t.Fatalf("the writer finished before SIGTERM (%d of %d): the test proves nothing", mid, len(ws))
	}
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	r2.stop(syscall.SIGTERM, 30*time.Second)
	t.Logf("SIGTERM landed after %d of %d events were written", mid, len(ws))
}

// Property 4: kill -9 mid-stream, restart: nothing lost; duplicates only of
// events whose transaction was not yet confirmed. The broker is paused while
// the relay dies, so events are surely read but unacked: a relay that
// confirmed on receipt would lose them here.
func TestKill9RestartNoLossDuplicatesOnlyUnconfirmed(t *testing.T) {
	e := newEnv(t, "kill9")
	r := e.startRelay()
	w := e.newWriter(4)
	if err := w.run(context.Background(), 500, 10, 30, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "first batch acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 500 })
	// Let a status update carry the watermark, then stall the broker.
	waitFor(t, 30*time.Second, "the slot to confirm the first batch", func() bool { return e.slotLSN(t) > w.LastLSN() })
	svc(t, "kafka-pause")
	paused := true
	defer func() {
		if paused {
			svc(t, "kafka-resume")
		}
	}()
	firstPending := len(w.written())
	if err := w.run(context.Background(), 500, 10, 30, 0, ""); err != nil {
		t.Fatal(err)
	}
	pausedBatch := len(w.written())
	waitFor(t, 30*time.Second, "events read but unacked", func() bool { return r.metric("outbox_relay_inflight_events") > 0 })
	r.stop(syscall.SIGKILL, 10*time.Second)
	confirmed := e.slotLSN(t)
	svc(t, "kafka-resume")
	paused = false
	r2 := e.startRelay()
	if err := w.run(context.Background(), 500, 10, 30, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, true)
	if first := minCommitLSN(t, rs, ws[firstPending:pausedBatch]); confirmed > first {
		t.Fatalf("slot confirmed %s at the kill, past the first commit %s written while the broker was paused", confirmed, first)
	}
	lsnOf := map[int64]string{}
	for _, rec := range rs {
		id, _ := testkit.RecordID(rec)
		lsnOf[id] = rec.Headers["pg_lsn"]
	}
	for _, id := range rep.DuplicateIDs {
		l, _ := pglogrepl.ParseLSN(lsnOf[id])
		if l < confirmed {
			t.Errorf("event_id=%d (commit %s) was duplicated although the slot had confirmed %s before the kill", id, l, confirmed)
		}
	}
	t.Logf("kill -9 with the broker paused: %d duplicates (all unconfirmed at the kill), 0 lost", rep.Duplicates)
	r2.stop(syscall.SIGTERM, 30*time.Second)
}

// Property 5: broker stopped: the slot's confirmed_flush_lsn does not pass
// pending events; broker back: everything arrives.
func TestBrokerDownSlotHoldsThenDelivers(t *testing.T) {
	e := newEnv(t, "brokerdown")
	r := e.startRelay("--lag-poll-interval", "200ms")
	w := e.newWriter(5)
	if err := w.run(context.Background(), 200, 5, 20, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "first batch acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 200 })
	svc(t, "kafka-kill")
	restarted := false
	defer func() {
		if !restarted {
			svc(t, "kafka-start")
		}
	}()
	firstPending := len(w.written())
	before := e.currentLSN(t)
	if err := w.run(context.Background(), 300, 5, 20, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "events read while the broker is down", func() bool {
		return r.metric("outbox_relay_received_lsn") > float64(before)
	})
	waitFor(t, 20*time.Second, "/readyz to report not ready while kafka is down", func() bool { return r.readyStatus() == 503 })
	waitFor(t, 20*time.Second, "transient publish errors counted while kafka is down", func() bool {
		return r.metric("outbox_relay_publish_errors_total") > 0
	})
	// The lag gauge, read from pg_replication_slots, must show the backlog.
	waitFor(t, 20*time.Second, "outbox_relay_slot_lag_bytes to show the pending events", func() bool {
		return r.metric("outbox_relay_slot_lag_bytes") > 50_000
	})
	// Several status intervals pass; sample what the slot confirms meanwhile.
	var maxConfirmed pglogrepl.LSN
	for i := 0; i < 5; i++ {
		time.Sleep(time.Second) // an observation window of five status intervals, not a synchronisation
		maxConfirmed = max(maxConfirmed, e.slotLSN(t))
	}
	svc(t, "kafka-start")
	restarted = true
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, true)
	// The server resends a transaction iff its commit LSN >= the confirmed
	// position, so the slot must have stayed at or before the first commit
	// of the events written while the broker was down.
	first := minCommitLSN(t, rs, ws[firstPending:])
	if maxConfirmed > first {
		t.Fatalf("slot confirmed %s while the broker was down, past the first pending commit %s", maxConfirmed, first)
	}
	waitFor(t, 30*time.Second, "slot to advance after the broker came back", func() bool { return e.slotLSN(t) > first })
	waitFor(t, 30*time.Second, "outbox_relay_slot_lag_bytes to drop after the broker came back", func() bool {
		v := r.metric("outbox_relay_slot_lag_bytes")
		return v >= 0 && v < 50_000
	})
	t.Logf("broker down: %d duplicates after it came back", rep.Duplicates)
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// Property 6: an idle outbox while another table takes many writes: the
// slot's confirmed_flush_lsn keeps advancing, so WAL is not pinned.
func TestIdleOutboxSlotAdvances(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "idle")
	ctx := context.Background()
	if _, err := e.DB.Exec(ctx, "CREATE TABLE "+e.Schema+".busy (id bigserial primary key, note text)"); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay()
	for round := 0; round < 3; round++ {
		for i := 0; i < 300; i++ {
			if _, err := e.DB.Exec(ctx, "INSERT INTO "+e.Schema+".busy (note) SELECT repeat('x', 200) FROM generate_series(1, 20)"); err != nil {
				t.Fatal(err)
			}
		}
		target := e.currentLSN(t)
		waitFor(t, 20*time.Second, fmt.Sprintf("slot to pass %s in round %d", target, round), func() bool { return e.slotLSN(t) >= target })
	}
	if r.metric("outbox_relay_events_published_total") > 0 {
		t.Fatal("rows of another table were published")
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// Property 7: rows of other tables in the same publication and transactions
// are never published, and ALTER TABLE outbox ADD COLUMN during a run does
// not break decoding.
func TestOtherTablesIgnoredAndAlterTable(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "alter")
	ctx := context.Background()
	other := e.Schema + ".orders"
	if _, err := e.DB.Exec(ctx, "CREATE TABLE "+other+" (id bigserial primary key, note text)"); err != nil {
		t.Fatal(err)
	}
	// In the publication, so the decoder really sees (and must drop) its rows.
	if _, err := e.DB.Exec(ctx, "ALTER PUBLICATION "+e.Pub+" ADD TABLE "+other); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay()
	w := e.newWriter(7)
	if err := w.run(ctx, 300, 5, 20, 0, other); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Exec(ctx, "ALTER TABLE "+e.Table+" ADD COLUMN extra text DEFAULT 'x', ADD COLUMN region int"); err != nil {
		t.Fatal(err)
	}
	if err := w.run(ctx, 300, 5, 20, 0, other); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 2*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	if got := r.metric("outbox_relay_other_table_rows_total"); got <= 0 {
		t.Fatalf("outbox_relay_other_table_rows_total = %v: the other table's rows never reached the decoder, so the test proves nothing", got)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after ALTER TABLE, want 0", code)
	}
}

// Backpressure must never starve the walsender: with a tiny in-flight limit,
// a paused broker and wal_sender_timeout at 2s, the handler blocks for three
// timeouts; the replication connection must survive (no reconnect) and every
// event must arrive once the broker is back.
func TestBackpressureKeepsReplicationAlive(t *testing.T) {
	e := newEnv(t, "backpressure")
	r := e.startRelay("--postgres-url", pgURL+"&options=-c%20wal_sender_timeout%3D2s",
		"--status-interval", "300ms", "--max-inflight-events", "5")
	w := e.newWriter(9)
	ctx := context.Background()
	if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "first batch acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 100 })
	pid := e.walsenderPID(t)
	svc(t, "kafka-pause")
	paused := true
	defer func() {
		if paused {
			svc(t, "kafka-resume")
		}
	}()
	if err := w.run(ctx, 300, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the in-flight limit to be reached", func() bool { return r.metric("outbox_relay_inflight_events") >= 1 })
	time.Sleep(6 * time.Second) // the fault: three wal_sender_timeouts pass with the handler blocked
	svc(t, "kafka-resume")
	paused = false
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 120*time.Second, 2*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), true)
	if n := r.metric("outbox_relay_replication_reconnects_total"); n != 0 {
		t.Fatalf("replication reconnected %v times while blocked on backpressure: keepalives were starved", n)
	}
	if pid2 := e.walsenderPID(t); pid2 != pid {
		t.Fatalf("walsender changed from pid %d to %d: the connection was dropped", pid, pid2)
	}
	if max := r.metric("outbox_relay_inflight_events"); max > 5 {
		t.Fatalf("in-flight events %v above the limit 5", max)
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// minCommitLSN returns the smallest commit LSN (pg_lsn header) among the
// records of the given events.
func minCommitLSN(t *testing.T, rs []record, ws []written) pglogrepl.LSN {
	t.Helper()
	want := map[string]bool{}
	for _, w := range ws {
		want[w.Identity()] = true
	}
	var first pglogrepl.LSN
	for _, r := range rs {
		if !want[r.Headers["event_id"]] {
			continue
		}
		l, err := pglogrepl.ParseLSN(r.Headers["pg_lsn"])
		if err != nil {
			t.Fatalf("pg_lsn %q: %v", r.Headers["pg_lsn"], err)
		}
		if first == 0 || l < first {
			first = l
		}
	}
	if first == 0 {
		t.Fatal("none of the events was read back")
	}
	return first
}

// Any loss of the replication connection is retried with backoff and the
// stream resumes from the slot: PostgreSQL restarts (fast and immediate)
// while events flow lose nothing.
func TestPostgresRestartReconnects(t *testing.T) {
	e := newEnv(t, "pgrestart")
	r := e.startRelay("--reconnect-max", "2s")
	w := e.newWriter(10)
	ctx := context.Background()
	for _, mode := range []string{"fast", "immediate"} {
		if err := w.run(ctx, 200, 5, 20, 0, ""); err != nil {
			t.Fatal(err)
		}
		before := r.metric("outbox_relay_leader_transitions_total")
		svc(t, "pg-restart", mode)
		e.DB.Reset() // drop pooled connections the restart killed
		// The restart ends every session, the lease's too: the relay steps
		// down (confirming nothing more), then leads again by itself.
		waitFor(t, 60*time.Second, fmt.Sprintf("the relay to lead and stream again after the %s restart", mode), func() bool {
			role, _ := r.role()
			return r.running() && r.metric("outbox_relay_leader_transitions_total") >= before+2 && role == "leader" && r.readyStatus() == 200
		})
	}
	if err := w.run(ctx, 200, 5, 20, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 2*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, true)
	t.Logf("two PostgreSQL restarts: %d duplicates, 0 lost", rep.Duplicates)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// A transaction far larger than the in-flight limit streams through in
// chunks: in-flight events never exceed the limit, and every event arrives
// once, in order.
func TestHugeTransactionBoundedInFlight(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "hugetxn")
	r := e.startRelay("--max-inflight-events", "100")
	w := e.newWriter(11)
	ctx := context.Background()
	var peak float64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			peak = max(peak, r.metric("outbox_relay_inflight_events"))
		}
	}()
	if err := w.bigTxn(ctx, 20000, 50); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics()[:1], len(ws), 120*time.Second, 2*time.Second)
	close(stop)
	<-sampled
	order := e.topics()[0]
	requireClean(t, check(t, ws, rs, map[string]int{order: partitionCount(t, order)}), false)
	t.Logf("one transaction of %d events; peak in-flight %v (limit 100)", len(ws), peak)
	if peak > 100 {
		t.Fatalf("in-flight events peaked at %v, above the limit 100", peak)
	}
	if peak <= 0 {
		t.Fatal("in-flight gauge never seen above 0: the sampler proves nothing")
	}
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// A replication connection that goes silent without closing (here: the
// walsender process frozen with SIGSTOP, as behind a cut network) is
// detected by postgres.receive_timeout and replaced; nothing is lost.
func TestSilentReplicationConnectionIsReplaced(t *testing.T) {
	e := newEnv(t, "silent")
	r := e.startRelay("--receive-timeout", "3s", "--status-interval", "300ms", "--reconnect-max", "1s")
	w := e.newWriter(12)
	ctx := context.Background()
	if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "first batch acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 100 })
	pid := e.walsenderPID(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	resumed := false
	defer func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the relay to give up on the silent connection", func() bool {
		return r.metric("outbox_relay_replication_reconnects_total") >= 1
	})
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 120*time.Second, 2*time.Second)
	requireClean(t, check(t, ws, rs, e.partitions(t)), true)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if !strings.Contains(r.log(), "connection presumed dead") {
		t.Fatal("the relay log does not say why it reconnected")
	}
}

// Setups the relay must refuse, each with exit 1 and a message that names
// the problem and the fix, instead of retrying forever or doing damage.
func TestRefusesBadSetups(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	ctx := context.Background()
	tests := []struct {
		name    string
		prepare func(t *testing.T, e *env) []string // returns extra relay flags
		want    []string
	}{
		{"slot with another plugin", func(t *testing.T, e *env) []string {
			mustExec(t, e, "SELECT pg_drop_replication_slot($1)", e.Slot)
			mustExec(t, e, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", e.Slot)
			return nil
		}, []string{"test_decoding", "needs a logical pgoutput slot", "choose another postgres.slot"}},
		{"publication missing, creation disabled", func(t *testing.T, e *env) []string {
			e.freshStart(t)
			return []string{"--create-publication=false"}
		}, []string{"does not exist", "CREATE PUBLICATION", "create_publication"}},
		{"publication dropped behind the slot", func(t *testing.T, e *env) []string {
			mustExec(t, e, "DROP PUBLICATION "+e.Pub)
			return nil
		}, []string{"does not exist", "but slot", "CREATE PUBLICATION", "pg_replication_slot_advance", "republish"}},
		{"outbox table missing", func(t *testing.T, e *env) []string {
			mustExec(t, e, "DROP TABLE "+e.Table)
			return nil
		}, []string{"does not exist", "outbox-relay migrate"}},
		{"required column missing", func(t *testing.T, e *env) []string {
			mustExec(t, e, "ALTER TABLE "+e.Table+" DROP COLUMN aggregate_id")
			return nil
		}, []string{"lacks required column(s) aggregate_id"}},
		{"dead-letter columns missing", func(t *testing.T, e *env) []string {
			mustExec(t, e, "ALTER TABLE "+e.Table+" DROP COLUMN dead_lettered_at")
			return nil
		}, []string{"dead_lettered_at", "outbox-relay migrate"}},
		{"lease table missing", func(t *testing.T, e *env) []string {
			mustExec(t, e, "DROP TABLE "+e.Schema+"."+outboxschema.LeaseTable)
			return nil
		}, []string{outboxschema.LeaseTable, "does not exist", "outbox-relay migrate"}},
		{"role without REPLICATION", func(t *testing.T, e *env) []string {
			role := e.Slot + "_norepl"
			mustExec(t, e, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw' IN ROLE pg_read_all_stats")
			mustExec(t, e, "GRANT USAGE ON SCHEMA "+e.Schema+" TO "+role)
			mustExec(t, e, "GRANT SELECT, INSERT ON "+e.Schema+"."+outboxschema.SlotRegistry+" TO "+role)
			mustExec(t, e, "GRANT SELECT, INSERT, UPDATE ON "+e.Schema+"."+outboxschema.LeaseTable+" TO "+role)
			mustExec(t, e, "GRANT SELECT, UPDATE ON "+e.Table+" TO "+role) // the row marks
			t.Cleanup(func() { e.DB.Exec(ctx, "DROP OWNED BY "+role); e.DB.Exec(ctx, "DROP ROLE "+role) })
			u := strings.Replace(pgURL, "relay:"+passwordOf(pgURL)+"@", role+":pw@", 1)
			return []string{"--postgres-url", u}
		}, []string{"ALTER ROLE", "REPLICATION"}},
		{"role without UPDATE on the outbox table", func(t *testing.T, e *env) []string {
			role := e.Slot + "_noupdate"
			mustExec(t, e, "CREATE ROLE "+role+" LOGIN REPLICATION PASSWORD 'pw'")
			mustExec(t, e, "GRANT USAGE ON SCHEMA "+e.Schema+" TO "+role)
			mustExec(t, e, "GRANT SELECT, INSERT ON "+e.Schema+"."+outboxschema.SlotRegistry+" TO "+role)
			mustExec(t, e, "GRANT SELECT, INSERT, UPDATE ON "+e.Schema+"."+outboxschema.LeaseTable+" TO "+role)
			mustExec(t, e, "GRANT SELECT ON "+e.Table+" TO "+role)
			t.Cleanup(func() { e.DB.Exec(ctx, "DROP OWNED BY "+role); e.DB.Exec(ctx, "DROP ROLE "+role) })
			u := strings.Replace(pgURL, "relay:"+passwordOf(pgURL)+"@", role+":pw@", 1)
			return []string{"--postgres-url", u}
		}, []string{"UPDATE (attempt_count)", "GRANT SELECT, UPDATE ON", "_noupdate"}},
		{"role without rights on the lease table", func(t *testing.T, e *env) []string {
			role := e.Slot + "_nolease"
			mustExec(t, e, "CREATE ROLE "+role+" LOGIN REPLICATION PASSWORD 'pw'")
			mustExec(t, e, "GRANT USAGE ON SCHEMA "+e.Schema+" TO "+role)
			t.Cleanup(func() { e.DB.Exec(ctx, "DROP OWNED BY "+role); e.DB.Exec(ctx, "DROP ROLE "+role) })
			u := strings.Replace(pgURL, "relay:"+passwordOf(pgURL)+"@", role+":pw@", 1)
			return []string{"--postgres-url", u}
		}, []string{"permission denied", "GRANT SELECT, INSERT, UPDATE ON", outboxschema.LeaseTable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "refuse")
			extra := tt.prepare(t, e)
			code, log := e.runRelayToExit(60*time.Second, extra...)
			if code != 1 {
				t.Fatalf("exit code %d, want 1:\n%s", code, tail([]byte(log), 3000))
			}
			for _, w := range tt.want {
				if !strings.Contains(log, w) {
					t.Errorf("log lacks %q:\n%s", w, tail([]byte(log), 3000))
				}
			}
			if strings.Contains(log, passwordOf(pgURL)) {
				t.Error("the log contains the PostgreSQL password")
			}
		})
	}
}

// On a first start (no slot yet) a missing publication is created when
// allowed, before the slot, and events flow.
func TestMissingPublicationIsCreated(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "createpub")
	e.freshStart(t)
	r := e.startRelay()
	w := e.newWriter(13)
	if err := w.run(context.Background(), 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
	r.stop(syscall.SIGTERM, 30*time.Second)
}

// freshStart undoes what migrate made besides the table, as on a first
// start: no publication, no slot, no registry row.
func (e *env) freshStart(t *testing.T) {
	t.Helper()
	mustExec(t, e, "DROP PUBLICATION "+e.Pub)
	mustExec(t, e, "SELECT pg_drop_replication_slot($1)", e.Slot)
	mustExec(t, e, "DELETE FROM "+e.Schema+"."+outboxschema.SlotRegistry)
}

func mustExec(t *testing.T, e *env, sql string, args ...any) {
	t.Helper()
	if _, err := e.DB.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// A slot dropped while the relay runs must not be silently recreated (that
// would skip every event committed in between): the relay stops and says
// how to recover.
func TestSlotDroppedWhileRunningStops(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "slotdrop")
	r := e.startRelay("--reconnect-min", "2s", "--reconnect-max", "3s")
	w := e.newWriter(14)
	if err := w.run(context.Background(), 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 50 })
	mustExec(t, e, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", e.Slot)
	waitFor(t, 10*time.Second, "the walsender to exit", func() bool {
		_, err := e.DB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", e.Slot)
		return err == nil
	})
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the relay kept running (and may have recreated the slot) after its slot was dropped")
	}
	if code := r.stop(syscall.SIGTERM, time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if log := strings.ToLower(r.log()); !strings.Contains(log, "is gone") || !strings.Contains(log, "republish") {
		t.Fatalf("the log does not explain the vanished slot:\n%s", tail([]byte(log), 2000))
	}
	var n int
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", e.Slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("slot recreated (count %d, err %v)", n, err)
	}
}

// A publication dropped while the relay streams: PostgreSQL 15 to 17 fail
// the stream ("publication ... does not exist") and the relay's start check
// stops it; PostgreSQL 18 only warns ("skipped loading publication") and
// filters every later change while keepalives move on, so a relay that
// ignored the warning would confirm the slot past events it never saw. On
// every version the relay must stop with the recovery, the slot confirmed
// no further than the first transaction written after the drop.
func TestPublicationDroppedWhileRunningStops(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "pubdrop")
	r := e.startRelay("--reconnect-min", "1s", "--reconnect-max", "2s")
	w := e.newWriter(16)
	if err := w.run(context.Background(), 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the slot to confirm the first batch", func() bool { return e.slotLSN(t) > w.LastLSN() })
	mustExec(t, e, "DROP PUBLICATION "+e.Pub)
	// several transactions, so LastLSN (inside the last one) lies past the
	// commit of the first one
	before := len(w.written())
	if err := w.run(context.Background(), 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	if got := len(w.written()) - before; got < 2 {
		t.Fatalf("wrote %d events after the drop, want several transactions", got)
	}
	select {
	case <-r.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("the relay kept running after its publication was dropped (slot confirmed %s, events written up to %s)", e.slotLSN(t), w.LastLSN())
	}
	if code := r.stop(syscall.SIGTERM, time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if confirmed := e.slotLSN(t); confirmed >= w.LastLSN() {
		t.Fatalf("slot confirmed %s, past events written after the publication was dropped (last at %s): they are lost", confirmed, w.LastLSN())
	}
	log := r.log()
	for _, want := range []string{e.Pub, "CREATE PUBLICATION", "pg_replication_slot_advance", "republish"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log does not name %q:\n%s", want, tail([]byte(log), 3000))
		}
	}
}

// A slot dropped while the relay was down (say, to free WAL disk in an
// emergency) is not silently recreated at start either: the slot registry
// remembers it. After the operator clears the registry row, the relay starts
// with a fresh slot.
func TestSlotDroppedWhileStoppedRefused(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "slotgone")
	r := e.startRelay()
	w := e.newWriter(15)
	if err := w.run(context.Background(), 20, 5, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 20 })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	waitFor(t, 10*time.Second, "the slot to be dropped", func() bool {
		_, err := e.DB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", e.Slot)
		return err == nil
	})
	code, log := e.runRelayToExit(60 * time.Second)
	if code != 1 || !strings.Contains(log, "is gone") || !strings.Contains(log, "DELETE FROM") {
		t.Fatalf("exit code %d, want 1 with recovery steps:\n%s", code, tail([]byte(log), 2000))
	}
	mustExec(t, e, "DELETE FROM "+e.Schema+"."+outboxschema.SlotRegistry+" WHERE slot_name = $1", e.Slot)
	r2 := e.startRelay()
	if err := w.run(context.Background(), 20, 5, 5, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "events after the fresh slot", func() bool { return r2.metric("outbox_relay_events_published_total") >= 20 })
	r2.stop(syscall.SIGTERM, 30*time.Second)
}

// The producer authenticates with SASL/SCRAM-SHA-512 on the broker's SASL
// listener (the consumer reads through the plain one); a wrong password
// stops the relay with the keys to check, and the secret is never logged.
func TestSASLScramAuthentication(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	sasl := svcs.Get("OUTBOX_TEST_KAFKA_SASL_BROKERS")
	user, pass := svcs.Get("OUTBOX_TEST_KAFKA_SASL_USER"), svcs.Get("OUTBOX_TEST_KAFKA_SASL_PASSWORD")
	if sasl == "" || user == "" || pass == "" {
		t.Fatal("OUTBOX_TEST_KAFKA_SASL_* not set: test/services.sh must start the SASL listener")
	}
	e := newEnv(t, "sasl")
	e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_PASSWORD=" + pass}
	r := e.startRelay("--kafka-brokers", sasl, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", user)
	w := e.newWriter(16)
	if err := w.run(context.Background(), 200, 5, 20, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
	r.stop(syscall.SIGTERM, 30*time.Second)
	if strings.Contains(r.log(), pass) {
		t.Fatal("the relay log contains the SASL password")
	}

	wrong := "not-" + pass
	e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_PASSWORD=" + wrong}
	code, log := e.runRelayToExit(60*time.Second, "--kafka-brokers", sasl, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", user)
	if code != 1 || !strings.Contains(log, "kafka.sasl.password") {
		t.Fatalf("wrong password: exit %d, want 1 naming kafka.sasl.password:\n%s", code, tail([]byte(log), 2000))
	}
	if strings.Contains(log, wrong) {
		t.Fatal("the relay log contains the (wrong) SASL password")
	}
}

// The producer speaks TLS to the broker's SSL listener, verifying its
// certificate against kafka.tls.ca_file; without the CA it stops and says
// which key to set.
func TestTLSProducer(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	tlsBrokers, ca := svcs.Get("OUTBOX_TEST_KAFKA_TLS_BROKERS"), svcs.Get("OUTBOX_TEST_KAFKA_TLS_CA_FILE")
	if tlsBrokers == "" || ca == "" {
		t.Fatal("OUTBOX_TEST_KAFKA_TLS_* not set: test/services.sh must start the TLS listener")
	}
	e := newEnv(t, "tls")
	r := e.startRelay("--kafka-brokers", tlsBrokers, "--kafka-tls", "--kafka-tls-ca-file", ca)
	w := e.newWriter(17)
	if err := w.run(context.Background(), 200, 5, 20, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
	r.stop(syscall.SIGTERM, 30*time.Second)

	code, log := e.runRelayToExit(60*time.Second, "--kafka-brokers", tlsBrokers, "--kafka-tls")
	if code != 1 || !strings.Contains(log, "kafka.tls.ca_file") {
		t.Fatalf("untrusted certificate: exit %d, want 1 naming kafka.tls.ca_file:\n%s", code, tail([]byte(log), 2000))
	}
}

// Every kafka.compression codec reaches a real consumer whole: the direct
// engine compresses its record batches itself, and the broker checks each
// batch (CRC, record count) before a consumer decompresses it.
func TestCompressionCodecs(t *testing.T) {
	t.Parallel() // own outboxes, relays and topics; no service fault, no shared proxy
	for _, codec := range []string{"gzip", "snappy", "lz4", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, codec)
			r := e.startRelay("--kafka-compression", codec)
			w := e.newWriter(23)
			if err := w.run(context.Background(), 400, 20, 30, 0, ""); err != nil {
				t.Fatal(err)
			}
			ws := w.written()
			requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
			r.stop(syscall.SIGTERM, 30*time.Second)
		})
	}
}

// migrate is idempotent: a second run applies nothing, the history records
// each version once, and the objects it made exist.
func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()              // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "migrate") // ran migrate once
	out, err := exec.Command(relayBin, append([]string{"migrate"}, e.flags()...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("second migrate: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"applied":[]`) {
		t.Fatalf("second migrate applied something:\n%s", out)
	}
	var versions, pubs, idx, createdIdx int
	ctx := context.Background()
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM "+e.Schema+"."+outboxschema.MigrationHistory+" WHERE target = $1", e.Table).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1 AND pubinsert AND NOT pubupdate AND NOT pubdelete", e.Pub).Scan(&pubs); err != nil {
		t.Fatal(err)
	}
	// Migration 0005 replaced the partial index on published_at IS NULL
	// (it held every row) by one on created_at.
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FILTER (WHERE indexdef LIKE '%WHERE (published_at IS NULL)%'), count(*) FILTER (WHERE indexdef LIKE '%(created_at)') FROM pg_indexes WHERE schemaname = $1 AND tablename = 'outbox'", e.Schema).Scan(&idx, &createdIdx); err != nil {
		t.Fatal(err)
	}
	var dlqIdx int
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexdef LIKE '%WHERE ((dead_lettered_at IS NOT NULL) AND (dlq_resolved_at IS NULL))%'", e.Schema).Scan(&dlqIdx); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../../migrations/*.sql")
	if versions != len(files) || pubs != 1 || idx != 0 || createdIdx != 1 || dlqIdx != 1 {
		t.Fatalf("after two migrates: %d recorded versions (want %d, one per migrations/*.sql), %d insert-only publications (want 1), %d partial indexes on published_at (want 0), %d on created_at and %d on dead_lettered_at (want 1 each)",
			versions, len(files), pubs, idx, createdIdx, dlqIdx)
	}
}

// An applied migration whose file changed since is never re-run, so migrate
// refuses instead of silently not applying the change; a checksum recorded
// by an older relay (over the SQL with names filled in) is accepted and
// replaced by the file's.
func TestMigrateChecksum(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	tests := []struct {
		name     string
		version  int
		recorded func(m migrations.Migration) string // the checksum to store
		ok       bool
		want     []string // in migrate's output
	}{
		{"file changed after it was applied", 2, func(migrations.Migration) string { return strings.Repeat("0", 64) }, false,
			[]string{"version 2", "migrations/0002_slot_registry.sql", "changed after it was applied", "new migration", "UPDATE"}},
		{"checksum recorded with names substituted", 1, func(m migrations.Migration) string {
			sum := sha256.Sum256([]byte(m.SQL))
			return hex.EncodeToString(sum[:])
		}, true, []string{`"applied":[]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, "migsum") // ran migrate once
			tbl, _ := outboxschema.ParseTable(e.Table)
			ms, err := migrations.Load(migrations.Names{Schema: tbl.Schema, Table: tbl.Name, Publication: e.Pub})
			if err != nil {
				t.Fatal(err)
			}
			var m migrations.Migration
			for _, m = range ms {
				if m.Version == tt.version {
					break
				}
			}
			history := e.Schema + "." + outboxschema.MigrationHistory
			set := "UPDATE " + history + " SET checksum = $3 WHERE target = $1 AND version = $2"
			mustExec(t, e, set, e.Table, tt.version, tt.recorded(m))
			out, err := exec.Command(relayBin, append([]string{"migrate"}, e.flags()...)...).CombinedOutput()
			if (err == nil) != tt.ok {
				t.Fatalf("migrate: err = %v, want ok=%v\n%s", err, tt.ok, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("migrate output lacks %q:\n%s", w, out)
				}
			}
			var got string
			if err := e.DB.QueryRow(context.Background(), "SELECT checksum FROM "+history+" WHERE target = $1 AND version = $2",
				e.Table, tt.version).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: m.Checksum, false: tt.recorded(m)}[tt.ok]; got != want {
				t.Errorf("recorded checksum after migrate = %s, want %s", got, want)
			}
			if !tt.ok { // the fix it suggests works
				mustExec(t, e, set, e.Table, tt.version, m.Checksum)
				if out, err := exec.Command(relayBin, append([]string{"migrate"}, e.flags()...)...).CombinedOutput(); err != nil {
					t.Fatalf("migrate after restoring the checksum: %v\n%s", err, out)
				}
			}
		})
	}
}
