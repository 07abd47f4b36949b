//go:build e2e

package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// One shutdown deadline: with events in flight that can never be acked
// (Kafka, or Kafka and PostgreSQL, blackholed mid-stream), SIGTERM ends the
// process within shutdown_timeout + relay.ExitMargin (5 s), the bound
// deploy/kubernetes sizes terminationGracePeriodSeconds by. Nothing is lost:
// a relay started after the cut heals delivers every event.
func TestShutdownDeadlineHoldsWhenServicesStall(t *testing.T) {
	const shutdownTimeout, exitMargin, slack = 3 * time.Second, 5 * time.Second, 2 * time.Second
	for _, tc := range []struct {
		name      string
		cutPG     bool
		wantClean bool // exit code 0: the stop itself worked
	}{
		{name: "kafka", wantClean: true},
		{name: "kafka and postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "deadline")
			kpx, kafkaAddr := kafkaProxy(t)
			pgpx := startProxy(t, "127.0.0.1:0", pgHostPort())
			r := e.launchRelay("--kafka-brokers", kafkaAddr, "--shutdown-timeout", shutdownTimeout.String(),
				"--postgres-url", replaceHostPort(pgURL, pgpx.Addr()))
			r.waitReady(60 * time.Second)
			w := e.newWriter(91)
			if err := w.run(context.Background(), 200, 5, 10, 0, ""); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "first events acked", func() bool { return r.metric("outbox_relay_events_published_total") > 0 })

			kpx.Blackhole()
			if tc.cutPG {
				// Events must be read before PostgreSQL goes silent too.
				if err := w.run(context.Background(), 200, 5, 10, 0, ""); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 30*time.Second, "events in flight", func() bool { return r.metric("outbox_relay_inflight_events") > 0 })
				pgpx.Blackhole()
			} else {
				if err := w.run(context.Background(), 200, 5, 10, 0, ""); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 30*time.Second, "events in flight", func() bool { return r.metric("outbox_relay_inflight_events") > 0 })
			}
			start := time.Now()
			code := r.stop(syscall.SIGTERM, shutdownTimeout+exitMargin+slack)
			took := time.Since(start)
			t.Logf("exit %d %s after SIGTERM (shutdown_timeout %s)", code, took.Round(time.Millisecond), shutdownTimeout)
			if took < shutdownTimeout-500*time.Millisecond {
				t.Errorf("exited after %s: it did not wait for the in-flight acks at all", took)
			}
			if tc.wantClean && code != 0 {
				t.Errorf("exit code %d, want 0: an undrained stop is still a stop", code)
			}

			kpx.Heal()
			pgpx.Heal()
			r2 := e.startRelay()
			rs := consume(t, e.topics(), len(w.written()), 90*time.Second, 2*time.Second)
			requireClean(t, check(t, w.written(), rs, e.partitions(t)), true)
			r2.stop(syscall.SIGTERM, 30*time.Second)
		})
	}
}
