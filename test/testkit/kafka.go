package testkit

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Record is one Kafka record as the checks need it.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
	Timestamp time.Time
}

func toRecord(m *sarama.ConsumerMessage) Record {
	h := make(map[string]string, len(m.Headers))
	for _, rh := range m.Headers {
		h[string(rh.Key)] = string(rh.Value)
	}
	return Record{m.Topic, m.Partition, m.Offset, string(m.Key), m.Value, h, m.Timestamp}
}

// SaramaConfig is the clients' configuration (the relay's protocol version).
func SaramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "outbox-testkit"
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	return cfg
}

// ReadOption changes how the consume and read helpers read.
type ReadOption func(*sarama.Config)

// ReadCommitted reads with isolation.level=read_committed
// (Consumer.IsolationLevel = sarama.ReadCommitted), as exactly-once
// consumers must: records of open or aborted Kafka transactions are never
// seen, and ReadToEnd reads to the last stable offset.
var ReadCommitted ReadOption = func(c *sarama.Config) { c.Consumer.IsolationLevel = sarama.ReadCommitted }

func readConfig(opts []ReadOption) *sarama.Config {
	cfg := SaramaConfig()
	for _, o := range opts {
		o(cfg)
	}
	return cfg
}

// CreateTopics creates topics with n partitions and replication factor 1
// (an existing one is fine) and waits until every partition has a leader.
func CreateTopics(brokers []string, n int32, configs map[string]*string, topics ...string) error {
	return CreateTopicsRF(brokers, n, 1, configs, topics...)
}

