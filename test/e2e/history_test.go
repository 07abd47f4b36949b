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
// the relay's in-memory ack watermark on the same server history. The relay
// trusts the server: the next session resumes from the slot and republishes
// what the slot does not have, so a server that went back never makes it
// skip anything. What a changed IDENTIFY_SYSTEM (a promoted replica) does is
// unit-tested in replication and exercised by a real promotion in
// failover_test.go.
func TestSlotBehindWatermarkIsTrusted(t *testing.T) {
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
	first := w.written()
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
	rs := consume(t, e.topics(), len(ws)+len(first), 90*time.Second, 2*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, true)
	dup := map[int64]bool{}
	for _, id := range rep.DuplicateIDs {
		dup[id] = true
	}
	missing := 0
	for _, ev := range first {
		if !dup[ev.ID] {
			missing++
		}
	}
	if missing != 0 {
		t.Errorf("%d of the %d events before the slot went back were not republished: the relay resumed from its own watermark, ahead of the server's confirmed_flush_lsn, and would skip whatever the server's history holds there", missing, len(first))
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if log := r.log(); !strings.Contains(log, "behind the acked watermark") {
		t.Errorf("the relay log does not say it resumed behind its watermark:\n%s", tail([]byte(log), 3000))
	}
}
