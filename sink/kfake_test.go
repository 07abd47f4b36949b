package sink

// Unit tests of the direct engine against franz-go's kfake, an in-process
// multi-broker Kafka: leaders moving, injected broker errors, throttling,
// partition count changes, idle senders. Proofs of delivery against a real
// broker are in test/e2e; these cover error paths a real broker rarely
// shows on demand.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const fakeTopic = "orders"

// fakeKafka starts a kfake cluster of brokers nodes with fakeTopic of parts
// partitions.
func fakeKafka(t *testing.T, brokers int, parts int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(brokers), kfake.SeedTopics(parts, fakeTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// fakeRun is a direct Producer running against a kfake cluster, with the
// verdict of every record it published.
type fakeRun struct {
	t   *testing.T
	p   *Producer
	reg *prometheus.Registry

	mu       sync.Mutex
	verdicts map[*Message][]error
	acked    []*Message // in the order acked
}

func startFake(t *testing.T, c *kfake.Cluster, tweak func(*Producer)) *fakeRun {
	t.Helper()
	return startFakeWith(t, c, nil, tweak, zerolog.Nop())
}

// startFakeWith is startFake with a change to the config and a logger.
func startFakeWith(t *testing.T, c *kfake.Cluster, conf func(*Config), tweak func(*Producer), log zerolog.Logger) *fakeRun {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Brokers = c.ListenAddrs()
	cfg.RetryBackoffMax = 200 * time.Millisecond
	if conf != nil {
		conf(&cfg)
	}
	reg := prometheus.NewRegistry()
	p, err := New(cfg, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-errc:
		t.Fatalf("producer ended before it connected: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("producer did not connect to kfake in 15 s")
	}
	t.Cleanup(func() {
		cancel()
		<-errc
	})
	return &fakeRun{t: t, p: p, reg: reg, verdicts: map[*Message][]error{}}
}

// publish sends value seq of key k.
func (r *fakeRun) publish(k, seq int) *Message {
	m := &Message{Topic: fakeTopic, Key: fmt.Appendf(nil, "key-%d", k), Value: fmt.Appendf(nil, "%d/%d", k, seq)}
	r.republish(m)
	return m
}

// republish sends m (again: the pipeline's rewind after a failure).
func (r *fakeRun) republish(m *Message) {
	m.Done = func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.verdicts[m] = append(r.verdicts[m], err)
		if err == nil {
			r.acked = append(r.acked, m)
		}
	}
	if err := r.p.Publish(context.Background(), m); err != nil {
		r.t.Fatalf("publish %s: %v", m.Value, err)
	}
}

// settle waits until every one of msgs has a verdict since its last
// publish (want: how many verdicts each has by then) and returns the
// failed ones, in the order given.
func (r *fakeRun) settle(msgs []*Message, want map[*Message]int, within time.Duration) []*Message {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		r.mu.Lock()
		missing := 0
		var failed []*Message
		for _, m := range msgs {
			n := len(r.verdicts[m])
			if n < max(want[m], 1) {
				missing++
				continue
			}
			if n > max(want[m], 1) {
				r.mu.Unlock()
				r.t.Fatalf("record %s got %d verdicts, want %d: %v", m.Value, n, max(want[m], 1), r.verdicts[m])
			}
			if r.verdicts[m][n-1] != nil {
				failed = append(failed, m)
			}
		}
		r.mu.Unlock()
		if missing == 0 {
			return failed
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d of %d records without a verdict after %s", missing, len(msgs), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// of returns m's verdicts so far.
func (r *fakeRun) of(m *Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.verdicts[m]...)
}

// ackedOnce asserts that each of msgs was acked exactly once.
func (r *fakeRun) ackedOnce(msgs []*Message) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		acks := 0
		for _, err := range r.verdicts[m] {
			if err == nil {
				acks++
			}
		}
		if acks != 1 {
			r.t.Fatalf("record %s acked %d times (verdicts %v), want once", m.Value, acks, r.verdicts[m])
		}
	}
}

// consumed is what a consumer of fakeTopic reads: n records at least.
type consumedRec struct {
	key       string
	k, seq    int
	partition int32
	offset    int64
}

func consumeFake(t *testing.T, c *kfake.Cluster, n int) []consumedRec {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(fakeTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []consumedRec
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d records of %d in 20 s", len(out), n)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			k, seq := parseValue(t, rec.Value)
			out = append(out, consumedRec{string(rec.Key), k, seq, rec.Partition, rec.Offset})
		})
	}
	return out
}

