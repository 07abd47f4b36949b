//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/proxy"
)

// Nothing stalls silently: while Kafka takes no acks (blackholed), the
// leader turns not ready once its oldest unacked event is older than
// max_unacked_age, and ready again once the acks come back; the process
// stays alive (/healthz) and nothing is lost.
func TestUnackedAgeTurnsNotReady(t *testing.T) {
	e := newEnv(t, "unackedage")
	port, target := os.Getenv("OUTBOX_TEST_KAFKA_PROXY_PORT"), os.Getenv("OUTBOX_TEST_KAFKA_PROXY_TARGET")
	if port == "" || target == "" {
		t.Fatal("OUTBOX_TEST_KAFKA_PROXY_PORT and _TARGET are not set: start the services with test/services.sh")
	}
	kpx, err := proxy.New("127.0.0.1:"+port, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kpx.Close() })
	r := e.startRelay("--kafka-brokers", "127.0.0.1:"+port, "--max-unacked-age", "2s")
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
