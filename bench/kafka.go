package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
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
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.ClientID = "outbox-bench"
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
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
	err := k.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: k.partitions, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	k.mu.Lock()
	k.created = append(k.created, topic)
	k.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = k.client.RefreshMetadata(topic)
		parts, err := k.client.Partitions(topic)
		if err == nil && len(parts) == int(k.partitions) {
			ok := true
			for _, p := range parts {
				if _, err := k.client.Leader(topic, p); err != nil {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s has no leaders after 30s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	mu       sync.Mutex
	lat      []float64 // milliseconds
	wg       sync.WaitGroup
}

func (k *kafka) consume(topic string) (*latencyConsumer, error) {
	consumer, err := sarama.NewConsumer(k.brokers, saramaCfg())
	if err != nil {
		return nil, err
	}
	lc := &latencyConsumer{consumer: consumer}
	parts, err := k.client.Partitions(topic)
	if err != nil {
		consumer.Close()
		return nil, err
	}
	for _, p := range parts {
		// A just-created partition may not serve yet (NOT_LEADER): retry.
		var pc sarama.PartitionConsumer
		for deadline := time.Now().Add(30 * time.Second); ; {
			pc, err = consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				lc.close()
				return nil, fmt.Errorf("consume %s/%d: %w", topic, p, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		lc.pcs = append(lc.pcs, pc)
		lc.wg.Add(2)
		go func() {
			defer lc.wg.Done()
			buf := make([]float64, 0, 256)
			flush := func() {
				lc.mu.Lock()
				lc.lat = append(lc.lat, buf...)
				lc.mu.Unlock()
				buf = buf[:0]
			}
			for m := range pc.Messages() {
				now := time.Now()
				buf = append(buf, float64(now.Sub(m.Timestamp))/float64(time.Millisecond))
				if len(buf) == cap(buf) || len(pc.Messages()) == 0 {
					flush()
				}
			}
			flush()
		}()
		go func() {
			defer lc.wg.Done()
			for err := range pc.Errors() {
				logf("consumer %s/%d: %v", topic, p, err)
			}
		}()
	}
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
	lc.mu.Unlock()
}

// close stops consuming and returns the sorted latencies (ms).
func (lc *latencyConsumer) close() []float64 {
	for _, pc := range lc.pcs {
		pc.AsyncClose()
	}
	lc.wg.Wait()
	lc.consumer.Close()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	slices.Sort(lc.lat)
	return lc.lat
}
