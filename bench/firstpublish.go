package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// firstPublishProbes is the number of events, each the first of a fresh
// aggregate_type and so to a topic that does not exist yet.
const firstPublishProbes = 5

// firstPublishGoal is the target: the first event to a new topic
// visible to a consumer within 500 ms (judged on the median of the probes).
const firstPublishGoal = 500.0 // ms

// autoCreateFlag lets the relay create a missing topic; relays from before
// it created topics by default and do not know the flag.
const autoCreateFlag = "--kafka-auto-create-topics"

// firstPublish is the first-publish part: one relay, probes in sequence.
type firstPublish struct {
	AutoCreate bool      // the relay ran with autoCreateFlag
	WallMs     []float64 // wall time from just before COMMIT to the consumer receiving the record
	StampMs    []float64 // receive time minus the record timestamp (the commit time, ms resolution)
	Err        string
}

// relayKnows reports whether `relay run -h` lists a flag.
func relayKnows(bin, flag string) bool {
	out, _ := exec.Command(bin, "run", "-h").CombinedOutput()
	return strings.Contains(string(out), flag+" ") || strings.Contains(string(out), flag+"\n") || strings.Contains(string(out), flag+"=")
}

func (b *bench) runFirstPublish(ctx context.Context) *firstPublish {
	out := &firstPublish{}
	fail := func(format string, a ...any) *firstPublish {
		out.Err = fmt.Sprintf(format, a...)
		return out
	}
	var extra []string
	if slices.Contains(b.relayFlags, autoCreateFlag) || slices.ContainsFunc(b.relayFlags, func(f string) bool { return strings.HasPrefix(f, autoCreateFlag+"=") }) {
		out.AutoCreate = true
	} else if relayKnows(b.relayBin, autoCreateFlag) {
		extra, out.AutoCreate = []string{autoCreateFlag}, true
	}
	slot := b.pg.schema + "_first"
	if _, err := b.pg.createSlot(ctx, slot); err != nil {
		return fail("%v", err)
	}
	defer b.pg.dropSlot(ctx, slot)
	base := b.topicPrefix + "first."
	var topics []string
	defer func() {
		for _, t := range topics {
			b.kafka.deleteTopic(t)
		}
	}()
	rp, err := b.startRelay("first", slot, base+"{aggregate_type}", extra...)
	if err != nil {
		return fail("%v", err)
	}
	defer rp.stop()
	if err := rp.waitReady(60 * time.Second); err != nil {
		return fail("%v", err)
	}
	insert := "INSERT INTO " + b.pg.table + ` (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'agg-1', 'order.created', '{"probe":true}')`

	// Warm-up: one event to a topic created beforehand, so the relay's
	// producer is connected and the probes measure the new topic only.
	warm := base + "warm"
	topics = append(topics, warm)
	if err := b.kafka.createTopic(warm); err != nil {
		return fail("%v", err)
	}
	lc, err := b.kafka.consume(warm)
	if err != nil {
		return fail("%v", err)
	}
	if _, err := b.pg.pool.Exec(ctx, insert, "warm"); err != nil {
		lc.close()
		return fail("warm-up: %v", err)
	}
	for t := time.Now(); lc.count() < 1; time.Sleep(20 * time.Millisecond) {
		if time.Since(t) > 30*time.Second {
			lc.close()
			return fail("warm-up event not delivered within 30s")
		}
	}
	lc.close()

	// The probe's client must not create the topic itself: no auto-creation
	// in its metadata requests, and no retry backoff hiding the wait.
	cfg := saramaCfg()
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Metadata.Retry.Max = 0
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	client, err := sarama.NewClient(b.brokers, cfg)
	if err != nil {
		return fail("kafka client: %v", err)
	}
	defer client.Close()
	for i := 1; i <= firstPublishProbes && ctx.Err() == nil; i++ {
		agg := fmt.Sprintf("new%d", i)
		topic := base + agg
		topics = append(topics, topic)
		wall, stamp, err := b.probeFirst(ctx, client, insert, agg, topic)
		if err != nil {
			return fail("probe %d (%s): %v", i, topic, err)
		}
		out.WallMs = append(out.WallMs, wall)
		out.StampMs = append(out.StampMs, stamp)
	}
	return out
}

// probeFirst commits one event of aggregate type agg and waits until a
// consumer reads it from topic, which must not exist before.
func (b *bench) probeFirst(ctx context.Context, client sarama.Client, insert, agg, topic string) (wallMs, stampMs float64, err error) {
	if err := client.RefreshMetadata(topic); err == nil {
		if ps, _ := client.Partitions(topic); len(ps) > 0 {
			return 0, 0, errors.New("the topic exists before the event")
		}
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return 0, 0, err
	}
	defer consumer.Close()
	tx, err := b.pg.pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	if _, err := tx.Exec(ctx, insert, agg); err != nil {
		tx.Rollback(ctx)
		return 0, 0, err
	}
	t0 := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	deadline := t0.Add(30 * time.Second)
	// Wait for the topic's partitions (5 ms polls of fresh metadata), then
	// read each from the start.
	var parts []int32
	for len(parts) == 0 {
		if time.Now().After(deadline) {
			return 0, 0, errors.New("topic did not appear within 30s")
		}
		if client.RefreshMetadata(topic) == nil {
			parts, _ = client.Partitions(topic)
		}
		if len(parts) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	type recv struct {
		at, stamp time.Time
	}
	got := make(chan recv, len(parts))
	var pcs []sarama.PartitionConsumer
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
	}()
	for _, p := range parts {
		var pc sarama.PartitionConsumer
		for {
			if pc, err = consumer.ConsumePartition(topic, p, sarama.OffsetOldest); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return 0, 0, fmt.Errorf("consume partition %d: %w", p, err)
			}
			time.Sleep(5 * time.Millisecond)
			_ = client.RefreshMetadata(topic)
		}
		pcs = append(pcs, pc)
		go func() {
			for m := range pc.Messages() {
				select {
				case got <- recv{time.Now(), m.Timestamp}:
				default:
				}
			}
		}()
		go func() {
			for range pc.Errors() {
			}
		}()
	}
	select {
	case r := <-got:
		return ms(r.at.Sub(t0)), ms(r.at.Sub(r.stamp)), nil
	case <-time.After(time.Until(deadline)):
		return 0, 0, errors.New("event not received within 30s")
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msInt formats the first-publish milliseconds (whole ms, also above 1 s).
func msInt(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f ms", v)
}