// CreateTopicsRF is CreateTopics with rf replicas per partition (3 on the
// three-node cluster of test/services.sh cluster-start).
func CreateTopicsRF(brokers []string, n int32, rf int16, configs map[string]*string, topics ...string) error {
	client, err := sarama.NewClient(brokers, SaramaConfig())
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	for _, tp := range topics {
		err := admin.CreateTopic(tp, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: rf, ConfigEntries: configs}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", tp, err)
		}
		err = Poll(30*time.Second, 100*time.Millisecond, func() (bool, error) {
			_ = client.RefreshMetadata(tp)
			parts, err := client.Partitions(tp)
			if err != nil || len(parts) != int(n) {
				return false, nil
			}
			for _, p := range parts {
				if _, err := client.Leader(tp, p); err != nil {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("topic %s has no leaders: %w", tp, err)
		}
	}
	return nil
}

// DeleteTopics deletes every topic whose name starts with prefix.
func DeleteTopics(brokers []string, prefix string) error {
	admin, err := sarama.NewClusterAdmin(brokers, SaramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	var errs []error
	for tp := range topics {
		if strings.HasPrefix(tp, prefix) {
			if err := admin.DeleteTopic(tp); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				errs = append(errs, fmt.Errorf("delete topic %s: %w", tp, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Topics lists the topics on the cluster whose name starts with prefix,
// sorted.
func Topics(brokers []string, prefix string) ([]string, error) {
	admin, err := sarama.NewClusterAdmin(brokers, SaramaConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	all, err := admin.ListTopics()
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var out []string
	for tp := range all {
		if strings.HasPrefix(tp, prefix) {
			out = append(out, tp)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Partitions returns the partition count of each topic.
func Partitions(brokers []string, topics ...string) (map[string]int, error) {
	client, err := sarama.NewClient(brokers, SaramaConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	out := map[string]int{}
	for _, tp := range topics {
		parts, err := client.Partitions(tp)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", tp, err)
		}
		out[tp] = len(parts)
	}
	return out, nil
}

// Consumer reads every partition of some topics from the oldest offset in
// the background, handing each message to a callback.
type Consumer struct {
	client   sarama.Client
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
	mu       sync.Mutex
	errs     []error
}

// Consume starts reading topics; a topic that does not exist yet, or a
// partition without a leader yet, is waited for until d passes. handle is
// called from one goroutine per partition, in offset order per partition.
func Consume(brokers []string, topics []string, d time.Duration, handle func(*sarama.ConsumerMessage), opts ...ReadOption) (*Consumer, error) {
	client, err := sarama.NewClient(brokers, readConfig(opts))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	c := &Consumer{client: client, consumer: consumer}
	for _, tp := range topics {
		if err := c.add(tp, d, handle); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Consumer) add(tp string, d time.Duration, handle func(*sarama.ConsumerMessage)) error {
	var parts []int32
	err := Poll(d, 200*time.Millisecond, func() (bool, error) {
		var err error
		_ = c.client.RefreshMetadata(tp)
		parts, err = c.client.Partitions(tp)
		return err == nil && len(parts) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("topic %s never appeared: %w", tp, err)
	}
	for _, p := range parts {
		var pc sarama.PartitionConsumer
		// A just-created partition may not have a leader yet: retry.
		err := Poll(d, 200*time.Millisecond, func() (bool, error) {
			var err error
			if pc, err = c.consumer.ConsumePartition(tp, p, sarama.OffsetOldest); err != nil {
				_ = c.client.RefreshMetadata(tp)
			}
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("consume %s/%d: %w", tp, p, err)
		}
		c.pcs = append(c.pcs, pc)
		c.wg.Add(2)
		go func() {
			defer c.wg.Done()
			for m := range pc.Messages() {
				handle(m)
			}
		}()
		go func() {
			defer c.wg.Done()
			for err := range pc.Errors() {
				c.mu.Lock()
				c.errs = append(c.errs, err)
				c.mu.Unlock()
			}
		}()
	}
	return nil
}

// Errors are the consume errors so far.
func (c *Consumer) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// Close stops consuming and waits until no handler runs any more.
func (c *Consumer) Close() {
	for _, pc := range c.pcs {
		pc.AsyncClose()
	}
	c.wg.Wait()
	c.consumer.Close()
	c.client.Close()
}

// ReadUntil reads every partition of topics from the start until it has at
// least want records and no new one came for quiet, or d passes.
func ReadUntil(brokers []string, topics []string, want int, d, quiet time.Duration, opts ...ReadOption) ([]Record, error) {
	deadline := time.Now().Add(d)
	ch := make(chan Record, 1024)
	c, err := Consume(brokers, topics, d, func(m *sarama.ConsumerMessage) { ch <- toRecord(m) }, opts...)
	if err != nil {
		return nil, err
	}
	defer func() {
		go func() { // unblock handlers while Close waits for them
			for range ch {
			}
		}()
		c.Close()
		close(ch)
	}()
	var out []Record
	last := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-ch:
			out = append(out, r)
			last = time.Now()
		case <-tick.C:
		}
		if (len(out) >= want && time.Since(last) >= quiet) || time.Now().After(deadline) {
			return out, nil
		}
	}
}

// ReadToEnd reads every partition of every topic whose name starts with
// prefix from the oldest offset to the high-water mark it has now; it also
// returns each topic's partition count. Any consume error is an error.
// With ReadCommitted it reads to the last stable offset instead, and sees
// only records of committed Kafka transactions (and non-transactional ones).
func ReadToEnd(brokers []string, prefix string, stuck time.Duration, opts ...ReadOption) ([]Record, map[string]int, error) {
	cfg := readConfig(opts)
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	if err := client.RefreshMetadata(); err != nil {
		return nil, nil, fmt.Errorf("kafka metadata: %w", err)
	}
	all, err := client.Topics()
	if err != nil {
		return nil, nil, fmt.Errorf("kafka topics: %w", err)
	}
	partitions := map[string]int{}
	var out []Record
	for _, tp := range all {
		if !strings.HasPrefix(tp, prefix) {
			continue
		}
		parts, err := client.Partitions(tp)
		if err != nil {
			return nil, nil, fmt.Errorf("partitions of %s: %w", tp, err)
		}
		partitions[tp] = len(parts)
		for _, p := range parts {
			recs, err := readPartition(client, tp, p, cfg.Consumer.IsolationLevel, stuck)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, recs...)
		}
	}
	return out, partitions, nil
}

// readPartition reads tp/p from the oldest offset to its end now: the
// high-water mark, or with read_committed the last stable offset. A sarama
// PartitionConsumer does not tell how far it has read when the last records
// before the end are ones it never hands out (transaction markers, and with
// read_committed aborted records), so this fetches itself and filters
// exactly like sarama's consumer: control batches are skipped, and with
// read_committed so are the transactional batches of a producer from the
// first offset of one of its aborted transactions (the broker lists them)
// to its abort marker.
func readPartition(client sarama.Client, tp string, p int32, iso sarama.IsolationLevel, stuck time.Duration) ([]Record, error) {
	broker, err := client.Leader(tp, p)
	if err != nil {
		return nil, fmt.Errorf("leader of %s/%d: %w", tp, p, err)
	}
	oreq := sarama.NewOffsetRequest(client.Config().Version)
	oreq.IsolationLevel = iso
	oreq.AddBlock(tp, p, sarama.OffsetNewest, 1)
	oresp, err := broker.GetAvailableOffsets(oreq)
	if err != nil {
		return nil, fmt.Errorf("end offset of %s/%d: %w", tp, p, err)
	}
	ob := oresp.GetBlock(tp, p)
	if ob == nil || !errors.Is(ob.Err, sarama.ErrNoError) {
		return nil, fmt.Errorf("end offset of %s/%d: %v", tp, p, ob)
	}
	lso := ob.Offset          // the end: last stable offset or high-water mark
	if len(ob.Offsets) == 1 { // old response versions
		lso = ob.Offsets[0]
	}
	offset, err := client.GetOffset(tp, p, sarama.OffsetOldest)
	if err != nil {
		return nil, fmt.Errorf("oldest offset of %s/%d: %w", tp, p, err)
	}
	var out []Record
	aborted := map[int64]bool{} // producer ids inside an aborted transaction
	maxBytes := int32(4 << 20)
	last := time.Now()
	for offset < lso {
		if time.Since(last) > stuck {
			return nil, fmt.Errorf("consume %s/%d: stuck at offset %d before %d", tp, p, offset, lso)
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: maxBytes,
			Isolation: iso, SessionID: 0, SessionEpoch: -1}
		req.AddBlock(tp, p, offset, maxBytes, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return nil, fmt.Errorf("fetch %s/%d@%d: %w", tp, p, offset, err)
		}
		b := resp.GetBlock(tp, p)
		if b == nil {
			return nil, fmt.Errorf("fetch %s/%d@%d: no block in the response", tp, p, offset)
		}
		if !errors.Is(b.Err, sarama.ErrNoError) {
			return nil, fmt.Errorf("fetch %s/%d@%d: %w", tp, p, offset, b.Err)
		}
		txns := slices.Clone(b.AbortedTransactions)
		slices.SortFunc(txns, func(a, b *sarama.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
		before := offset
		for _, rs := range b.RecordsSet {
			rb := rs.RecordBatch
			if rb == nil {
				return nil, fmt.Errorf("fetch %s/%d@%d: a legacy message set", tp, p, offset)
			}
			if rb.PartialTrailingRecord {
				break // cut off at MaxBytes: fetched again from here
			}
			end := rb.FirstOffset + int64(rb.LastOffsetDelta) + 1
			for len(txns) > 0 && txns[0].FirstOffset < end {
				aborted[txns[0].ProducerID] = true
				txns = txns[1:]
			}
			switch {
			case rb.Control:
				// Key: version int16, type int16 (0 abort, 1 commit).
				if len(rb.Records) > 0 && len(rb.Records[0].Key) >= 4 && binary.BigEndian.Uint16(rb.Records[0].Key[2:4]) == 0 {
					delete(aborted, rb.ProducerID)
				}
			case iso == sarama.ReadCommitted && rb.IsTransactional && aborted[rb.ProducerID]:
			default:
				for _, r := range rb.Records {
					off := rb.FirstOffset + r.OffsetDelta
					if off < offset || off >= lso {
						continue
					}
					h := make(map[string]string, len(r.Headers))
					for _, rh := range r.Headers {
						h[string(rh.Key)] = string(rh.Value)
					}
					ts := rb.FirstTimestamp.Add(r.TimestampDelta)
					if rb.LogAppendTime {
						ts = rb.MaxTimestamp
					}
					out = append(out, Record{tp, p, off, string(r.Key), r.Value, h, ts})
				}
			}
			offset = max(offset, end)
		}
		if offset > before {
			last = time.Now()
		} else if len(b.RecordsSet) > 0 && maxBytes < 64<<20 {
			maxBytes *= 2 // one batch larger than a fetch
		}
	}
	return out, nil
}

// AddPartitions grows topic to n partitions and waits until each has a
// leader.
func AddPartitions(brokers []string, topic string, n int32) error {
	client, err := sarama.NewClient(brokers, SaramaConfig())
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	if err := admin.CreatePartitions(topic, n, nil, false); err != nil {
		return fmt.Errorf("add partitions to topic %s: %w", topic, err)
	}
	return Poll(30*time.Second, 100*time.Millisecond, func() (bool, error) {
		_ = client.RefreshMetadata(topic)
		parts, err := client.Partitions(topic)
		if err != nil || len(parts) != int(n) {
			return false, nil
		}
		for _, p := range parts {
			if _, err := client.Leader(topic, p); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// SetProducerQuota sets the broker's producer_byte_rate quota for
// clients with clientID (bytes per second); 0 removes it.
func SetProducerQuota(brokers []string, clientID string, bytesPerSec float64) error {
	admin, err := sarama.NewClusterAdmin(brokers, SaramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	entity := []sarama.QuotaEntityComponent{{EntityType: sarama.QuotaEntityClientID, MatchType: sarama.QuotaMatchExact, Name: clientID}}
	op := sarama.ClientQuotasOp{Key: "producer_byte_rate", Value: bytesPerSec, Remove: bytesPerSec == 0}
	if err := admin.AlterClientQuotas(entity, op, false); err != nil {
		return fmt.Errorf("producer quota of client %s: %w", clientID, err)
	}
	return nil
}
