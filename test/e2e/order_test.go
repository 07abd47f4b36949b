//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// An error the broker returns and that heals within dead_letter.max_attempts
// (here a record larger than the topic's max.message.bytes, until the
// operator raises it) rewinds the relay to the ack watermark: the failed
// event and every later one are published again in commit order, nothing is
// lost, and every reorder a consumer can see (a later event of the
// aggregate written before the failed one) is one the relay counted in
// outbox_relay_reordered_events_total.
func TestReturnedErrorRewindsInOrder(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "rewind")
	topic := e.Prefix + ".order"
	small := "2000"
	if err := testkit.CreateTopics(brokers, 1, map[string]*string{"max.message.bytes": &small}, topic); err != nil {
		t.Fatal(err)
	}
	// sarama's engine: the direct one knows a record refused alone in its
	// batch, and that refusal cannot heal (issue 36: dead-lettered at the
	// first answer); sarama's does not say what a record was batched with,
	// so its refusals keep their attempts, the path this test walks. With
	// compression the relay cannot know the size on the wire beforehand
	// (without, it would refuse the record before sending, against the
	// topic's max.message.bytes), and the large payload is random, so it
	// does not compress under the limit.
	r := e.startRelay("--dlq-max-attempts", "100", "--dlq-retry-backoff", "200ms", "--kafka-producer", "sarama", "--kafka-compression", "lz4")
	ctx := context.Background()
	insert := func(payload string) int64 {
		var id int64
		if err := e.DB.QueryRow(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'order.changed', $1) RETURNING id",
			payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	var ids []int64
	noise := make([]byte, 2400)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, insert(fmt.Sprintf(`{"n":0,"pad":%q}`, base64.StdEncoding.EncodeToString(noise)))) // too large for the topic, for now
	for i := 1; i <= 50; i++ {
		ids = append(ids, insert(fmt.Sprintf(`{"n":%d}`, i)))
	}
	target := e.currentLSN(t)
	waitFor(t, 60*time.Second, "the broker refusing the large event", func() bool { return r.metric("outbox_relay_rewinds_total") >= 2 })
	admin, err := sarama.NewClusterAdmin(brokers, testkit.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	big := "1000000"
	if err := admin.AlterConfig(sarama.TopicResource, topic, map[string]*string{"max.message.bytes": &big}, false); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	rs := consume(t, []string{topic}, len(ids), 60*time.Second, 3*time.Second)
	first := map[int64]int{} // event id -> position of its first delivery
	var order []int64
	for _, rec := range rs {
		id, _ := testkit.RecordID(rec)
		if _, ok := first[id]; !ok {
			first[id] = len(order)
			order = append(order, id)
		}
	}
	violations, highest := 0, int64(0) // events first delivered after a later event of the aggregate
	for _, id := range order {
		if id < highest {
			violations++
		}
		highest = max(highest, id)
	}
	for _, id := range ids {
		if _, ok := first[id]; !ok {
			t.Errorf("event %d never arrived", id)
		}
	}
	reorders, rewinds := r.metric("outbox_relay_reordered_events_total"), r.metric("outbox_relay_rewinds_total")
	t.Logf("%d rewinds; %d records for %d events; first deliveries out of order: %d; reorders counted by the relay: %d",
		int(rewinds), len(rs), len(ids), violations, int(reorders))
	if float64(violations) > reorders {
		t.Errorf("the consumer saw %d events out of order but the relay counted %d reorders: one went undetected", violations, int(reorders))
	}
	if r.metric("outbox_relay_dead_lettered_total") != 0 {
		t.Error("the event was dead-lettered although the broker took it within max_attempts")
	}
	waitFor(t, 30*time.Second, "slot confirmed past every event", func() bool { return e.slotLSN(t) >= target })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
}
