package relay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

const (
	testTopic = "outbox.event.order"
	testDLQ   = "outbox.dlq"
)

// scriptedPublisher answers each Publish on its own goroutine, as sarama
// does, with answer(topic, attempt on that topic); nil answer holds every
// message on held for the test to answer.
type scriptedPublisher struct {
	answer func(topic string, attempt int) error
	held   chan *sink.Message
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
	if s.answer == nil {
		s.held <- m
		return nil
	}
	go m.Done(s.answer(m.Topic, n))
	return nil
}

func (s *scriptedPublisher) snapshot() ([]sink.Message, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tries := map[string]int{}
	for k, v := range s.tries {
		tries[k] = v
	}
	return append([]sink.Message(nil), s.sent...), tries
}

// fakeMarker records row marks and reports each on marked.
type fakeMarker struct {
	marked chan string // "dead 42" or "failed 42 attempts=3"
}

func (f *fakeMarker) MarkDead(_ context.Context, id int64, attempts int, _ string) (bool, error) {
	f.marked <- "dead " + itoa(id) + " attempts=" + itoa(int64(attempts))
	return true, nil
}

func (f *fakeMarker) MarkFailed(_ context.Context, id int64, attempts int, _ string) error {
	f.marked <- "failed " + itoa(id) + " attempts=" + itoa(int64(attempts))
	return nil
}

func itoa(n int64) string { return string(pglogrepl.LSN(n).String()[2:]) } // short, unique enough for ids < 2^32

type harness struct {
	t      *testing.T
	p      *Pipeline
	pub    *scriptedPublisher
	marker *fakeMarker
	ctx    context.Context
	sawRel bool
}