func parseValue(t *testing.T, v []byte) (int, int) {
	a, b, ok := strings.Cut(string(v), "/")
	k, err1 := strconv.Atoi(a)
	s, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("record value %q is not key/seq", v)
	}
	return k, s
}

// checkOrder asserts that recs hold every (key, seq) of want exactly once
// and, per key, in seq order (per partition in offset order, and a key's
// partitions one after the other).
func checkOrder(t *testing.T, recs []consumedRec, want int) {
	t.Helper()
	type kp struct {
		k int
		p int32
	}
	byPart := map[int32][]consumedRec{}
	for _, r := range recs {
		byPart[r.partition] = append(byPart[r.partition], r)
	}
	seen := map[[2]int]bool{}
	last := map[int]int{}      // key -> highest seq seen in its partitions so far
	parts := map[int][]int32{} // key -> the partitions it was read from, in seq order
	var all []consumedRec
	for _, rs := range byPart {
		for i := 1; i < len(rs); i++ {
			if rs[i].offset <= rs[i-1].offset {
				t.Fatalf("partition %d read out of offset order", rs[i].partition)
			}
		}
		all = append(all, rs...)
	}
	// Per key and partition: seq rises with the offset.
	lastIn := map[kp]int{}
	for _, rs := range byPart {
		for _, r := range rs {
			id := [2]int{r.k, r.seq}
			if seen[id] {
				t.Fatalf("key %d seq %d read twice (partition %d offset %d)", r.k, r.seq, r.partition, r.offset)
			}
			seen[id] = true
			if prev, ok := lastIn[kp{r.k, r.partition}]; ok && r.seq < prev {
				t.Fatalf("key %d reordered in partition %d: seq %d after %d", r.k, r.partition, r.seq, prev)
			}
			lastIn[kp{r.k, r.partition}] = r.seq
		}
	}
	if len(seen) != want {
		t.Fatalf("read %d distinct records, want %d", len(seen), want)
	}
	// Across partitions: a key's records in one partition all come before
	// (by seq) its records in the next: it moved once, never back and forth.
	bySeq := map[int][]consumedRec{}
	for _, r := range all {
		bySeq[r.k] = append(bySeq[r.k], r)
	}
	for k, rs := range bySeq {
		slicesSortBySeq(rs)
		for i, r := range rs {
			if i == 0 || r.partition != rs[i-1].partition {
				parts[k] = append(parts[k], r.partition)
			}
			last[k] = r.seq
		}
		if len(parts[k]) > 2 {
			t.Fatalf("key %d interleaved between partitions %v", k, parts[k])
		}
	}
}

func slicesSortBySeq(rs []consumedRec) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].seq < rs[j-1].seq; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

