package sink

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"
)

func dataBatch(first int64, pid int64, txn bool, kv ...string) *sarama.Records {
	b := &sarama.RecordBatch{FirstOffset: first, ProducerID: pid, IsTransactional: txn}
	for i := 0; i+1 < len(kv); i += 2 {
		b.Records = append(b.Records, &sarama.Record{OffsetDelta: int64(i / 2), Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	b.LastOffsetDelta = int32(len(b.Records) - 1)
	return &sarama.Records{RecordBatch: b}
}

func marker(at int64, pid int64, commit bool) *sarama.Records {
	typ := byte(0)
	if commit {
		typ = 1
	}
	return &sarama.Records{RecordBatch: &sarama.RecordBatch{FirstOffset: at, ProducerID: pid, IsTransactional: true, Control: true,
		Records: []*sarama.Record{{Key: []byte{0, 0, 0, typ}}}}}
}

// readBatches is the read_committed walk of the checkpoint partition: the
// last committed record with the key wins; aborted transactions, control
// records, other keys and records before the start offset do not count.
func TestReadBatches(t *testing.T) {
	cases := []struct {
		name     string
		from     int64
		sets     []*sarama.Records
		aborted  []*sarama.AbortedTransaction
		wantNext int64
		want     string
	}{
		{"committed checkpoints: the last wins", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "a"), marker(1, 1, true),
			dataBatch(2, 1, true, "k", "b"), marker(3, 1, true),
		}, nil, 4, "b"},
		{"an aborted transaction (a fenced producer's) does not count", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "a"), marker(1, 1, true),
			dataBatch(2, 1, true, "k", "zombie"), marker(3, 1, false),
			dataBatch(4, 2, true, "k", "c"), marker(5, 2, true),
		}, []*sarama.AbortedTransaction{{ProducerID: 1, FirstOffset: 2}}, 6, "c"},
		{"aborted last: the committed one before it", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "a"), marker(1, 1, true),
			dataBatch(2, 1, true, "k", "zombie"), marker(3, 1, false),
		}, []*sarama.AbortedTransaction{{ProducerID: 1, FirstOffset: 2}}, 4, "a"},
		// A transactional id keeps its producer id across restarts (only the
		// epoch moves): every kill leaves an aborted transaction of the same
		// producer id, and each must be skipped, not just the first.
		{"the same producer id aborted twice, committed in between", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "a"), marker(1, 1, true),
			dataBatch(2, 1, true, "k", "zombie1"), marker(3, 1, false),
			dataBatch(4, 1, true, "k", "b"), marker(5, 1, true),
			dataBatch(6, 1, true, "k", "zombie2"), marker(7, 1, false),
		}, []*sarama.AbortedTransaction{{ProducerID: 1, FirstOffset: 2}, {ProducerID: 1, FirstOffset: 6}}, 8, "b"},
		{"aborted transactions listed out of order", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "zombie1"), marker(1, 1, false),
			dataBatch(2, 1, true, "k", "a"), marker(3, 1, true),
			dataBatch(4, 1, true, "k", "zombie2"), marker(5, 1, false),
		}, []*sarama.AbortedTransaction{{ProducerID: 1, FirstOffset: 4}, {ProducerID: 1, FirstOffset: 0}}, 6, "a"},
		{"other keys (other slots) are not ours", 0, []*sarama.Records{
			dataBatch(0, 1, true, "k", "a", "other", "x"), marker(2, 1, true),
		}, nil, 3, "a"},
		{"records before the fetch offset are skipped", 1, []*sarama.Records{
			dataBatch(0, 1, false, "k", "old", "k", "new"),
		}, nil, 2, "new"},
		{"nothing stable yet: the offset stays", 5, nil, nil, 5, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			block := &sarama.FetchResponseBlock{RecordsSet: tc.sets, AbortedTransactions: tc.aborted}
			next, v := readBatches(block, tc.from, []byte("k"))
			if next != tc.wantNext || string(v) != tc.want {
				t.Fatalf("readBatches = %d, %q; want %d, %q", next, v, tc.wantNext, tc.want)
			}
		})
	}
}

// The transactional producer lingers at least 1 ms (its records are
// visible only at the commit); a longer kafka.flush_frequency is kept.
func TestTxnProducerLinger(t *testing.T) {
	for _, tc := range []struct{ set, want time.Duration }{
		{0, time.Millisecond},
		{5 * time.Millisecond, 5 * time.Millisecond},
	} {
		cfg := validConfig()
		cfg.FlushFrequency = tc.set
		p, err := NewTxn(cfg, "t", time.Minute, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		if got := p.sc.Producer.Flush.Frequency; got != tc.want {
			t.Errorf("kafka.flush_frequency %s: transactional linger %s, want %s", tc.set, got, tc.want)
		}
	}
}

// Coordinator retries start at 1 ms (a Kafka transaction waits for the
// previous one's markers after every commit), then back off, and still
// cover seconds of coordinator trouble.
func TestTxnRetryBackoff(t *testing.T) {
	cases := []struct {
		retries int
		want    time.Duration
	}{{0, time.Millisecond}, {9, time.Millisecond}, {10, 2 * time.Millisecond}, {11, 4 * time.Millisecond}, {18, 500 * time.Millisecond}, {49, 500 * time.Millisecond}}
	for _, tc := range cases {
		if got := txnRetryBackoff(tc.retries, 50); got != tc.want {
			t.Errorf("txnRetryBackoff(%d) = %s, want %s", tc.retries, got, tc.want)
		}
	}
	var total time.Duration
	for r := range 50 {
		total += txnRetryBackoff(r, 50)
	}
	if total < 10*time.Second || total > 30*time.Second {
		t.Errorf("50 retries span %s, want 10-30 s", total)
	}
}