func newHarness(t *testing.T, policy Policy, answer func(string, int) error) *harness {
	t.Helper()
	pub := &scriptedPublisher{answer: answer, held: make(chan *sink.Message, 100), tries: map[string]int{}}
	marker := &fakeMarker{marked: make(chan string, 10)}
	tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPipeline(PipelineConfig{Table: "public.outbox", Template: tmpl, MaxTopics: 100, Policy: policy,
		Limits: checkpoint.Limits{MaxEvents: 10, MaxBytes: 1 << 20}}, pub, marker, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return &harness{t: t, p: p, pub: pub, marker: marker, ctx: ctx}
}

// txn hands one transaction of outbox rows to Handle: committed at commit,
// ending at end, each insert at commit-10+i.
func (h *harness) txn(commit, end pglogrepl.LSN, rows ...[]pg.Col) error {
	msgs := [][]byte{pg.Begin(commit, 7)}
	if !h.sawRel {
		msgs = append([][]byte{pg.OutboxRelation()}, msgs...)
		h.sawRel = true
	}
	for _, r := range rows {
		msgs = append(msgs, pg.Insert(pg.OutboxID, r...))
	}
	msgs = append(msgs, pg.Commit(commit, end))
	for i, m := range msgs {
		if err := h.p.Handle(h.ctx, commit-pglogrepl.LSN(len(msgs))+pglogrepl.LSN(i), m); err != nil {
			return err
		}
	}
	return nil
}

func order(id, aggID string) []pg.Col {
	return pg.Row(id, "order", aggID, "order.paid", `{"a":1}`, pg.Text(`{"trace":"t-`+id+`"}`))
}

// waitFlushed waits, on the pipeline's own signal, until the watermark
// reaches lsn.
func (h *harness) waitFlushed(lsn pglogrepl.LSN) {
	h.t.Helper()
	deadline := time.After(10 * time.Second)
	for h.p.Flushed() < lsn {
		select {
		case <-h.p.Advanced():
		case <-deadline:
			h.t.Fatalf("watermark %s never reached %s", h.p.Flushed(), lsn)
		}
	}
}

func (h *harness) waitMark() string {
	h.t.Helper()
	select {
	case m := <-h.marker.marked:
		return m
	case <-time.After(10 * time.Second):
		h.t.Fatal("no row mark")
		return ""
	}
}

func (h *harness) held() *sink.Message {
	h.t.Helper()
	select {
	case m := <-h.pub.held:
		return m
	case <-time.After(10 * time.Second):
		h.t.Fatal("nothing published")
		return nil
	}
}

var fastPolicy = Policy{Topic: testDLQ, MaxAttempts: 3, Backoff: time.Millisecond, TransientMax: 5 * time.Millisecond}

func TestPoisonAndRetryPolicy(t *testing.T) {
	always := func(err error) func(string, int) error {
		return func(tp string, _ int) error {
			if tp == testTopic {
				return err
			}
			return nil
		}
	}
	tests := []struct {
		name     string
		halt     bool
		answer   func(topic string, attempt int) error
		mark     string // the row mark that ends the case, "" = none: the event is acked
		dlq      string // dlq.reason of the dead letter, "" = none sent
		noValue  bool   // the dead letter omits the payload
		attempts int    // publish attempts on the event's own topic
	}{
		{name: "transient errors are retried until the broker takes the event",
			answer: func(tp string, n int) error {
				if n <= 6 {
					return []error{sarama.ErrOutOfBrokers, sarama.ErrNotEnoughReplicas, sarama.ErrRequestTimedOut}[n%3]
				}
				return nil
			}, attempts: 7},
		{name: "too large: dead letter without payload after max attempts",
			answer: always(sarama.ErrMessageSizeTooLarge), mark: "dead 2A attempts=3", dlq: "message_too_large", noValue: true, attempts: 3},
		{name: "broker rejects the record: dead letter with payload",
			answer: always(sarama.ErrInvalidRecord), mark: "dead 2A attempts=3", dlq: "broker_rejected", attempts: 3},
		{name: "poison that heals within the attempts is published",
			answer: func(tp string, n int) error {
				if n < 3 {
					return sarama.ErrInvalidRecord
				}
				return nil
			}, attempts: 3},
		{name: "dead-letter write fails: halt, slot kept",
			answer: func(string, int) error { return sarama.ErrInvalidTopic }, mark: "failed 2A attempts=4", dlq: "invalid_topic", attempts: 3},
		{name: "dead-letter write fails transiently: retried, then acked",
			answer: func(tp string, n int) error {
				if tp == testTopic {
					return sarama.ErrInvalidRecord
				}
				if n < 4 {
					return sarama.ErrLeaderNotAvailable
				}
				return nil
			}, mark: "dead 2A attempts=3", dlq: "broker_rejected", attempts: 3},
		{name: "authorization refused: halt at once, never dead-letter",
			answer: always(sarama.ErrTopicAuthorizationFailed), mark: "failed 2A attempts=1", attempts: 1},
		{name: "on_poison halt: halt after max attempts",
			halt: true, answer: always(sarama.ErrInvalidRecord), mark: "failed 2A attempts=3", attempts: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := fastPolicy
			policy.Halt = tt.halt
			h := newHarness(t, policy, tt.answer)
			if err := h.txn(100, 110, order("42", "order-1")); err != nil {
				t.Fatal(err)
			}
			halted := strings.HasPrefix(tt.mark, "failed")
			if tt.mark != "" {
				if got := h.waitMark(); got != tt.mark {
					t.Fatalf("row mark %q, want %q", got, tt.mark)
				}
			}
			if !halted {
				h.waitFlushed(110)
			}
			if got := h.p.Halted() != nil; got != halted {
				t.Errorf("halted=%v (%v), want %v", got, h.p.Halted(), halted)
			}
			if halted && h.p.Flushed() >= 110 {
				t.Errorf("watermark %s passed the halted event", h.p.Flushed())
			}
			if n := h.p.retries.len(); n != 0 {
				t.Errorf("%d retries still queued at the end", n)
			}
			sent, tries := h.pub.snapshot()
			if tries[testTopic] != tt.attempts {
				t.Errorf("%d attempts on %s, want %d", tries[testTopic], testTopic, tt.attempts)
			}
			var letter *sink.Message
			for i := range sent {
				if sent[i].Topic == testDLQ {
					letter = &sent[i]
				}
			}
			if (letter != nil) != (tt.dlq != "") {
				t.Fatalf("dead letter sent: %v, want %v", letter != nil, tt.dlq != "")
			}
			if letter == nil {
				return
			}
			hd := map[string]string{}
			for _, x := range letter.Headers {
				hd[string(x.Key)] = string(x.Value)
			}
			want := map[string]string{"event_id": "42", "trace": "t-42", "dlq.original_topic": testTopic, "dlq.reason": tt.dlq,
				"dlq.attempts": "3", "dlq.event_id": "42", "dlq.table": "public.outbox"}
			for k, v := range want {
				if hd[k] != v {
					t.Errorf("dead letter header %s = %q, want %q (all %v)", k, hd[k], v, hd)
				}
			}
			if !strings.Contains(hd["dlq.error"], "publish to topic "+testTopic) {
				t.Errorf("dlq.error = %q, want the publish error", hd["dlq.error"])
			}
			if string(letter.Key) != "order-1" {
				t.Errorf("dead letter key %q, want the event's key", letter.Key)
			}
			if omitted := letter.Value == nil && hd["dlq.payload_omitted"] == "true"; omitted != tt.noValue {
				t.Errorf("payload omitted=%v (value %q), want %v", omitted, letter.Value, tt.noValue)
			}
		})
	}
}

