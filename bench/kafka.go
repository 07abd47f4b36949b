package main

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// kafka is the bench's admin client: it creates each measurement's topics
// beforehand (the first produce to an auto-created topic may fail once) and
// deletes them afterwards, so a full run does not fill the disk.
type kafka struct {
	brokers    []string
	partitions int32
	client     sarama.Client
	admin      sarama.ClusterAdmin
	mu         sync.Mutex
	created    []string
}

func saramaCfg() *sarama.Config {
	cfg := testkit.SaramaConfig()
	cfg.ClientID = "outbox-bench"
	return cfg
}

func connectKafka(brokers []string, partitions int) (*kafka, error) {
	client, err := sarama.NewClient(brokers, saramaCfg())
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	return &kafka{brokers: brokers, partitions: int32(partitions), client: client, admin: admin}, nil
}

// createTopic creates a topic and waits until every partition has a leader.
func (k *kafka) createTopic(topic string) error {
	k.mu.Lock()
	k.created = append(k.created, topic)
	k.mu.Unlock()
	return testkit.CreateTopics(k.brokers, k.partitions, nil, topic)
}

// records is the number of records in a topic (sum of high watermarks; the
// topics are fresh, so offsets start at 0).
func (k *kafka) records(topic string) (int64, error) {
	if err := k.client.RefreshMetadata(topic); err != nil {
		return 0, err
	}
	parts, err := k.client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range parts {
		o, err := k.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		n += o
	}
	return n, nil
}

func (k *kafka) deleteTopic(topic string) {
	if err := k.admin.DeleteTopic(topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		logf("delete topic %s: %v", topic, err)
	}
	k.mu.Lock()
	k.created = slices.DeleteFunc(k.created, func(t string) bool { return t == topic })
	k.mu.Unlock()
}

// deletePrefix deletes every topic of this run still there (also ones the
// relay created on its own, e.g. after a failed measurement).
func (k *kafka) deletePrefix(prefix string) {
	topics, err := k.admin.ListTopics()
	if err != nil {
		logf("list topics: %v", err)
		return
	}
	for t := range topics {
		if strings.HasPrefix(t, prefix) {
			k.deleteTopic(t)
		}
	}
}

func (k *kafka) close() {
	k.admin.Close() // closes the client too
}

// latencyConsumer reads one topic from the start and records, per record,
// receive time minus the record timestamp (the PostgreSQL commit time the
// relay sets; Kafka keeps it in milliseconds).
type latencyConsumer struct {
	c    *testkit.Consumer
	mu   sync.Mutex
	lat  []float64       // milliseconds
	seqs map[int64]int32 // records per payload "seq" (the generator numbers its events): duplicates
}

func (k *kafka) consume(topic string, opts ...testkit.ReadOption) (*latencyConsumer, error) {
	lc := &latencyConsumer{seqs: map[int64]int32{}}
	c, err := testkit.Consume(k.brokers, []string{topic}, 30*time.Second, func(m *sarama.ConsumerMessage) {
		ms := float64(time.Since(m.Timestamp)) / float64(time.Millisecond)
		seq, ok := payloadSeq(m.Value)
		lc.mu.Lock()
		lc.lat = append(lc.lat, ms)
		if ok {
			lc.seqs[seq]++
		}
		lc.mu.Unlock()
	}, opts...)
	if err != nil {
		return nil, err
	}
	lc.c = c
	return lc, nil
}

func (lc *latencyConsumer) count() int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return len(lc.lat)
}

// reset forgets what was received so far (the warm-up).
func (lc *latencyConsumer) reset() {
	lc.mu.Lock()
	lc.lat = lc.lat[:0]
	clear(lc.seqs)
	lc.mu.Unlock()
}

// payloadSeq reads the "seq" number of a generated payload (jsonb prints
// `"seq": 12`).
func payloadSeq(v []byte) (int64, bool) {
	i := bytes.Index(v, []byte(`"seq":`))
	if i < 0 {
		return 0, false
	}
	i += len(`"seq":`)
	for i < len(v) && v[i] == ' ' {
		i++
	}
	var n int64
	j := i
	for ; j < len(v) && v[j] >= '0' && v[j] <= '9'; j++ {
		n = 10*n + int64(v[j]-'0')
	}
	return n, j > i
}

// closeCount is close, also returning the distinct events received and the
// records received more than once.
func (lc *latencyConsumer) closeCount() (lat []float64, distinct, dups int) {
	lat = lc.close()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, n := range lc.seqs {
		distinct++
		dups += int(n) - 1
	}
	return lat, distinct, dups
}

// close stops consuming and returns the sorted latencies (ms).
func (lc *latencyConsumer) close() []float64 {
	lc.c.Close()
	for _, err := range lc.c.Errors() {
		logf("consumer: %v", err)
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	slices.Sort(lc.lat)
	return lc.lat
}

// warmTransactions prepares the broker for exactly-once relays before any is
// measured: the first transactional producer on a fresh cluster waits (about
// 10 s here) while the broker creates its __transaction_state topic, and the
// first exactly-once relay creates the checkpoint topic. Both are one-time
// costs of the cluster, not of a drain, so a throwaway transactional
// producer initialises once, and the checkpoint topic is made as the relay
// would make it (1 partition, compacted).
func (k *kafka) warmTransactions(id string) error {
	compact := "compact"
	if err := testkit.CreateTopics(k.brokers, 1, map[string]*string{"cleanup.policy": &compact}, testkit.CheckpointTopic); err != nil {
		return err
	}
	cfg := saramaCfg()
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Transaction.ID = id
	cfg.Producer.Transaction.Timeout = 10 * time.Second
	cfg.Net.MaxOpenRequests = 1
	var err error
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(500 * time.Millisecond) {
		var p sarama.AsyncProducer
		if p, err = sarama.NewAsyncProducer(k.brokers, cfg); err == nil { // InitProducerId
			return p.Close()
		}
	}
	return fmt.Errorf("transactional producer warm-up: %w", err)
}