// answerAll answers req with code for every partition, and throttle ms.
func answerAll(req *kmsg.ProduceRequest, code int16, throttle int32) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.ThrottleMillis = throttle
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// batchValues decodes the values of an uncompressed v2 record batch.
func batchValues(t *testing.T, raw []byte) [][]byte {
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil {
		t.Errorf("record batch: %v", err)
		return nil
	}
	var out [][]byte
	rs := b.Records
	for len(rs) > 0 {
		l, n := binary.Varint(rs)
		if n <= 0 || int(l)+n > len(rs) {
			t.Errorf("record length at %d of %d", n, len(rs))
			return out
		}
		var r kmsg.Record
		if err := r.ReadFrom(rs[:n+int(l)]); err != nil {
			t.Errorf("record: %v", err)
			return out
		}
		out = append(out, r.Value)
		rs = rs[n+int(l):]
	}
	return out
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// Leaders move between three brokers while 3000 records of 30 keys go out:
// every record is acked once, the consumer reads each once and every key
// in order, and the senders stay one per broker.
func TestKfakeLeadersMove(t *testing.T) {
	c := fakeKafka(t, 3, 6)
	r := startFake(t, c, nil)
	stop := make(chan struct{})
	moved := make(chan int)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		n := 0
		defer func() { moved <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			if err := c.MoveTopicPartition(fakeTopic, int32(rng.IntN(6)), int32(rng.IntN(3))); err == nil {
				n++
			}
		}
	}()
	var msgs []*Message
	for round := range 100 {
		for k := range 30 {
			msgs = append(msgs, r.publish(k, round))
		}
		time.Sleep(5 * time.Millisecond) // paced across the moves
	}
	failed := r.settle(msgs, nil, 30*time.Second)
	close(stop)
	moves := <-moved
	if len(failed) > 0 {
		t.Fatalf("%d records failed while leaders moved (first: %s: %v)", len(failed), failed[0].Value, r.of(failed[0]))
	}
	r.ackedOnce(msgs)
	checkOrder(t, consumeFake(t, c, len(msgs)), len(msgs))
	r.p.dp.mu.Lock()
	senders := len(r.p.dp.senders)
	r.p.dp.mu.Unlock()
	if senders > 3 {
		t.Errorf("%d senders for 3 brokers", senders)
	}
	t.Logf("3000 records, %d leader moves, %.0f produce requests, %.0f not-leader answers, %d senders",
		moves, counter(t, r.reg, "outbox_relay_kafka_produce_requests_total"),
		counter(t, r.reg, "outbox_relay_publish_errors_total", "reason", "leader_not_available"), senders)
	if moves < 20 {
		t.Fatalf("only %d leader moves landed during the stream", moves)
	}
}

// A broker's answer NOT_LEADER_OR_FOLLOWER to some requests: the batches
// go again and each record is acked once, in order.
func TestKfakeNotLeader(t *testing.T) {
	c := fakeKafka(t, 3, 3)
	r := startFake(t, c, nil)
	var mu sync.Mutex
	injected := 0
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if injected >= 5 {
			return nil, nil, false
		}
		injected++
		return answerAll(req.(*kmsg.ProduceRequest), int16(sarama.ErrNotLeaderForPartition), 0), nil, true
	})
	var msgs []*Message
	for round := range 50 {
		for k := range 10 {
			msgs = append(msgs, r.publish(k, round))
		}
		time.Sleep(2 * time.Millisecond)
	}
	if failed := r.settle(msgs, nil, 20*time.Second); len(failed) > 0 {
		t.Fatalf("%d records failed", len(failed))
	}
	r.ackedOnce(msgs)
	checkOrder(t, consumeFake(t, c, len(msgs)), len(msgs))
	mu.Lock()
	defer mu.Unlock()
	if injected != 5 {
		t.Fatalf("%d NOT_LEADER_OR_FOLLOWER answers injected, want 5", injected)
	}
}

// OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID leave the outcome
// unknown: the batch and every record queued behind it on its partition
// fail (the documented rewind), the producer takes a new producer id,
// and the records published again are acked once each, in order; no
// record is acked twice.
func TestKfakeUnknownOutcome(t *testing.T) {
	for _, kerr := range []sarama.KError{sarama.ErrOutOfOrderSequenceNumber, sarama.ErrUnknownProducerID} {
		t.Run(kerr.Error(), func(t *testing.T) {
			c := fakeKafka(t, 1, 1)
			r := startFake(t, c, nil)
			var mu sync.Mutex
			inits, produces := 0, 0
			c.ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				mu.Lock()
				inits++
				mu.Unlock()
				return nil, nil, false
			})
			gate := make(chan struct{})
			c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				mu.Lock()
				produces++
				n := produces
				mu.Unlock()
				if n == 3 {
					<-gate // records queue behind this batch meanwhile
					return answerAll(req.(*kmsg.ProduceRequest), int16(kerr), 0), nil, true
				}
				return nil, nil, false
			})
			var msgs []*Message
			for seq := range 2 {
				msgs = append(msgs, r.publish(seq%3, seq))
				r.settle(msgs, nil, 5*time.Second)
			}
			msgs = append(msgs, r.publish(2, 2)) // the third request: held, then refused
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := produces
				mu.Unlock()
				if n >= 3 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the third produce request never came")
				}
				time.Sleep(5 * time.Millisecond)
			}
			for seq := 3; seq < 20; seq++ {
				msgs = append(msgs, r.publish(seq%3, seq))
			}
			close(gate)
			failed := r.settle(msgs, nil, 10*time.Second)
			if len(failed) != 18 {
				t.Fatalf("%d records failed, want the refused batch and the 17 queued behind it (18)", len(failed))
			}
			for _, m := range failed {
				if reason, _ := Classify(r.of(m)[0]); reason != "producer_state" {
					t.Fatalf("record %s failed with %v (%s), want producer_state", m.Value, r.of(m)[0], reason)
				}
			}
			// The rewind: the pipeline publishes them again, in order.
			want := map[*Message]int{}
			for _, m := range failed {
				want[m] = 2
				r.republish(m)
			}
			if again := r.settle(msgs, want, 10*time.Second); len(again) > 0 {
				t.Fatalf("%d records failed again", len(again))
			}
			r.ackedOnce(msgs)
			checkOrder(t, consumeFake(t, c, len(msgs)), len(msgs))
			mu.Lock()
			defer mu.Unlock()
			if inits != 1 { // the first one came before the control was in
				t.Fatalf("%d InitProducerId requests after the start, want 1 (a new producer id after the unknown outcome)", inits)
			}
		})
	}
}

