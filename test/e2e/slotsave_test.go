//go:build e2e

package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// Before PostgreSQL 17 the server writes a logical slot's
// confirmed_flush_lsn to disk only when a confirmation also moves the slot's
// restart_lsn or catalog_xmin, and those move only past a running-transactions
// record decoded through the slot, which the server logs every 15 s under
// write load (and at checkpoints). A PostgreSQL restart then put the slot
// back to its last write (in the short chaos run, to its creation) and the
// relay, which resumes from the slot, published everything since again. The
// leader has the server log such a record about every second while its
// confirmations move (replication.SlotSaver); each restart_lsn move here is
// a write of the slot (LogicalConfirmReceivedLocation saves the slot when
// restart_lsn moves). The chaos scenario pg_restart measures the effect of
// real restarts.
func TestSlotWrittenEverySecond(t *testing.T) {
	t.Parallel() // own outbox, relay and slot; no service fault, no shared proxy
	e := newEnv(t, "slotsave")
	r := e.startRelay()
	w := e.newWriter(43)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.run(ctx, 1000, 3, 10, 20*time.Second, "") }()

	restart := func() string {
		var l string
		if err := e.DB.QueryRow(ctx, "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1", e.Slot).Scan(&l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	seen := map[string]bool{restart(): true}
	start := time.Now()
	defer func() {
		if t.Failed() {
			t.Logf("restart_lsn took %d values; outbox_relay_slot_saves_total %v", len(seen), r.metric("outbox_relay_slot_saves_total"))
		}
	}()
	waitFor(t, 10*time.Second, "restart_lsn to move 3 times (the slot written 3 times) and 3 slot saves", func() bool {
		seen[restart()] = true
		return len(seen) >= 4 && r.metric("outbox_relay_slot_saves_total") >= 3
	})
	t.Logf("restart_lsn took %d values in %s; outbox_relay_slot_saves_total %v", len(seen), time.Since(start).Round(100*time.Millisecond),
		r.metric("outbox_relay_slot_saves_total"))
	cancel()
	<-done
	if n := r.metric("outbox_relay_slot_save_errors_total"); n != 0 {
		t.Errorf("outbox_relay_slot_save_errors_total %v, want 0", n)
	}
	var left int
	if err := e.DB.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'outbox\\_relay\\_save\\_%' AND NOT temporary").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d permanent outbox_relay_save_* slots: the slot saver's slots must be temporary", left)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// An idle relay makes the server write no running-transactions record: the
// slot saver keeps confirmations past events only. Without that rule it
// wrote one a second for ever, heartbeats or not (each record is WAL the
// relay then confirms past, which moved the confirmed position again); the
// bench measured it at about a quarter of an idle relay's WAL and a third
// of its sessions' CPU.
func TestSlotNotSavedWhileIdle(t *testing.T) {
	t.Parallel() // own outbox, relay and slot
	e := newEnv(t, "slotidle")
	r := e.startRelay()
	e.insertRow(t, "order", "o-1", "order.created", `{"n":1}`, `{}`)
	waitFor(t, 15*time.Second, "the event's slot save", func() bool { return r.metric("outbox_relay_slot_saves_total") >= 1 })
	time.Sleep(2 * time.Second) // a save due for the event's confirmation goes meanwhile
	saves, beats := r.metric("outbox_relay_slot_saves_total"), r.metric("outbox_relay_heartbeats_total")
	time.Sleep(5 * time.Second)
	if n := r.metric("outbox_relay_heartbeats_total") - beats; n < 3 {
		t.Fatalf("%v heartbeats in 5 s idle, want at least 3: the test needs the idle WAL they write", n)
	}
	if n := r.metric("outbox_relay_slot_saves_total") - saves; n != 0 {
		t.Errorf("%v slot saves in 5 s idle (heartbeats only), want 0: nothing confirmed since needs keeping", n)
	}
	// The next event is kept again.
	e.insertRow(t, "order", "o-2", "order.created", `{"n":2}`, `{}`)
	waitFor(t, 15*time.Second, "a slot save for the next event", func() bool { return r.metric("outbox_relay_slot_saves_total") > saves })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}
