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

// A service that is down at start is waited for: the relay stays up, alive
// but not ready, and never crash-loops; when the service comes, it works.
// Kafka is "down" behind a proxy that refuses connections (the broker
// advertises the proxy's port on its PROXIED listener), then heals.
func TestKafkaDownAtStartIsWaitedFor(t *testing.T) {
	e := newEnv(t, "kafkalate")
	px, kafkaAddr := kafkaProxy(t)
	if err := px.Refuse(); err != nil {
		t.Fatal(err)
	}
	r := e.launchRelay("--kafka-brokers", kafkaAddr)
	notReadyButAlive(t, r, 6*time.Second)
	if log := r.log(); !strings.Contains(log, "kafka not reachable; retrying") {
		t.Errorf("log does not say Kafka is retried:\n%s", tail([]byte(log), 2000))
	}
	if err := px.Heal(); err != nil {
		t.Fatal(err)
	}
	r.waitReady(60 * time.Second)
	w := e.newWriter(21)
	if err := w.run(context.Background(), 100, 5, 10, 0, ""); err != nil {
		t.Fatal(err)
	}
	rs := consume(t, e.topics(), len(w.written()), 60*time.Second, 2*time.Second)
	requireClean(t, check(t, w.written(), rs, e.partitions(t)), false)
}

func TestPostgresUnreachableAtStartIsRetried(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "pglate")
	closed := freePort(t) // nothing listens there
	r := e.launchRelay("--postgres-url", replaceHostPort(pgURL, closed), "--reconnect-max", "1s")
	notReadyButAlive(t, r, 6*time.Second)
	log := r.log()
	if !strings.Contains(log, "retrying") || !strings.Contains(log, closed) {
		t.Errorf("log does not say it is retrying %s:\n%s", closed, tail([]byte(log), 2000))
	}
	if strings.Contains(log, passwordOf(pgURL)) {
		t.Error("the log contains the PostgreSQL password")
	}
	if code := r.stop(syscall.SIGTERM, 10*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

// notReadyButAlive checks for d that the process runs, /healthz answers 200
// and /readyz 503.
func notReadyButAlive(t *testing.T, r *relay, d time.Duration) {
	t.Helper()
	waitFor(t, 30*time.Second, "/healthz", func() bool { c, _ := r.get("/healthz"); return c == 200 })
	// An observation window: the relay must keep waiting for all of d.
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if !r.running() {
			t.Fatalf("relay exited while a service was down; it must wait:\n%s", tail([]byte(r.log()), 2000))
		}
		if c, _ := r.get("/readyz"); c != 503 {
			t.Fatalf("/readyz = %d while a service is down, want 503", c)
		}
	}
}

// A slot invalidated by max_slot_wal_keep_size (wal_status = lost) is
// fatal at once, with the remediation, instead of being retried for ever.
func TestLostSlotFailsFast(t *testing.T) {
	e := newEnv(t, "lostslot")
	ctx := context.Background()
	mustExec(t, e, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	mustExec(t, e, "SELECT pg_reload_conf()")
	t.Cleanup(func() {
		e.DB.Exec(ctx, "ALTER SYSTEM RESET max_slot_wal_keep_size")
		e.DB.Exec(ctx, "SELECT pg_reload_conf()")
	})
	mustExec(t, e, "CREATE TABLE "+e.Schema+".filler (x text)")
	waitFor(t, 60*time.Second, "slot to be invalidated", func() bool {
		for i := 0; i < 3; i++ {
			mustExec(t, e, "INSERT INTO "+e.Schema+".filler SELECT repeat('x', 100) FROM generate_series(1, 2000)")
			mustExec(t, e, "SELECT pg_switch_wal()")
		}
		mustExec(t, e, "CHECKPOINT")
		var status string
		err := e.DB.QueryRow(ctx, "SELECT COALESCE(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", e.Slot).Scan(&status)
		return err == nil && status == "lost"
	})
	start := time.Now()
	code, log := e.runRelayToExit(60 * time.Second)
	if code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, tail([]byte(log), 3000))
	}
	for _, want := range []string{"wal_status = lost", "pg_drop_replication_slot", "outbox-relay replay --since 20", "harmless", "max_slot_wal_keep_size"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, tail([]byte(log), 3000))
		}
	}
	t.Logf("lost slot refused after %s", time.Since(start).Round(time.Millisecond))
}

// wal_level below logical is refused with the command that fixes it. It
// needs a PostgreSQL restart both ways, and a server with logical slots
// will not start at wal_level replica, so the test drops its slot first
// and requires that no other logical slot exists.
func TestWalLevelNotLogicalRefused(t *testing.T) {
	e := newEnv(t, "wallevel")
	ctx := context.Background()
	mustExec(t, e, "SELECT pg_drop_replication_slot($1)", e.Slot)
	// Inactive slots other e2e runs left behind on a reused dev server.
	mustExec(t, e, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'e2e\\_%' AND NOT active")
	var others []string
	rows, _ := e.DB.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'")
	for rows.Next() {
		var s string
		rows.Scan(&s)
		others = append(others, s)
	}
	if len(others) > 0 {
		t.Fatalf("logical slots %v exist on the test server; PostgreSQL would not restart at wal_level replica", others)
	}
	mustExec(t, e, "ALTER SYSTEM SET wal_level = replica")
	restored := false
	restore := func() {
		if !restored {
			restored = true
			e.DB.Exec(ctx, "ALTER SYSTEM RESET wal_level")
			svc(t, "pg-restart", "fast")
		}
	}
	t.Cleanup(restore)
	svc(t, "pg-restart", "fast")
	e.DB.Reset()
	code, log := e.runRelayToExit(60 * time.Second)
	if code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, tail([]byte(log), 3000))
	}
	for _, want := range []string{"wal_level is", "replica", "ALTER SYSTEM SET wal_level = logical", "restart PostgreSQL"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, tail([]byte(log), 3000))
		}
	}
	restore()
	e.DB.Reset()
	var level string
	if err := e.DB.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		t.Fatal(fmt.Errorf("wal_level after restore: %q, %v", level, err))
	}
}