// Rows that cannot become an event never reach their topic: dead-lettered
// at once under dlq, a halt before anything of the transaction is
// published under halt.
func TestBadRow(t *testing.T) {
	bad := pg.Row("43", "order", "o-2", "order.paid", `{}`, pg.Null)
	bad[2] = pg.Null // aggregate_id IS NULL
	for _, halt := range []bool{false, true} {
		t.Run(map[bool]string{false: "dlq", true: "halt"}[halt], func(t *testing.T) {
			policy := fastPolicy
			policy.Halt = halt
			h := newHarness(t, policy, func(string, int) error { return nil })
			ctx, cancel := context.WithCancel(h.ctx)
			h.ctx = ctx
			errc := make(chan error, 1)
			go func() { errc <- h.txn(100, 110, bad, order("44", "o-3")) }()
			if halt {
				if got := h.waitMark(); got != "failed 2B attempts=1" {
					t.Fatalf("row mark %q", got)
				}
				cancel() // Handle blocks once halted; only the end of its ctx frees it
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("Handle = %v, want context.Canceled", err)
				}
				if sent, _ := h.pub.snapshot(); len(sent) != 0 {
					t.Errorf("published %d records of a halted transaction", len(sent))
				}
				h.p.AdvanceIdle(1000)
				if h.p.Flushed() != 0 {
					t.Errorf("idle advance moved a halted pipeline to %s", h.p.Flushed())
				}
				return
			}
			defer cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if got := h.waitMark(); got != "dead 2B attempts=1" {
				t.Fatalf("row mark %q", got)
			}
			h.waitFlushed(110)
			sent, tries := h.pub.snapshot()
			if tries[testDLQ] != 1 || tries[testTopic] != 1 || len(sent) != 2 {
				t.Fatalf("sent %v, want one dead letter and one event", tries)
			}
			for _, m := range sent {
				hd := map[string]string{}
				for _, x := range m.Headers {
					hd[string(x.Key)] = string(x.Value)
				}
				if m.Topic == testDLQ && (hd["dlq.event_id"] != "43" || hd["dlq.reason"] != "bad_row") {
					t.Errorf("dead letter headers %v, want dlq.event_id 43, dlq.reason bad_row", hd)
				}
			}
		})
	}
}

// The watermark passes a transaction only once each of its events and every
// earlier transaction's are acked, whatever order the acks come in; failed
// events are resent in the order they failed.
func TestAckOrderAndResendOrder(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(100, 110, order("1", "a"), order("2", "a")); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(200, 210, order("3", "a")); err != nil {
		t.Fatal(err)
	}
	m1, m2, m3 := h.held(), h.held(), h.held()
	m3.Done(nil)
	m2.Done(sarama.ErrNotEnoughReplicas)
	m1.Done(sarama.ErrNotEnoughReplicas)
	if h.p.Flushed() != 0 {
		t.Fatalf("watermark %s moved past unacked events", h.p.Flushed())
	}
	r2, r1 := h.held(), h.held() // resent in the order they failed
	if id := func(m *sink.Message) string { return string(m.Headers[0].Value) }; id(r2) != "2" || id(r1) != "1" {
		t.Fatalf("resent %s then %s, want 2 then 1", id(r2), id(r1))
	}
	r2.Done(nil)
	if h.p.Flushed() != 0 {
		t.Fatalf("watermark %s passed event 1", h.p.Flushed())
	}
	r1.Done(nil)
	h.waitFlushed(210)
	if e, _ := h.p.InFlight(); e != 0 {
		t.Errorf("%d events in flight after every ack", e)
	}
	// Idle: nothing in flight and no open transaction, so a keepalive moves it.
	h.p.AdvanceIdle(500)
	if h.p.Flushed() != 500 {
		t.Errorf("idle advance: watermark %s, want 0/1F4", h.p.Flushed())
	}
}

// Drain waits for in-flight acks and gives up when its ctx ends; an open
// transaction keeps an idle keepalive from moving the watermark.
func TestDrainAndIdle(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.p.Drain(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with an unacked event and an ended ctx = %v", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- h.p.Drain(context.Background()) }()
	m.Done(nil)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if h.p.Flushed() != 110 {
		t.Fatalf("watermark %s after drain", h.p.Flushed())
	}
	// A new session resends the relation; a begun transaction blocks idle advance.
	h.sawRel = false
	if err := h.p.Handle(h.ctx, 190, pg.OutboxRelation()); err != nil {
		t.Fatal(err)
	}
	if err := h.p.Handle(h.ctx, 195, pg.Begin(300, 8)); err != nil {
		t.Fatal(err)
	}
	h.p.AdvanceIdle(250)
	if h.p.Flushed() != 110 {
		t.Errorf("idle advance inside a transaction: watermark %s", h.p.Flushed())
	}
}

func TestHeaders(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(0x16B3F28, 0x16B3F40, order("42", "o-1")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	want := [][2]string{{"event_id", "42"}, {"event_type", "order.paid"}, {"aggregate_type", "order"},
		{"aggregate_id", "o-1"}, {"pg_lsn", "0/16B3F28"}, {"trace", "t-42"}}
	if len(m.Headers) != len(want) || string(m.Key) != "o-1" || m.Topic != testTopic {
		t.Fatalf("record %s key %q headers %v", m.Topic, m.Key, m.Headers)
	}
	for i, w := range want {
		if string(m.Headers[i].Key) != w[0] || string(m.Headers[i].Value) != w[1] {
			t.Errorf("header %d = %s: %s, want %s: %s", i, m.Headers[i].Key, m.Headers[i].Value, w[0], w[1])
		}
	}
	// Values share one buffer: appending to one must not overwrite the next.
	_ = append(m.Headers[1].Value, "xxxxxxxx"...)
	if string(m.Headers[2].Value) != "order" {
		t.Errorf("aggregate_type overwritten: %q", m.Headers[2].Value)
	}
	m.Done(nil)
}
