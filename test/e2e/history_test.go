//go:build e2e

package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A slot put back at an earlier position while the relay runs (here the
// operator drops it and copies an older slot in its place, as when a slot
// is restored from a backup) leaves the server's confirmed_flush_lsn behind
// the relay's in-memory ack watermark on the same server history. The next
// session streams from the slot, but the relay does not publish again what
// it acked: the server is on the same history (system, timeline, the slot's
// registry row and generation), and the stream shows the last acked
// transaction again (same LSNs, xid and commit time), which proves the WAL
// in between is the one delivered. A server that really went back (a
// restore, a failover) is TestHistory*'s; the decision itself is unit-tested
// in history and relay.
func TestSlotBehindWatermarkResumesVerified(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "slotbehind")
	ctx := context.Background()
	older := e.Slot + "_older"
	mustExec(t, e, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", older)
	t.Cleanup(func() { e.DB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", older) })
	// A slow reconnect leaves time to swap the slot while the relay waits.
	r := e.startRelay("--reconnect-min", "6s", "--reconnect-max", "6s")
	w := e.newWriter(31)
	if err := w.run(ctx, 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the first 100 events acked", func() bool {
		return r.metric("outbox_relay_events_published_total") >= 100
	})
	mustExec(t, e, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", e.Slot)
	waitFor(t, 5*time.Second, "the slot to be replaced by a copy of the older one", func() bool {
		_, err := e.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1), pg_copy_logical_replication_slot($2, $1)", e.Slot, older)
		return err == nil
	})
	waitFor(t, 60*time.Second, "the relay to stream again", func() bool {
		return r.metric("outbox_relay_replication_reconnects_total") >= 1 && r.readyStatus() == 200
	})
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 2*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, true)
	if len(rep.DuplicateIDs) != 0 {
		t.Errorf("%d events published twice after the slot went back on the same history (want 0: the relay verified its own position): %v", len(rep.DuplicateIDs), rep.DuplicateIDs)
	}
	if n := r.metric("outbox_relay_resume_skipped_events_total"); n < 1 {
		t.Errorf("outbox_relay_resume_skipped_events_total = %v, want the events between the older slot and the watermark", n)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if log := r.log(); !strings.Contains(log, "behind the acked watermark") || !strings.Contains(log, "resumed at the kept position") {
		t.Errorf("the relay log does not say it resumed behind its watermark and verified its position:\n%s", tail([]byte(log), 3000))
	}
}
