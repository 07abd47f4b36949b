//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Partitions added to a topic while events flow (kafka.topic_refresh 1s):
// the relay notices, logs and counts the change, and publishes later
// events with murmur2 modulo the new count; nothing lost, nothing
// published twice, each aggregate in commit order across its two
// partitions. With the default producer every aggregate that moved has
// all its earlier events appended to its old partition before its first
// in the new one (the broker's LogAppendTime); sarama follows without that
// drain (documented), so there only the rest is checked.
func TestPartitionsAddedUnderLoad(t *testing.T) {
	t.Parallel() // own outbox, relays and topics; no service fault
	for _, producer := range []string{"direct", "sarama"} {
		t.Run(producer, func(t *testing.T) {
			t.Parallel()
			partitionsAdded(t, producer)
		})
	}
}

func partitionsAdded(t *testing.T, producer string) {
	const (
		events   = 6000
		aggs     = 200
		oldParts = 2
		newParts = 5
	)
	e := newEnv(t, "partgrow_"+producer)
	order, payment := e.Prefix+".order", e.Prefix+".payment"
	logAppend := "LogAppendTime"
	if err := testkit.CreateTopics(brokers, oldParts, map[string]*string{"message.timestamp.type": &logAppend}, order, payment); err != nil {
		t.Fatal(err)
	}
	r := e.startRelay("--kafka-topic-refresh", "1s", "--kafka-producer", producer)
	w := e.newWriter(383)
	ctx := context.Background()
	wrote := make(chan error, 1)
	go func() { wrote <- w.run(ctx, events, 5, aggs, 20*time.Second, "") }()
	waitFor(t, 30*time.Second, "a third of the events written", func() bool { return len(w.written()) >= events/3 })
	if err := testkit.AddPartitions(brokers, order, newParts); err != nil {
		t.Fatal(err)
	}
	added := len(w.written())
	waitFor(t, 30*time.Second, "the partition count change reported", func() bool {
		return r.metric("outbox_relay_kafka_partition_changes_total") >= 1
	})
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	if err := e.WaitConfirmed(ctx, e.currentLSN(t), 2*time.Minute); err != nil {
		t.Fatalf("slot not confirmed past every event: %v", err)
	}
	rs := consume(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)

	byID := map[int64]written{}
	for _, ev := range ws {
		byID[ev.ID] = ev
	}
	type first struct {
		seq       int
		partition int32
		offset    int64
		appended  time.Time
	}
	firsts := map[string][]first{}
	seen := map[int64]bool{}
	dups := 0
	for _, rec := range rs {
		id, err := testkit.RecordID(rec)
		ev, ok := byID[id]
		if err != nil || !ok {
			t.Fatalf("record %s/%d@%d was not written by this test", rec.Topic, rec.Partition, rec.Offset)
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		n := oldParts
		if rec.Topic == order && rec.Partition != testkit.Partition([]byte(rec.Key), oldParts) {
			n = newParts
		}
		if want := testkit.Partition([]byte(rec.Key), n); rec.Partition != want {
			t.Fatalf("%s key %s in partition %d, murmur2 picks %d of %d", rec.Topic, rec.Key, rec.Partition, want, n)
		}
		firsts[rec.Topic+"/"+ev.Agg] = append(firsts[rec.Topic+"/"+ev.Agg], first{ev.Seq, rec.Partition, rec.Offset, rec.Timestamp})
	}
	lost := len(ws) - len(seen)
	moved, inNew := 0, 0
	for agg, fs := range firsts {
		slices.SortFunc(fs, func(a, b first) int { return a.seq - b.seq })
		switches := 0
		for i := 1; i < len(fs); i++ {
			if fs[i].partition == fs[i-1].partition {
				if fs[i].offset < fs[i-1].offset {
					t.Errorf("aggregate %s: seq %d at offset %d, before seq %d at %d", agg, fs[i].seq, fs[i].offset, fs[i-1].seq, fs[i-1].offset)
				}
				continue
			}
			switches++
			// The last event in the old partition was appended (acked)
			// before the first in the new one.
			if producer == "direct" && fs[i].appended.Before(fs[i-1].appended) {
				t.Errorf("aggregate %s: seq %d appended to partition %d at %s, before seq %d in partition %d at %s",
					agg, fs[i].seq, fs[i].partition, fs[i].appended.Format(time.StampMilli), fs[i-1].seq, fs[i-1].partition, fs[i-1].appended.Format(time.StampMilli))
			}
		}
		if switches > 1 {
			t.Errorf("aggregate %s went back and forth between partitions (%d switches)", agg, switches)
		}
		if switches == 1 {
			moved++
		}
		for _, f := range fs {
			if strings.HasPrefix(agg, order+"/") && f.partition >= oldParts {
				inNew++
				break
			}
		}
	}
	t.Logf("%s: %d events (partitions added after %d), %d lost, %d duplicates; %d aggregates moved partition, %d have events in the new partitions; rewinds %v",
		producer, len(ws), added, lost, dups, moved, inNew, r.metric("outbox_relay_rewinds_total"))
	if lost != 0 || dups != 0 {
		t.Fatalf("%d lost, %d duplicates", lost, dups)
	}
	if moved == 0 || inNew == 0 {
		t.Fatalf("no aggregate moved to the partitions added (%d moved, %d in new partitions)", moved, inNew)
	}
	if got := r.metric("outbox_relay_kafka_topic_partitions"); got != newParts+oldParts {
		t.Errorf("outbox_relay_kafka_topic_partitions sums to %v, want %d (order %d + payment %d)", got, newParts+oldParts, newParts, oldParts)
	}
	if got := r.metric("outbox_relay_kafka_partition_changes_total"); got != 1 {
		t.Errorf("outbox_relay_kafka_partition_changes_total = %v, want 1", got)
	}
	want := []string{`"old_partitions":2,"partitions":5`, "must not assume order across", "wait until every event already placed on it is acked or failed", "topic re-partitioned"}
	if producer == "sarama" {
		want = []string{`"old_partitions":2,"partitions":5`, "must not assume order across", "without waiting for the events in flight"}
	}
	for _, want := range want {
		if !strings.Contains(r.log(), want) {
			t.Errorf("relay log lacks %q", want)
		}
	}
}
