package sink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// The direct engine's partition for a key is the Java client's.
func TestDirectPartitionMatchesJava(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 5000 {
		k := make([]byte, rng.IntN(70))
		for j := range k {
			k[j] = byte(rng.UintN(256))
		}
		if i%2 == 0 {
			k = fmt.Appendf(nil, "order-%d", i)
		}
		for _, n := range []int32{1, 3, 12, 64, math.MaxInt32} {
			if got, want := int32(murmur2(k)&0x7fffffff)%n, javaPartition(k, n); got != want {
				t.Fatalf("key %x, %d partitions: direct %d, Java %d", k, n, got, want)
			}
		}
	}
	for _, v := range murmur2Vectors {
		if got := int32(murmur2([]byte(v.key))); got != v.hash {
			t.Errorf("murmur2(%q) = %d, want %d", v.key, got, v.hash)
		}
	}
}

// verdicts collects what the engine completes, by message.
type verdicts struct {
	done    map[*Message][]error
	retried []error
}

// directRig is one partition of one topic led by one broker, without
// goroutines: the test drives build and answer by hand. The topic is marked
// as being fixed, so answer starts no fix goroutine.
func directRig(t *testing.T, retryMax, maxBatch int) (*direct, *dpart, *dbroker, *verdicts) {
	t.Helper()
	v := &verdicts{done: map[*Message][]error{}}
	cfg := validConfig()
	cfg.RetryMax, cfg.MaxMessageBytes = max(retryMax, 1), maxBatch
	sc, err := saramaConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := newDirect(nil, sc, cfg, func(_ string, msgs []*Message, err error) {
		if len(msgs) == 0 {
			v.retried = append(v.retried, err)
		}
		for _, m := range msgs {
			v.done[m] = append(v.done[m], err)
		}
	})
	d.pid, d.epoch, d.newPID, d.retryMax = 1000, 0, false, retryMax
	db := &dbroker{wake: make(chan struct{}, 1)}
	tp := &dtopic{name: "orders", fixing: true}
	p := &dpart{topic: tp, id: 0, leader: db, pid: -1}
	tp.parts = []*dpart{p}
	d.topics["orders"] = tp
	return d, p, db, v
}

