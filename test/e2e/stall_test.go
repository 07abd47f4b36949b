//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Nothing stalls silently: while Kafka takes no acks (blackholed), the
// leader turns not ready once its oldest unacked event is older than
// max_unacked_age, and ready again once the acks come back; the process
// stays alive (/healthz) and nothing is lost.
func TestUnackedAgeTurnsNotReady(t *testing.T) {
	e := newEnv(t, "unackedage")
	kpx, kafkaAddr := kafkaProxy(t)
	r := e.startRelay("--kafka-brokers", kafkaAddr, "--max-unacked-age", "2s")
	ctx := context.Background()
	w := e.newWriter(71)
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "first events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 50 })
	if code, body := r.get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %q before the cut, want 200", code, body)
	}

	kpx.Blackhole()
	if err := w.run(ctx, 50, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "events in flight", func() bool { return r.metric("outbox_relay_inflight_events") > 0 })
	cut := time.Now()
	var body string
	waitFor(t, 10*time.Second, "/readyz 503 naming max_unacked_age", func() bool {
		var code int
		code, body = r.get("/readyz")
		return code == 503 && strings.Contains(body, "max_unacked_age 2s")
	})
	t.Logf("not ready %s after the events went in flight: %s", time.Since(cut).Round(100*time.Millisecond), strings.TrimSpace(body))
	if age := r.metric("outbox_relay_oldest_unacked_seconds"); age < 2 {
		t.Errorf("outbox_relay_oldest_unacked_seconds = %v while not ready, want >= 2", age)
	}
	if code, _ := r.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d while Kafka is cut, want 200: the process is alive", code)
	}

	kpx.Heal()
	waitFor(t, 120*time.Second, "/readyz 200 after the heal", func() bool { code, _ := r.get("/readyz"); return code == 200 })
	if age := r.metric("outbox_relay_oldest_unacked_seconds"); age >= 2 {
		t.Errorf("outbox_relay_oldest_unacked_seconds = %v after the heal", age)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), true)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

// A dead letter whose row mark the database rejects for good (here a
// BEFORE UPDATE trigger that refuses dead-lettered rows) halts the relay
// with the trigger's message, slot held before the event, instead of
// retrying the mark silently for ever. After the trigger is dropped, a
// restart dead-letters the row and delivers everything.
func TestRejectedRowMarkHalts(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "markreject")
	ctx := context.Background()
	fn := e.Schema + ".refuse_dead_letters"
	mustExec(t, e, "CREATE FUNCTION "+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.dead_lettered_at IS NOT NULL THEN
				RAISE EXCEPTION 'dead letters are frozen by policy (row %)', NEW.id;
			END IF;
			RETURN NEW;
		END $$`)
	mustExec(t, e, "CREATE TRIGGER refuse_dead_letters BEFORE UPDATE ON "+e.Table+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	dlq := e.Prefix + ".dlq"
	r := e.startRelay("--dlq-topic", dlq)
	w := e.newWriter(72)
	if err := w.run(ctx, 30, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "good events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 30 })
	id := e.insertRow(t, "order", "order-1", "order.updated", `{}`, `["not", "an", "object"]`) // a bad row: dead-lettered
	if err := w.run(ctx, 20, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "outbox_relay_halted = 1", func() bool { return r.metric("outbox_relay_halted") == 1 })
	code, body := r.get("/readyz")
	if code != 503 || !strings.Contains(body, "frozen by policy") || !strings.Contains(body, fmt.Sprintf("id=%d", id)) {
		t.Errorf("/readyz = %d %q, want 503 with the trigger's message and the row id", code, body)
	}
	if code, _ := r.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if !r.running() {
		t.Fatal("the relay exited; a halt keeps it up (not ready)")
	}
	if c, at := e.slotLSN(t), r.haltedLSN(); c > at {
		t.Fatalf("slot confirmed %s past the commit LSN %s of the row whose mark failed", c, at)
	}
	log := r.log()
	for _, want := range []string{e.Table, fmt.Sprintf("id=%d", id), "frozen by policy", "HALTED"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not name %q:\n%s", want, tail([]byte(log), 2000))
		}
	}
	if code := r.stop(syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM while halted, want 0", code)
	}

	mustExec(t, e, "DROP TRIGGER refuse_dead_letters ON "+e.Table)
	r = e.startRelay("--dlq-topic", dlq)
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), true)
	waitFor(t, 30*time.Second, "row marked dead-lettered", func() bool {
		var dead bool
		err := e.DB.QueryRow(ctx, "SELECT dead_lettered_at IS NOT NULL FROM "+e.Table+" WHERE id = $1", id).Scan(&dead)
		return err == nil && dead
	})
}
