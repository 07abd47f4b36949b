//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// A broker quota (producer_byte_rate 16 KB/s for the relay's client id)
// throttles the direct producer: the throttle times the broker answers
// with are counted (outbox_relay_kafka_throttled_requests_total,
// _throttle_seconds_total), the relay waits them out, and every event
// arrives once, in order, with no publish error.
func TestThrottledByQuota(t *testing.T) {
	t.Parallel() // own outbox, relay, topics and client id; no service fault
	const (
		events = 1500
		rate   = 16 << 10
	)
	e := newEnv(t, "quota")
	client := e.Prefix + "-throttled"
	if err := testkit.SetProducerQuota(brokers, client, rate); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testkit.SetProducerQuota(brokers, client, 0); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	if err := testkit.CreateTopics(brokers, 3, nil, e.topics()...); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--kafka-client-id", client)
	w := e.newWriter(219)
	ctx := context.Background()
	start := time.Now()
	if err := w.run(ctx, events, 5, 50, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	if err := e.WaitConfirmed(ctx, e.currentLSN(t), 3*time.Minute); err != nil {
		t.Fatalf("slot not confirmed past every event: %v", err)
	}
	took := time.Since(start)
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	throttled, secs := r.metric("outbox_relay_kafka_throttled_requests_total"), r.metric("outbox_relay_kafka_throttle_seconds_total")
	requests := r.metric("outbox_relay_kafka_produce_requests_total")
	errs := r.metric("outbox_relay_publish_errors_total")
	t.Logf("%d events (%d bytes of records read) in %s under a %d B/s quota: %v produce requests, %v throttled, %.1f s of throttle asked; %d lost, %d duplicates, %d reordered; %v publish errors",
		len(ws), recordBytes(rs), took.Round(100*time.Millisecond), rate, requests, throttled, secs, rep.Lost, rep.Duplicates, rep.OrderViolations, errs)
	if rep.Lost != 0 || rep.Duplicates != 0 || rep.OrderViolations != 0 || rep.PartitionViolations != 0 {
		t.Fatalf("delivery under a quota: %+v", rep.Problems)
	}
	if throttled < 1 || secs <= 0 {
		t.Fatalf("no throttle counted under a quota: %v requests, %v s", throttled, secs)
	}
	if errs > 0 {
		t.Errorf("%v publish errors while throttled, want 0", errs)
	}
}

func recordBytes(rs []record) int {
	n := 0
	for _, r := range rs {
		n += len(r.Key) + len(r.Value)
		for k, v := range r.Headers {
			n += len(k) + len(v)
		}
	}
	return n
}
