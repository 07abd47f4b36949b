//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// TestReadCommittedReader: the harness's read_committed reads
// (testkit.ReadCommitted, used by the exactly-once chaos suite and bench)
// see records of committed Kafka transactions and non-transactional ones,
// never those of aborted or open transactions, and ReadToEnd stops at the
// last stable offset; its own fetch loop agrees with sarama's
// read_committed consumer. Without the option everything is read.
func TestReadCommittedReader(t *testing.T) {
	t.Parallel()
	prefix := fmt.Sprintf("e2e.readcommitted.%d", time.Now().UnixNano()%1e9)
	topic := prefix + ".t"
	if err := testkit.CreateTopics(brokers, 2, nil, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testkit.DeleteTopics(brokers, prefix+".") })

	producer := func(txnID string) sarama.SyncProducer {
		cfg := testkit.SaramaConfig()
		cfg.Producer.Return.Successes = true
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
		if txnID != "" {
			cfg.Producer.Idempotent = true
			cfg.Producer.Transaction.ID = txnID
			cfg.Net.MaxOpenRequests = 1
		}
		p, err := sarama.NewSyncProducer(brokers, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	send := func(p sarama.SyncProducer, part int32, vals ...string) {
		t.Helper()
		for _, v := range vals {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: part, Value: sarama.StringEncoder(v)}); err != nil {
				t.Fatalf("send %s: %v", v, err)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	plain, tx, open := producer(""), producer(prefix+"-1"), producer(prefix+"-2")
	send(plain, 0, "n1")
	must(tx.BeginTxn())
	send(tx, 0, "a1", "a2")
	send(tx, 1, "a3")
	must(tx.CommitTxn())
	must(tx.BeginTxn())
	send(tx, 0, "b1")
	send(tx, 1, "b2")
	must(tx.AbortTxn())
	must(tx.BeginTxn())
	send(tx, 0, "c1")
	must(tx.CommitTxn())
	must(open.BeginTxn())
	send(open, 0, "d1") // open: partition 0's last stable offset stays here
	must(tx.BeginTxn())
	send(tx, 0, "e1")
	send(tx, 1, "e2")
	must(tx.CommitTxn())

	values := func(recs []testkit.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, strconv.Itoa(int(r.Partition))+":"+string(r.Value))
		}
		slices.Sort(out)
		return out
	}
	read := func(opts ...testkit.ReadOption) []string {
		t.Helper()
		recs, parts, err := testkit.ReadToEnd(brokers, prefix+".", 30*time.Second, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if parts[topic] != 2 {
			t.Fatalf("partitions %v", parts)
		}
		return values(recs)
	}
	committed := []string{"0:a1", "0:a2", "0:c1", "0:n1", "1:a3", "1:e2"}
	if got := read(testkit.ReadCommitted); !slices.Equal(got, committed) {
		t.Errorf("ReadToEnd(ReadCommitted) = %v, want %v", got, committed)
	}
	if got, want := read(), []string{"0:a1", "0:a2", "0:b1", "0:c1", "0:d1", "0:e1", "0:n1", "1:a3", "1:b2", "1:e2"}; !slices.Equal(got, want) {
		t.Errorf("ReadToEnd = %v, want %v", got, want)
	}
	// sarama's own read_committed consumer sees the same.
	recs, err := testkit.ReadUntil(brokers, []string{topic}, len(committed), 30*time.Second, time.Second, testkit.ReadCommitted)
	if err != nil {
		t.Fatal(err)
	}
	if got := values(recs); !slices.Equal(got, committed) {
		t.Errorf("ReadUntil(ReadCommitted) = %v, want %v", got, committed)
	}
	must(open.CommitTxn())
	if got, want := read(testkit.ReadCommitted), []string{"0:a1", "0:a2", "0:c1", "0:d1", "0:e1", "0:n1", "1:a3", "1:e2"}; !slices.Equal(got, want) {
		t.Errorf("after the open transaction committed: ReadToEnd(ReadCommitted) = %v, want %v", got, want)
	}
}