func (d *direct) queueN(t *testing.T, n, size int) []*Message {
	t.Helper()
	var out []*Message
	for i := range n {
		m := &Message{Topic: "orders", Key: []byte("order-1"), Value: make([]byte, size), Timestamp: time.Unix(1700000000, int64(i)*int64(time.Millisecond))}
		if err := d.publish(m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// respond sets what the broker answered for batches (wire.produce does).
func respond(batches []*dbatch, kerr sarama.KError) []*dbatch {
	for _, b := range batches {
		b.got, b.err = true, nil
		if kerr != sarama.ErrNoError {
			b.err = kerr
		}
	}
	return batches
}

func TestDirectBatchesAndSequences(t *testing.T) {
	d, p, db, v := directRig(t, 5, 1000000)
	first := d.queueN(t, 3, 10)
	b1 := d.build(db)
	if len(b1) != 1 || len(b1[0].msgs) != 3 || b1[0].seq != 0 || b1[0].pid != 1000 {
		t.Fatalf("first batch: %+v", b1)
	}
	enc, err := (&wire{}).appendBatch(nil, d, b1[0]) // v2 batch: first timestamp at 27, max at 35
	if err != nil {
		t.Fatal(err)
	}
	if got := int64(binary.BigEndian.Uint64(enc[35:])) - int64(binary.BigEndian.Uint64(enc[27:])); got != 2 {
		t.Errorf("max timestamp delta %d ms, want 2", got)
	}
	second := d.queueN(t, 2, 10) // queued while the first is in flight
	if again := d.build(db); len(again) != 0 {
		t.Fatalf("built %d batches while one is in flight on the partition", len(again))
	}
	d.answer(db, respond(b1, sarama.ErrNoError), nil)
	for _, m := range first {
		if errs := v.done[m]; len(errs) != 1 || errs[0] != nil || m.Partition != 0 {
			t.Fatalf("acked record: verdicts %v partition %d", errs, m.Partition)
		}
	}
	b2 := d.build(db)
	if len(b2) != 1 || len(b2[0].msgs) != 2 || b2[0].seq != 3 {
		t.Fatalf("second batch: %d batches, first sequence %d", len(b2), b2[0].seq)
	}
	d.answer(db, respond(b2, sarama.ErrNoError), nil)
	if d.pending != 0 || p.seq != 5 || len(v.done[second[1]]) != 1 {
		t.Fatalf("pending %d seq %d", d.pending, p.seq)
	}
}

func TestDirectBatchSizeBound(t *testing.T) {
	d, _, db, _ := directRig(t, 5, 4000)
	d.queueN(t, 5, 1500) // two fit under 4000 bytes with overheads
	b := d.build(db)
	if len(b) != 1 || len(b[0].msgs) != 2 || b[0].size > 4000 {
		t.Fatalf("batch of %d records, %d bytes; want 2 records within 4000", len(b[0].msgs), b[0].size)
	}
	big := &Message{Topic: "orders", Key: []byte("k"), Value: make([]byte, 4000)}
	if err := d.publish(big); err != nil {
		t.Fatal(err)
	}
	if len(d.failed) != 1 {
		t.Fatalf("a record over kafka.max_message_bytes was queued (failed: %d)", len(d.failed))
	}
	if reason, kind := Classify(d.failed[0].err); reason != "message_too_large" || kind != Poison {
		t.Errorf("oversized record: %s/%v, want message_too_large/poison", reason, kind)
	}
	if !Certain(d.failed[0].err) {
		t.Errorf("oversized record: %v is not Certain; on_poison must apply at once", d.failed[0].err)
	}
}

// Issue 36: what the broker's answer to a batch says about each record. A
// refusal of a record alone in its batch is certain (on_poison at once); a
// refusal of the topic holds for all; DUPLICATE_SEQUENCE_NUMBER acks the
// batch. (A batch of several refused for one record: TestDirectIsolation.)
func TestDirectRefusalCertainty(t *testing.T) {
	cases := []struct {
		name    string
		kerr    sarama.KError
		n       int // records in the batch
		certain bool
		acked   bool
	}{
		{"too large alone", sarama.ErrMessageSizeTooLarge, 1, true, false},
		{"record list too large alone", sarama.ErrMessageSetSizeTooLarge, 1, true, false},
		{"invalid record alone", sarama.ErrInvalidRecord, 1, true, false},
		{"topic authorization, batch of three", sarama.ErrTopicAuthorizationFailed, 3, true, false},
		{"invalid topic, batch of two", sarama.ErrInvalidTopic, 2, true, false},
		{"invalid timestamp alone", sarama.ErrInvalidTimestamp, 1, true, false},
		{"unknown refusal alone: attempts", sarama.ErrPolicyViolation, 1, false, false},
		{"duplicate sequence number: acked", sarama.ErrDuplicateSequenceNumber, 3, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, p, db, v := directRig(t, 5, 1000000)
			msgs := d.queueN(t, tc.n, 10)
			d.answer(db, respond(d.build(db), tc.kerr), nil)
			for _, m := range msgs {
				errs := v.done[m]
				if len(errs) != 1 {
					t.Fatalf("record completed %d times, want once", len(errs))
				}
				if tc.acked {
					if errs[0] != nil {
						t.Fatalf("record failed with %v, want acked", errs[0])
					}
					continue
				}
				if errs[0] == nil {
					t.Fatal("record acked, want refused")
				}
				if got := Certain(errs[0]); got != tc.certain {
					t.Errorf("Certain(%v) = %v, want %v", errs[0], got, tc.certain)
				}
				if reason, _ := Classify(errs[0]); reason == "other" {
					t.Errorf("Classify(%v) lost the broker's error", errs[0])
				}
			}
			wantSeq := int32(0) // a refusal gives the sequence numbers back
			if tc.acked {
				wantSeq = int32(tc.n)
			}
			if p.seq != wantSeq || d.newPID || d.pending != 0 {
				t.Errorf("seq %d newPID %v pending %d; want seq %d, the same producer id, nothing pending", p.seq, d.newPID, d.pending, wantSeq)
			}
		})
	}
}

func TestDirectSequenceWraps(t *testing.T) {
	d, p, db, _ := directRig(t, 5, 1000000)
	d.queueN(t, 1, 1)
	p.pid, p.epoch, p.seq = d.pid, d.epoch, math.MaxInt32-1
	d.queueN(t, 2, 1)
	b := d.build(db)
	if b[0].seq != math.MaxInt32-1 || p.seq != 1 {
		t.Fatalf("first sequence %d, next %d; want %d and 1", b[0].seq, p.seq, math.MaxInt32-1)
	}
}

func TestDirectErrors(t *testing.T) {
	cases := []struct {
		name     string
		retryMax int
		kerr     sarama.KError // block error, when reqErr is nil
		reqErr   error
		// want
		resent    bool // the same batch goes out again, same sequence
		failQueue bool // the records queued behind it fail too
		seqAfter  int32
		newPID    bool
	}{
		{name: "leader moved: resend as is", retryMax: 5, kerr: sarama.ErrNotLeaderForPartition, resent: true, seqAfter: 3},
		{name: "network: resend as is on a new connection", retryMax: 5, reqErr: errors.New("read tcp: connection reset by peer: " + sarama.ErrNotConnected.Error()),
			resent: true, seqAfter: 3},
		{name: "retries exhausted: fail, new producer id", retryMax: 0, kerr: sarama.ErrNotEnoughReplicas, failQueue: true, seqAfter: 3, newPID: true},
		{name: "sequence out of order: fail, new producer id", retryMax: 5, kerr: sarama.ErrOutOfOrderSequenceNumber, failQueue: true, seqAfter: 3, newPID: true},
		{name: "invalid topic: fail alone, sequence taken back", retryMax: 5, kerr: sarama.ErrInvalidTopic, seqAfter: 0},
		{name: "not authorized: fail alone, sequence taken back", retryMax: 5, kerr: sarama.ErrTopicAuthorizationFailed, seqAfter: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, p, db, v := directRig(t, tc.retryMax, 1000000)
			batch := d.queueN(t, 3, 10)
			b := d.build(db)
			queued := d.queueN(t, 2, 10)
			reqErr := tc.reqErr
			if reqErr == nil {
				respond(b, tc.kerr)
			} else {
				reqErr = fmt.Errorf("wrapped: %w", sarama.ErrNotConnected)
			}
			d.answer(db, b, reqErr)
			if p.seq != tc.seqAfter || d.newPID != tc.newPID {
				t.Errorf("seq %d newPID %v; want %d %v", p.seq, d.newPID, tc.seqAfter, tc.newPID)
			}
			if tc.resent {
				if len(v.done) != 0 || len(v.retried) != 1 {
					t.Fatalf("a retried batch completed records (%d) or was not counted (%d)", len(v.done), len(v.retried))
				}
				if p.batch != b[0] || p.leader != nil {
					t.Fatalf("batch kept %v, leader cleared %v", p.batch == b[0], p.leader == nil)
				}
				// The fix finds the leader; the backoff passes.
				p.leader, p.due = db, time.Now().Add(-time.Millisecond)
				d.markReady(p)
				again := d.build(db)
				if len(again) != 1 || again[0] != b[0] || again[0].seq != 0 || len(again[0].msgs) != 3 {
					t.Fatalf("resend: %d batches, same %v", len(again), len(again) == 1 && again[0] == b[0])
				}
				d.answer(db, respond(again, sarama.ErrNoError), nil)
				if len(v.done) != 3 {
					t.Fatalf("%d records completed after the resend, want the batch's 3", len(v.done))
				}
				return
			}
			for _, m := range batch {
				if errs := v.done[m]; len(errs) != 1 || errs[0] == nil {
					t.Errorf("batch record: verdicts %v, want one error", errs)
				}
			}
			for _, m := range queued {
				errs := v.done[m]
				if tc.failQueue != (len(errs) == 1 && errs[0] != nil) {
					t.Errorf("queued record: verdicts %v, fail with the batch: %v", errs, tc.failQueue)
				}
			}
			if tc.failQueue {
				// The next batch waits for the new producer id, then counts
				// from 0 under it.
				d.queueN(t, 1, 10)
				if got := d.build(db); len(got) != 0 {
					t.Fatal("a batch went out before the new producer id")
				}
				d.pid, d.newPID = 2000, false
				d.markReady(p)
				got := d.build(db)
				if len(got) != 1 || got[0].pid != 2000 || got[0].seq != 0 {
					t.Fatalf("after the new id: %d batches", len(got))
				}
				return
			}
			got := d.build(db) // the queued records, with the refused batch's sequence numbers
			if len(got) != 1 || got[0].seq != 0 || len(got[0].msgs) != 2 {
				t.Fatalf("after a refusal: %d batches", len(got))
			}
		})
	}
}

// leaderless answers that no partition has a leader, and counts lookups.
type leaderless struct {
	sarama.Client
	mu      sync.Mutex
	lookups []int32
}

func (l *leaderless) RefreshMetadata(...string) error { return nil }
func (l *leaderless) Leader(_ string, p int32) (*sarama.Broker, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lookups = append(l.lookups, p)
	return nil, sarama.ErrLeaderNotAvailable
}

// A record for a partition whose leader is not known (the first record of
// a topic found only partition 0's leader) starts a fix, which looks the
// leader up; before, such a record waited for ever.
func TestDirectUnknownLeaderStartsFix(t *testing.T) {
	d, _, db, _ := directRig(t, 5, 1000000)
	lc := &leaderless{}
	d.client = lc
	tp := d.topics["orders"]
	tp.fixing = false
	p1 := &dpart{topic: tp, id: 1, pid: -1} // no leader known
	tp.parts = append(tp.parts, p1)
	var key []byte
	for i := 0; ; i++ { // a key of partition 1
		key = fmt.Appendf(nil, "k%d", i)
		if murmur2(key)&0x7fffffff%2 == 1 {
			break
		}
	}
	if err := d.publish(&Message{Topic: "orders", Key: key, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		lc.mu.Lock()
		n := len(lc.lookups)
		lc.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader lookup for a record of a partition without a known leader")
		}
		time.Sleep(time.Millisecond)
	}
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(p1.queue) != 1 || len(db.ready) != 0 {
		t.Errorf("queued %d records on partition 1, %d ready on the broker: want 1 queued, none ready", len(p1.queue), len(db.ready))
	}
}

// Issue 36: a batch of several records the broker refuses for one of them
// is sent again one record per batch, with the same sequence numbers and
// no verdict for any record meanwhile: only the culprit fails, alone in its
// batch, so certainly; its neighbours are acked; records queued behind the
// batch keep their place and go in full batches again afterwards.
func TestDirectIsolation(t *testing.T) {
	cases := []struct {
		name string
		kerr sarama.KError
	}{
		{"too large", sarama.ErrMessageSizeTooLarge},
		{"record list too large", sarama.ErrMessageSetSizeTooLarge},
		{"invalid record", sarama.ErrInvalidRecord},
		{"invalid timestamp", sarama.ErrInvalidTimestamp},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, p, db, v := directRig(t, 5, 1000000)
			msgs := d.queueN(t, 4, 10)
			first := d.build(db)
			if len(first) != 1 || len(first[0].msgs) != 4 {
				t.Fatalf("first batch: %d batches", len(first))
			}
			behind := d.queueN(t, 3, 10) // queued while the batch is in flight
			d.answer(db, respond(first, tc.kerr), nil)
			if len(v.done) != 0 {
				t.Fatalf("%d records completed after a refusal of their batch; want none before the culprit is found", len(v.done))
			}
			if len(v.retried) != 1 {
				t.Errorf("the refused attempt counted %d times, want once", len(v.retried))
			}
			const bad = 2
			for i, m := range msgs {
				seq := int32(i)
				if i > bad {
					seq-- // the culprit's number was given back
				}
				b := d.build(db)
				if len(b) != 1 || len(b[0].msgs) != 1 || b[0].msgs[0] != m || b[0].seq != seq {
					t.Fatalf("resend %d: %d batches, want record %d alone with sequence %d", i, len(b), i, seq)
				}
				kerr := sarama.ErrNoError
				if i == bad {
					kerr = tc.kerr
				}
				d.answer(db, respond(b, kerr), nil)
			}
			for i, m := range msgs {
				errs := v.done[m]
				switch {
				case len(errs) != 1:
					t.Fatalf("record %d completed %d times", i, len(errs))
				case i == bad && (errs[0] == nil || !Certain(errs[0])):
					t.Errorf("the culprit: %v, want a certain refusal", errs[0])
				case i != bad && errs[0] != nil:
					t.Errorf("neighbour %d failed with %v, want acked", i, errs[0])
				}
			}
			rest := d.build(db)
			if len(rest) != 1 || len(rest[0].msgs) != len(behind) || rest[0].seq != 3 {
				t.Fatalf("records behind: %d batches, want one of %d with sequence 3", len(rest), len(behind))
			}
			d.answer(db, respond(rest, sarama.ErrNoError), nil)
			if p.single != 0 || p.seq != 6 || d.newPID || d.pending != 0 {
				t.Errorf("single %d seq %d newPID %v pending %d; want 0, 6, false, 0", p.single, p.seq, d.newPID, d.pending)
			}
		})
	}
}