// A throttled broker's next request waits out the throttle time; another
// broker's records go on meanwhile; both are counted.
func TestKfakeThrottle(t *testing.T) {
	c := fakeKafka(t, 2, 2)
	if err := c.MoveTopicPartition(fakeTopic, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveTopicPartition(fakeTopic, 1, 1); err != nil {
		t.Fatal(err)
	}
	r := startFake(t, c, nil)
	const throttle = 600 * time.Millisecond
	var mu sync.Mutex
	arrivals := map[int32][]time.Time{}
	throttled := false
	var answered time.Time
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		node := c.CurrentNode()
		arrivals[node] = append(arrivals[node], time.Now())
		if node == 0 && !throttled {
			throttled = true
			// Processed normally, then the answer carries the throttle: an
			// observer cannot change it, so answer it here (the fake keeps
			// the records of a handled request out of the log: acked, not
			// written; this test reads no log).
			answered = time.Now()
			return answerAll(req.(*kmsg.ProduceRequest), 0, int32(throttle/time.Millisecond)), nil, true
		}
		return nil, nil, false
	})
	key0, key1 := keyFor(t, 0, 2), keyFor(t, 1, 2)
	pub := func(key []byte, seq int) *Message {
		m := &Message{Topic: fakeTopic, Key: key, Value: fmt.Appendf(nil, "0/%d", seq)}
		r.republish(m)
		return m
	}
	first := pub(key0, 0)
	r.settle([]*Message{first}, nil, 5*time.Second)
	second := pub(key0, 1) // waits out the throttle
	start := time.Now()
	var other []*Message
	for i := range 5 {
		m := pub(key1, i)
		r.settle([]*Message{m}, nil, 5*time.Second)
		other = append(other, m)
	}
	otherTook := time.Since(start)
	r.settle([]*Message{second}, nil, 5*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals[0]) != 2 {
		t.Fatalf("broker 0 got %d produce requests, want 2", len(arrivals[0]))
	}
	waited := arrivals[0][1].Sub(answered)
	t.Logf("broker 0's next request %s after a %s throttle; 5 records to broker 1 meanwhile in %s", waited.Round(time.Millisecond), throttle, otherTook.Round(time.Millisecond))
	if waited < throttle-20*time.Millisecond {
		t.Fatalf("broker 0's next request came %s after a throttle of %s", waited, throttle)
	}
	if otherTook > throttle/2 {
		t.Fatalf("broker 1's records took %s while broker 0 was throttled: the throttle held another broker", otherTook)
	}
	if n := counter(t, r.reg, "outbox_relay_kafka_throttled_requests_total"); n != 1 {
		t.Errorf("throttled requests counted %v, want 1", n)
	}
	if s := counter(t, r.reg, "outbox_relay_kafka_throttle_seconds_total"); s != throttle.Seconds() {
		t.Errorf("throttle seconds counted %v, want %v", s, throttle.Seconds())
	}
}

// keyFor returns a key the Java partitioner puts on partition p of n.
func keyFor(t *testing.T, p, n int32) []byte {
	for i := range 1000 {
		k := fmt.Appendf(nil, "key-%d", i)
		if int32(murmur2(k)&0x7fffffff)%n == p {
			return k
		}
	}
	t.Fatal("no key")
	return nil
}

