//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Issue 36, exactly-once mode: an event for a topic that does not exist
// waits kafka.missing_topic_timeout, then becomes a dead letter (reason
// unknown_topic) inside a Kafka transaction; every other event is
// committed once, the slot passes the bad event, the topic is not created.
func TestMissingTopicExactlyOnce(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "eosmissing")
	present, missing, dlq := e.Prefix+".order", e.Prefix+".ordr", e.Prefix+".dlq"
	if err := testkit.CreateTopics(brokers, 1, nil, present, dlq); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay(e.eosFlags("--kafka-auto-create-topics=false", "--dlq-topic", dlq, "--kafka-missing-topic-timeout", "5s")...)
	for i := range 10 {
		e.insertRow(t, "order", "o-1", "created", fmt.Sprintf(`{"n":%d}`, i), `{}`)
	}
	bad := e.insertRow(t, "ordr", "o-2", "created", `{"typo":true}`, `{}`)
	for i := 10; i < 20; i++ {
		e.insertRow(t, "order", "o-1", "created", fmt.Sprintf(`{"n":%d}`, i), `{}`)
	}
	end := e.currentLSN(t)
	letters := consumeCommitted(t, []string{dlq}, 1, 90*time.Second, 2*time.Second)
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	h := letters[0].Headers
	if h["dlq.reason"] != "unknown_topic" || h["dlq.event_id"] != strconv.FormatInt(bad, 10) || !strings.Contains(h["dlq.error"], missing) ||
		h["dlq.original_topic"] != missing {
		t.Errorf("dead letter headers %v: want reason unknown_topic, row %d, the topic %s named", h, bad, missing)
	}
	rs := consumeCommitted(t, []string{present}, 20, 60*time.Second, 2*time.Second)
	seen := map[string]int{}
	for _, rec := range rs {
		seen[string(rec.Value)]++
	}
	if len(rs) != 20 || len(seen) != 20 {
		t.Fatalf("%d records (%d distinct) on %s, want the 20 good events exactly once", len(rs), len(seen), present)
	}
	if err := e.WaitConfirmed(context.Background(), end, 60*time.Second); err != nil {
		t.Fatalf("slot not confirmed past the dead-lettered event: %v", err)
	}
	if tps, err := testkit.Topics(brokers, missing); err != nil || len(tps) != 0 {
		t.Fatalf("topics %v (%v): the relay created %s", tps, err, missing)
	}
	if n := r.metric("outbox_relay_halted"); n != 0 {
		t.Error("halted")
	}
}
