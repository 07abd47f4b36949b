package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// scriptedPublisher answers each Publish asynchronously, as sarama does,
// with the error answer(topic, attempt) picks; attempt counts per topic.
type scriptedPublisher struct {
	answer func(topic string, attempt int) error
	mu     sync.Mutex
	sent   []sink.Message
	tries  map[string]int
}

func (s *scriptedPublisher) Publish(_ context.Context, m *sink.Message) error {
	s.mu.Lock()
	s.tries[m.Topic]++
	n := s.tries[m.Topic]
	s.sent = append(s.sent, *m)
	s.mu.Unlock()
	go m.Done(s.answer(m.Topic, n))
	return nil
}

type fakeMarker struct {
	mu           sync.Mutex
	dead, failed []int64
	attempts     int
}

func (f *fakeMarker) MarkDead(_ context.Context, id int64, attempts int, _ string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead, f.attempts = append(f.dead, id), attempts
	return true, nil
}

func (f *fakeMarker) MarkFailed(_ context.Context, id int64, attempts int, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed, f.attempts = append(f.failed, id), attempts
	return nil
}

func TestPoisonAndRetryPolicy(t *testing.T) {
	const topic, dlq = "outbox.event.order", "outbox.dlq"
	always := func(err error) func(string, int) error {
		return func(tp string, _ int) error {
			if tp == topic {
				return err
			}
			return nil
		}
	}
	tests := []struct {
		name     string
		halt     bool
		answer   func(topic string, attempt int) error
		acked    bool   // the watermark passes the event
		dlq      string // dlq.reason of the dead letter, "" = none sent
		noValue  bool   // the dead letter omits the payload
		halted   bool
		attempts int // publish attempts on the event's own topic
	}{
		{name: "transient errors are retried until the broker takes the event",
			answer: func(tp string, n int) error {
				if n <= 6 {
					return []error{sarama.ErrOutOfBrokers, sarama.ErrNotEnoughReplicas, sarama.ErrRequestTimedOut}[n%3]
				}
				return nil
			}, acked: true, attempts: 7},
		{name: "too large: dead letter without payload after max attempts",
			answer: always(sarama.ErrMessageSizeTooLarge), acked: true, dlq: "message_too_large", noValue: true, attempts: 3},
		{name: "broker rejects the record: dead letter with payload",
			answer: always(sarama.ErrInvalidRecord), acked: true, dlq: "broker_rejected", attempts: 3},
		{name: "poison that heals within the attempts is published",
			answer: func(tp string, n int) error {
				if n < 3 {
					return sarama.ErrInvalidRecord
				}
				return nil
			}, acked: true, attempts: 3},
		{name: "dead-letter write fails: halt, slot kept",
			answer: func(tp string, n int) error { return sarama.ErrInvalidTopic }, dlq: "invalid_topic", halted: true, attempts: 3},
		{name: "dead-letter write fails transiently: retried, then acked",
			answer: func(tp string, n int) error {
				if tp == topic {
					return sarama.ErrInvalidRecord
				}
				if n < 4 {
					return sarama.ErrLeaderNotAvailable
				}
				return nil
			}, acked: true, dlq: "broker_rejected", attempts: 3},
		{name: "authorization refused: halt at once, never dead-letter",
			answer: always(sarama.ErrTopicAuthorizationFailed), halted: true, attempts: 1},
		{name: "on_poison halt: halt after max attempts",
			halt: true, answer: always(sarama.ErrInvalidRecord), halted: true, attempts: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &scriptedPublisher{answer: tt.answer, tries: map[string]int{}}
			marker := &fakeMarker{}
			tracker := checkpoint.New(0, checkpoint.Limits{MaxEvents: 10, MaxBytes: 1 << 20})
			tmpl, _ := sink.ParseTemplate("outbox.event.{aggregate_type}")
			policy := poisonPolicy{halt: tt.halt, topic: dlq, maxAttempts: 3, backoff: time.Millisecond, transientMax: 5 * time.Millisecond}
			p, err := newPipeline("public.outbox", tracker, pub, tmpl, marker, policy, context.Background(), zerolog.Nop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pend, err := tracker.Add(context.Background(), 100, 1, 7)
			if err != nil {
				t.Fatal(err)
			}
			d := &delivery{p: p, pend: pend, id: 42, lsn: 90, commit: time.Now(), size: 7}
			d.msg = sink.Message{Topic: topic, Key: []byte("order-1"), Value: []byte(`{"a":1}`), Done: d.done,
				Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("42")}}}
			if err := p.pub.Publish(context.Background(), &d.msg); err != nil {
				t.Fatal(err)
			}

			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) && tracker.Flushed() != 100 && p.Halted() == nil {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // let stray retries show up
			if got := tracker.Flushed() == 100; got != tt.acked {
				t.Errorf("watermark %s: acked=%v, want %v", tracker.Flushed(), got, tt.acked)
			}
			if got := p.Halted() != nil; got != tt.halted {
				t.Errorf("halted=%v (%v), want %v", got, p.Halted(), tt.halted)
			}
			pub.mu.Lock()
			defer pub.mu.Unlock()
			if pub.tries[topic] != tt.attempts {
				t.Errorf("%d attempts on %s, want %d", pub.tries[topic], topic, tt.attempts)
			}
			var letter *sink.Message
			for i := range pub.sent {
				if pub.sent[i].Topic == dlq {
					letter = &pub.sent[i]
				}
			}
			if (letter != nil) != (tt.dlq != "") {
				t.Fatalf("dead letter sent: %v, want %v", letter != nil, tt.dlq != "")
			}
			marker.mu.Lock()
			defer marker.mu.Unlock()
			if tt.halted && (len(marker.failed) != 1 || marker.failed[0] != 42) {
				// MarkFailed runs on its own goroutine; give it a moment.
				marker.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				marker.mu.Lock()
				if len(marker.failed) != 1 {
					t.Errorf("MarkFailed calls %v, want [42]", marker.failed)
				}
			}
			if letter == nil {
				return
			}
			h := map[string]string{}
			for _, x := range letter.Headers {
				h[string(x.Key)] = string(x.Value)
			}
			want := map[string]string{"event_id": "42", "dlq.original_topic": topic, "dlq.reason": tt.dlq,
				"dlq.attempts": "3", "dlq.event_id": "42", "dlq.source_lsn": "0/5A", "dlq.table": "public.outbox"}
			for k, v := range want {
				if h[k] != v {
					t.Errorf("dead letter header %s = %q, want %q (all %v)", k, h[k], v, h)
				}
			}
			if !strings.Contains(h["dlq.error"], "publish to topic "+topic) {
				t.Errorf("dlq.error = %q, want the publish error", h["dlq.error"])
			}
			if string(letter.Key) != "order-1" {
				t.Errorf("dead letter key %q, want the event's key", letter.Key)
			}
			if omitted := letter.Value == nil && h["dlq.payload_omitted"] == "true"; omitted != tt.noValue {
				t.Errorf("payload omitted=%v (value %q), want %v", omitted, letter.Value, tt.noValue)
			}
			if tt.acked && (len(marker.dead) != 1 || marker.dead[0] != 42 || marker.attempts != 3) {
				t.Errorf("MarkDead calls %v (attempts %d), want [42] with 3", marker.dead, marker.attempts)
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	ev := &decoder.Event{ID: 42, AggregateType: "order", AggregateID: "o-1", EventType: "order.paid",
		Headers: []decoder.Header{{Key: "trace_id", Value: []byte("t-1")}, {Key: "n", Value: []byte("3")}}}
	h, key := headers(ev, "0/16B3F28")
	want := [][2]string{{"event_id", "42"}, {"event_type", "order.paid"}, {"aggregate_type", "order"},
		{"aggregate_id", "o-1"}, {"pg_lsn", "0/16B3F28"}, {"trace_id", "t-1"}, {"n", "3"}}
	if len(h) != len(want) || string(key) != "o-1" {
		t.Fatalf("headers %v, key %q", h, key)
	}
	for i, w := range want {
		if string(h[i].Key) != w[0] || string(h[i].Value) != w[1] {
			t.Errorf("header %d = %s: %s, want %s: %s", i, h[i].Key, h[i].Value, w[0], w[1])
		}
	}
	// Values share one buffer: appending to one must not overwrite the next.
	_ = append(h[1].Value, "xxxxxxxx"...)
	if string(h[2].Value) != "order" {
		t.Errorf("aggregate_type overwritten: %q", h[2].Value)
	}
}