// The topic's partitions go from 2 to 5 mid-stream while a batch of an old
// partition waits for its resend: the relay reports it (log, metrics) and
// writes no key's record to its new partition before every earlier record
// of that key was written to the old one. The write order is the fake's
// (its control sees the requests in the order it writes them).
func TestKfakePartitionsAdded(t *testing.T) {
	c := fakeKafka(t, 2, 2)
	r := startFake(t, c, func(p *Producer) { p.cfg.TopicRefresh = 100 * time.Millisecond })
	var mu sync.Mutex
	var written []string // values, in the order the fake wrote them
	notLeader := 0       // requests left to refuse with NOT_LEADER_OR_FOLLOWER
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		mu.Lock()
		defer mu.Unlock()
		if notLeader > 0 {
			notLeader--
			return answerAll(req, int16(sarama.ErrNotLeaderForPartition), 0), nil, true
		}
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				for _, v := range batchValues(t, rp.Records) {
					written = append(written, string(v))
				}
			}
		}
		return nil, nil, false
	})
	const keys = 40
	var msgs []*Message
	seq := 0
	round := func() {
		for k := range keys {
			msgs = append(msgs, r.publish(k, seq))
		}
		seq++
	}
	for range 5 {
		round()
	}
	r.settle(msgs, nil, 5*time.Second)
	// Old partitions' next requests are refused a few times (resent after
	// the retry backoff) while the partitions are added and records keep
	// coming.
	mu.Lock()
	notLeader = 6
	mu.Unlock()
	round()
	cl := kfakeClient(t, c)
	req := kmsg.NewPtrCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = fakeTopic, 5
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create partitions: %v %+v", err, resp)
	}
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, r.reg, "outbox_relay_kafka_partition_changes_total", "topic", fakeTopic) == 0 {
		round()
		time.Sleep(20 * time.Millisecond)
		if time.Now().After(deadline) {
			t.Fatal("the partition count change was not seen in 10 s")
		}
	}
	for range 10 {
		round()
		time.Sleep(5 * time.Millisecond)
	}
	if failed := r.settle(msgs, nil, 20*time.Second); len(failed) > 0 {
		t.Fatalf("%d records failed", len(failed))
	}
	r.ackedOnce(msgs)
	if n := counter(t, r.reg, "outbox_relay_kafka_topic_partitions", "topic", fakeTopic); n != 5 {
		t.Errorf("outbox_relay_kafka_topic_partitions = %v, want 5", n)
	}
	if n := counter(t, r.reg, "outbox_relay_kafka_partition_changes_total", "topic", fakeTopic); n != 1 {
		t.Errorf("outbox_relay_kafka_partition_changes_total = %v, want 1", n)
	}
	recs := consumeFake(t, c, len(msgs))
	checkOrder(t, recs, len(msgs))
	movedKeys := 0
	for k := range keys {
		key := fmt.Appendf(nil, "key-%d", k)
		if int32(murmur2(key)&0x7fffffff)%2 != int32(murmur2(key)&0x7fffffff)%5 {
			movedKeys++
		}
	}
	inNew := 0
	for _, rc := range recs {
		if want := int32(murmur2([]byte(rc.key))&0x7fffffff) % 5; rc.partition >= 2 && rc.partition != want {
			t.Fatalf("key %s in partition %d, want %d (murmur2 %% 5)", rc.key, rc.partition, want)
		}
		if rc.partition >= 2 {
			inNew++
		}
	}
	if inNew == 0 {
		t.Fatal("no record went to the partitions added")
	}
	// The fake's write order: per key, seq rises (a key that moved has all
	// its records in the old partition written before its first in the new).
	mu.Lock()
	defer mu.Unlock()
	lastSeq := map[int]int{}
	for _, v := range written {
		k, s := parseValue(t, []byte(v))
		if prev, ok := lastSeq[k]; ok && s < prev {
			t.Fatalf("key %d: seq %d written after seq %d: reordered on the broker across the partition change", k, s, prev)
		}
		lastSeq[k] = s
	}
	t.Logf("%d records, %d rounds, %d of %d keys moved partition, %d records in the new partitions, %d writes observed", len(msgs), seq, movedKeys, keys, inNew, len(written))
}

