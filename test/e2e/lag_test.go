//go:build e2e

package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// The seeds' lag alert: a 40 s broker stall under a trickle of writes
// drives outbox_relay_lag_seconds above 30 s, and it falls under 5 s within
// 30 s of the broker's return. Nothing is lost.
func TestLagSecondsThroughBrokerStall(t *testing.T) {
	t.Parallel() // waits on its own relay, outbox and the Kafka proxy (the only parallel test that uses it): runs beside the other waiting tests, after the sequential ones
	e := newEnv(t, "lagstall")
	kpx, kafkaAddr := kafkaProxy(t)
	r := e.startRelay("--kafka-brokers", kafkaAddr)
	w := e.newWriter(111)
	ctx, stopWriting := context.WithCancel(context.Background())
	defer stopWriting()
	written := make(chan error, 1)
	go func() { written <- w.run(ctx, 400, 1, 10, 100*time.Second, "") }() // 4 events a second
	waitFor(t, 30*time.Second, "first events acked", func() bool { return r.metric("outbox_relay_events_published_total") >= 10 })
	if lag := r.metric("outbox_relay_lag_seconds"); lag < 0 || lag >= 5 {
		t.Fatalf("outbox_relay_lag_seconds = %v before the stall, want 0..5", lag)
	}

	kpx.Blackhole()
	cut := time.Now()
	peak := 0.0
	waitFor(t, 60*time.Second, "a 40 s stall", func() bool {
		peak = max(peak, r.metric("outbox_relay_lag_seconds"))
		return time.Since(cut) >= 40*time.Second
	})
	t.Logf("outbox_relay_lag_seconds after %s of broker stall: %.1f", time.Since(cut).Round(time.Second), peak)
	if peak <= 30 {
		t.Errorf("outbox_relay_lag_seconds peaked at %.1f during a 40 s stall, want > 30", peak)
	}

	if err := kpx.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	var lag float64
	waitFor(t, 30*time.Second, "outbox_relay_lag_seconds < 5 after the broker returned", func() bool {
		lag = r.metric("outbox_relay_lag_seconds")
		return lag >= 0 && lag < 5
	})
	t.Logf("outbox_relay_lag_seconds %.2f, %s after the broker returned", lag, time.Since(healed).Round(100*time.Millisecond))

	stopWriting()
	if err := <-written; err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	ws := w.written()
	requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), true)
	if n := r.metric("outbox_relay_heartbeats_total"); n < 40 {
		t.Errorf("outbox_relay_heartbeats_total = %v after more than 40 s, want >= 40", n)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}

// An idle relay with heartbeats reports a lag under 2 s, decodes no event,
// and its slot's confirmed position keeps up with the WAL the heartbeats
// write.
func TestLagIdleHeartbeats(t *testing.T) {
	e := newEnv(t, "lagidle")
	r := e.startRelay()
	waitFor(t, 30*time.Second, "heartbeats written", func() bool { return r.metric("outbox_relay_heartbeats_total") >= 3 })
	for i := 0; i < 3; i++ {
		// Each round: the WAL end now (heartbeats move it every second) is
		// confirmed within a few heartbeats.
		end := e.currentLSN(t)
		waitFor(t, 5*time.Second, "slot confirmed past "+end.String(), func() bool { return e.slotLSN(t) >= end })
		if lag := r.metric("outbox_relay_lag_seconds"); lag < 0 || lag >= 2 {
			t.Errorf("outbox_relay_lag_seconds = %v on an idle relay, want 0..2", lag)
		}
		waitFor(t, 5*time.Second, "WAL moved by a heartbeat", func() bool { return e.currentLSN(t) > end })
	}
	if n := r.metric("outbox_relay_events_decoded_total"); n != 0 {
		t.Errorf("outbox_relay_events_decoded_total = %v on an idle outbox, want 0: heartbeats are not events", n)
	}
	if n := r.metric("outbox_relay_heartbeat_errors_total"); n != 0 {
		t.Errorf("outbox_relay_heartbeat_errors_total = %v, want 0", n)
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
}