// Senders of brokers that lead no partition in use end after their idle
// time, and a later record for such a broker starts a new one: after 60
// leader moves the senders and goroutines are bounded.
func TestKfakeIdleSendersRetired(t *testing.T) {
	c := fakeKafka(t, 3, 3)
	r := startFake(t, c, func(p *Producer) { p.senderIdle = 100 * time.Millisecond })
	d := r.p.dp
	senders := func() int {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.senders)
	}
	base := 0 // goroutines once every broker has had a sender
	var msgs []*Message
	maxSenders := 0
	for i := range 60 {
		// Every partition on one broker, a different one each time.
		node := int32(i % 3)
		for p := range int32(3) {
			if err := c.MoveTopicPartition(fakeTopic, p, node); err != nil {
				t.Fatal(err)
			}
		}
		for k := range 6 {
			msgs = append(msgs, r.publish(k, i))
		}
		if failed := r.settle(msgs, nil, 10*time.Second); len(failed) > 0 {
			t.Fatalf("%d records failed", len(failed))
		}
		maxSenders = max(maxSenders, senders())
		if i == 2 {
			base = runtime.NumGoroutine()
		}
	}
	r.ackedOnce(msgs)
	// All partitions now on one broker: the other two senders retire.
	deadline := time.Now().Add(5 * time.Second)
	for senders() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d senders 5 s after every partition moved to one broker, want 1", senders())
		}
		time.Sleep(20 * time.Millisecond)
	}
	g := runtime.NumGoroutine()
	t.Logf("60 rounds of leader moves: at most %d senders, 1 at the end; goroutines %d after round 3, %d at the end", maxSenders, base, g)
	if maxSenders > 3 {
		t.Errorf("%d senders for 3 brokers", maxSenders)
	}
	if g > base {
		t.Errorf("goroutines grew from %d to %d", base, g)
	}
	checkOrder(t, consumeFake(t, c, len(msgs)), len(msgs))
	// A record for a retired broker's partition starts a sender again.
	if err := c.MoveTopicPartition(fakeTopic, 0, 1); err != nil {
		t.Fatal(err)
	}
	m := &Message{Topic: fakeTopic, Key: keyFor(t, 0, 3), Value: []byte("99/0")}
	r.republish(m)
	if failed := r.settle(append(msgs, m), nil, 10*time.Second); len(failed) > 0 {
		t.Fatal("a record after a sender retired failed")
	}
}

// syncBuf is a log sink safe for the producer's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// kfakeClient is a franz-go client of the fake cluster, closed when the test ends.
func kfakeClient(t *testing.T, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createPartitions asks the fake to grow fakeTopic to n partitions.
func createPartitions(t *testing.T, c *kfake.Cluster, n int32) {
	t.Helper()
	cl := kfakeClient(t, c)
	req := kmsg.NewPtrCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = fakeTopic, n
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create partitions: %v %+v", err, resp)
	}
}

// recreateTopic deletes fakeTopic and creates it again with n partitions.
func recreateTopic(t *testing.T, c *kfake.Cluster, n int32) {
	t.Helper()
	cl := kfakeClient(t, c)
	del := kmsg.NewPtrDeleteTopicsRequest()
	dt := kmsg.NewDeleteTopicsRequestTopic()
	name := fakeTopic
	dt.Topic = &name
	del.Topics = append(del.Topics, dt)
	del.TopicNames = []string{fakeTopic}
	dresp, err := del.RequestWith(context.Background(), cl)
	if err != nil || len(dresp.Topics) != 1 || dresp.Topics[0].ErrorCode != 0 {
		t.Fatalf("delete topic: %v %+v", err, dresp)
	}
	cr := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = fakeTopic, n, 1
	cr.Topics = append(cr.Topics, ct)
	cresp, err := cr.RequestWith(context.Background(), cl)
	if err != nil || len(cresp.Topics) != 1 || cresp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, cresp)
	}
}

// waitCounter waits until the registry's series reaches want.
func waitCounter(t *testing.T, r *fakeRun, want float64, within time.Duration, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for counter(t, r.reg, name, labels...) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %s, want %v", name, labels, counter(t, r.reg, name, labels...), within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The topic recreated with fewer partitions (3 -> 1) while records wait on
// a partition that is gone: those fail (published again, the rewind) and
// every record after the change goes to the one partition left, acked once.
func TestKfakePartitionsFewer(t *testing.T) {
	c := fakeKafka(t, 1, 3)
	var logs syncBuf
	r := startFakeWith(t, c, nil, func(p *Producer) { p.cfg.TopicRefresh = 100 * time.Millisecond }, zerolog.New(&logs))
	var before []*Message
	for k := range 10 {
		before = append(before, r.publish(k, 0))
	}
	if failed := r.settle(before, nil, 5*time.Second); len(failed) > 0 {
		t.Fatalf("%d records failed", len(failed))
	}
	recreateTopic(t, c, 1)
	// One record per key while the relay still counts 3 partitions: those
	// for partitions 1 and 2 wait on partitions that are gone.
	var after []*Message
	for k := range 10 {
		after = append(after, r.publish(k, 1))
	}
	waitCounter(t, r, 1, 10*time.Second, "outbox_relay_kafka_partition_changes_total", "topic", fakeTopic)
	// The rewind, as often as records fail: those on the partitions that
	// are gone, and those the recreated partition refuses for the
	// producer's state (kfake keeps a producer's sequences across a
	// topic's deletion, a real broker does not: a new producer id follows
	// either way). One record per key is in flight, so publishing the
	// failed ones again keeps each key's order.
	want := map[*Message]int{}
	failed := r.settle(after, want, 20*time.Second)
	rewinds, firstFailed, gone := 0, len(failed), 0
	for _, m := range failed {
		if strings.Contains(r.of(m)[0].Error(), "partition is gone") {
			gone++
		}
	}
	for ; len(failed) > 0; rewinds++ {
		if rewinds == 5 {
			t.Fatalf("%d records still failing after 5 rewinds: %v", len(failed), r.of(failed[0]))
		}
		for _, m := range failed {
			want[m] = max(want[m], 1) + 1
			r.republish(m)
		}
		failed = r.settle(after, want, 20*time.Second)
	}
	for seq := 2; seq <= 5; seq++ {
		for k := range 10 {
			after = append(after, r.publish(k, seq))
		}
	}
	if failed := r.settle(after, want, 20*time.Second); len(failed) > 0 {
		t.Fatalf("%d records failed after the re-partition: %v", len(failed), r.of(failed[0]))
	}
	if gone == 0 {
		t.Fatal("no record waited on a partition that is gone: the test proves nothing")
	}
	r.ackedOnce(after)
	recs := consumeFake(t, c, len(after))
	for _, rc := range recs {
		if rc.partition != 0 {
			t.Fatalf("record %d/%d in partition %d of a 1-partition topic", rc.k, rc.seq, rc.partition)
		}
	}
	checkOrder(t, recs, len(after))
	if n := counter(t, r.reg, "outbox_relay_kafka_topic_partitions", "topic", fakeTopic); n != 1 {
		t.Errorf("outbox_relay_kafka_topic_partitions = %v, want 1", n)
	}
	for _, want := range []string{`"old_partitions":3,"partitions":1`, "consumers reading both partitions must not assume order across them", "topic re-partitioned"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	t.Logf("%d records after the topic was recreated with 1 partition: %d failed (%d on a partition gone, the rest refused for the producer state) and were published again, %d rewinds", len(after), firstFailed, gone, rewinds)
}

// kafka.producer: sarama: the change is detected, logged and counted the
// same way, and sarama's partitioner follows the new count (no drain).
func TestKfakePartitionsAddedSarama(t *testing.T) {
	c := fakeKafka(t, 2, 2)
	var logs syncBuf
	r := startFakeWith(t, c, func(cfg *Config) { cfg.Producer = ProducerSarama },
		func(p *Producer) { p.cfg.TopicRefresh = 100 * time.Millisecond }, zerolog.New(&logs))
	var msgs []*Message
	for k := range 20 {
		msgs = append(msgs, r.publish(k, 0))
	}
	r.settle(msgs, nil, 10*time.Second)
	createPartitions(t, c, 5)
	waitCounter(t, r, 1, 10*time.Second, "outbox_relay_kafka_partition_changes_total", "topic", fakeTopic)
	for k := range 20 {
		msgs = append(msgs, r.publish(k, 1))
	}
	if failed := r.settle(msgs, nil, 10*time.Second); len(failed) > 0 {
		t.Fatalf("%d records failed", len(failed))
	}
	r.ackedOnce(msgs)
	inNew := 0
	for _, rc := range consumeFake(t, c, len(msgs)) {
		if rc.partition >= 2 {
			inNew++
		}
	}
	if inNew == 0 {
		t.Fatal("sarama put no record in the partitions added")
	}
	if n := counter(t, r.reg, "outbox_relay_kafka_topic_partitions", "topic", fakeTopic); n != 5 {
		t.Errorf("outbox_relay_kafka_topic_partitions = %v, want 5", n)
	}
	for _, want := range []string{`"old_partitions":2,"partitions":5`, "without waiting for the events in flight"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// A sender is one per broker id: sarama's new *sarama.Broker for the same
// node (after a connection error and a metadata refresh) finds the same
// sender; a new address for the node starts a new one, and the old one
// hands its partitions over and ends once idle.
func TestDirectSenderPerNode(t *testing.T) {
	d, p, _, _ := directRig(t, 5, 1000000)
	d.senderIdle = 20 * time.Millisecond
	t.Cleanup(d.stop)
	count := func() int {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.senders)
	}
	d.mu.Lock()
	first := d.brokerFor(sarama.NewBroker("127.0.0.1:1"))
	for range 50 {
		if d.brokerFor(sarama.NewBroker("127.0.0.1:1")) != first {
			d.mu.Unlock()
			t.Fatal("a new *sarama.Broker for the same node started another sender")
		}
	}
	p.leader = first
	moved := d.brokerFor(sarama.NewBroker("127.0.0.1:2"))       // the node's new address
	p2 := &dpart{topic: p.topic, id: 1, leader: moved, pid: -1} // resolved since: led by the new one
	p.topic.parts = append(p.topic.parts, p2)
	d.mu.Unlock()
	if moved == first || count() != 2 {
		t.Fatalf("a new address for the node: %d senders, want 2", count())
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d senders after the replaced one was idle, want 1", count())
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.leader != moved {
		t.Fatal("the retired sender's partition was not handed to the node's new sender")
	}
}

// delivery: exactly_once (sarama's transactional producer): the change is
// detected, logged and counted like the other producers', and the records
// committed after it use the new partitions.
func TestKfakePartitionsAddedExactlyOnce(t *testing.T) {
	c := fakeKafka(t, 1, 2)
	cfg := DefaultConfig()
	cfg.Brokers = c.ListenAddrs()
	var logs syncBuf
	p, err := NewTxn(cfg, "relay-test", time.Minute, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	counters, err := New(cfg, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	p.SetMetrics(counters)
	p.gate.every = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sent := 0
	txn := func(seq int) {
		t.Helper()
		if err := p.Begin(); err != nil {
			t.Fatal(err)
		}
		for k := range 20 {
			if err := p.Send(ctx, &Message{Topic: fakeTopic, Key: fmt.Appendf(nil, "key-%d", k), Value: fmt.Appendf(nil, "%d/%d", k, seq)}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		if err, recs := p.Commit(ctx); err != nil || len(recs) > 0 {
			t.Fatalf("commit: %v %v", err, recs)
		}
	}
	txn(0)
	createPartitions(t, c, 5)
	r := &fakeRun{t: t, reg: reg}
	waitCounter(t, r, 1, 10*time.Second, "outbox_relay_kafka_partition_changes_total", "topic", fakeTopic)
	txn(1)
	inNew := 0
	recs := consumeFake(t, c, sent)
	for _, rc := range recs {
		if rc.partition >= 2 {
			inNew++
		}
	}
	if inNew == 0 {
		t.Fatal("no record committed to the partitions added")
	}
	checkOrder(t, recs, sent)
	if n := counter(t, reg, "outbox_relay_kafka_topic_partitions", "topic", fakeTopic); n != 5 {
		t.Errorf("outbox_relay_kafka_topic_partitions = %v, want 5", n)
	}
	for _, want := range []string{`"old_partitions":2,"partitions":5`, "without waiting for the events in flight"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
