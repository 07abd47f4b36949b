package relay

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/deadletter"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

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
		mark     string   // the row mark that ends the case, "" = none: the event is acked
		dlq      string   // dlq.reason of the dead letter, "" = none sent
		noValue  bool     // the dead letter omits the payload
		attempts int      // publish attempts on the event's own topic
		haltErr  string   // the halt's error says this
		refused  bool     // a halt for the relay's rights, not the event
		row      []pg.Col // the event; order("42", "order-1") if nil
		noError  bool     // the dead letter's dlq.error was dropped (Letter.Shrink)
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
			answer: always(sarama.ErrInvalidRecord), mark: "dead 2A attempts=3", dlq: "invalid_record", attempts: 3},
		{name: "broker rejects an unknown way: dead letter after max attempts",
			answer: always(sarama.ErrPolicyViolation), mark: "dead 2A attempts=3", dlq: "broker_rejected", attempts: 3},
		// Issue 36: an answer that cannot change on retry applies on_poison
		// at the first answer: no attempt loop, no rewind.
		{name: "too large alone in its batch: dead letter at the first answer",
			answer: always(&sink.SoleError{Err: sarama.ErrMessageSizeTooLarge}), mark: "dead 2A attempts=1", dlq: "message_too_large", noValue: true, attempts: 1},
		{name: "record list too large alone: dead letter at the first answer",
			answer: always(&sink.SoleError{Err: sarama.ErrMessageSetSizeTooLarge}), mark: "dead 2A attempts=1", dlq: "message_too_large", noValue: true, attempts: 1},
		{name: "invalid record alone: dead letter at the first answer",
			answer: always(&sink.SoleError{Err: sarama.ErrInvalidRecord}), mark: "dead 2A attempts=1", dlq: "invalid_record", attempts: 1},
		{name: "sarama's local size refusal: dead letter at the first answer",
			answer: always(sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2000 > 1024")),
			mark:   "dead 2A attempts=1", dlq: "message_too_large", noValue: true, attempts: 1},
		{name: "no write access to the topic: dead letter at the first answer",
			answer: always(sarama.ErrTopicAuthorizationFailed), mark: "dead 2A attempts=1", dlq: "authorization", attempts: 1},
		{name: "too large alone under on_poison halt: halt at the first answer",
			halt: true, answer: always(&sink.SoleError{Err: sarama.ErrMessageSizeTooLarge}), mark: "failed 2A attempts=1", attempts: 1,
			haltErr: "too large"},
		{name: "too large in a batch of several: attempts as before",
			answer: always(sarama.ErrMessageSizeTooLarge), mark: "dead 2A attempts=3", dlq: "message_too_large", noValue: true, attempts: 3},
		{name: "dead letter too large for its topic: cut down and sent again",
			answer: func(tp string, n int) error {
				if tp == testTopic {
					return &sink.SoleError{Err: sarama.ErrInvalidRecord}
				}
				if n == 1 {
					return &sink.SoleError{Err: sarama.ErrMessageSizeTooLarge}
				}
				return nil
			}, mark: "dead 2A attempts=1", dlq: "invalid_record", noValue: true, attempts: 1,
			row: pg.Row("42", "order", "order-1", "order.paid", `{"a":"`+strings.Repeat("x", 3000)+`"}`, pg.Text(`{"trace":"t-42"}`))},
		{name: "dead letter refused for size in a batch: sent again as it is once",
			answer: func(tp string, n int) error {
				if tp == testTopic {
					return &sink.SoleError{Err: sarama.ErrInvalidRecord}
				}
				if n == 1 {
					return sarama.ErrMessageSizeTooLarge
				}
				return nil
			}, mark: "dead 2A attempts=1", dlq: "invalid_record", attempts: 1},
		{name: "even the least dead letter too large: halt naming the topic's limit",
			answer: func(tp string, n int) error {
				if tp == testTopic {
					return &sink.SoleError{Err: sarama.ErrInvalidRecord}
				}
				return &sink.SoleError{Err: sarama.ErrMessageSizeTooLarge}
			}, mark: "failed 2A attempts=4", dlq: "invalid_record", noValue: true, noError: true, attempts: 1,
			haltErr: "raise max.message.bytes of topic " + testDLQ, row: pg.Row("42", "order", "order-1", "order.paid", `{"a":"`+strings.Repeat("x", 3000)+`"}`, pg.Text(`{"trace":"t-42"}`))},
		{name: "poison that heals within the attempts is published",
			answer: func(tp string, n int) error {
				if n < 3 {
					return sarama.ErrInvalidRecord
				}
				return nil
			}, attempts: 3},
		{name: "dead-letter write fails: halt, slot kept",
			answer: func(string, int) error { return sarama.ErrInvalidTopic }, mark: "failed 2A attempts=2", dlq: "invalid_topic", attempts: 1},
		{name: "dead-letter write fails transiently: retried, then acked",
			answer: func(tp string, n int) error {
				if tp == testTopic {
					return sarama.ErrInvalidRecord
				}
				if n < 4 {
					return sarama.ErrLeaderNotAvailable
				}
				return nil
			}, mark: "dead 2A attempts=3", dlq: "invalid_record", attempts: 3},
		{name: "cluster authorization refused: halt at once, never dead-letter",
			answer: always(sarama.ErrClusterAuthorizationFailed), mark: "failed 2A attempts=1", attempts: 1, haltErr: "IdempotentWrite", refused: true},
		{name: "transactional id authorization refused: halt at once",
			answer: always(sarama.ErrTransactionalIDAuthorizationFailed), mark: "failed 2A attempts=1", attempts: 1, haltErr: "transactional id", refused: true},
		{name: "no write access under on_poison halt: halt at once naming the topic",
			halt: true, answer: always(sarama.ErrTopicAuthorizationFailed), mark: "failed 2A attempts=1", attempts: 1, haltErr: "Write on topic " + testTopic},
		{name: "on_poison halt: halt after max attempts",
			halt: true, answer: always(sarama.ErrInvalidRecord), mark: "failed 2A attempts=3", attempts: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := fastPolicy
			policy.Halt = tt.halt
			h := newHarness(t, policy, tt.answer)
			row := tt.row
			if row == nil {
				row = order("42", "order-1")
			}
			if err := h.txn(100, 110, row); err != nil {
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
			if err := h.p.Halted(); tt.haltErr != "" && (err == nil || !strings.Contains(err.Error(), tt.haltErr)) {
				t.Errorf("halt error %v, want it to say %q", err, tt.haltErr)
			}
			if halted {
				// The headline says where to look: the event, or the relay's own rights.
				want, not := "poison event", "credentials or rights"
				if tt.refused {
					want, not = not, want
				}
				if logs := h.logs.String(); !strings.Contains(logs, "HALTED: ") || !strings.Contains(logs, want) || strings.Contains(logs, not) {
					t.Errorf("halt logged without %q (or with %q): %s", want, not, logs)
				}
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
				"dlq.attempts": strconv.Itoa(tt.attempts), "dlq.event_id": "42", "dlq.table": "public.outbox"}
			if tt.noValue { // too large: the row's headers stay in the row too
				delete(want, "trace")
				want["dlq.headers_omitted"] = "true"
			}
			for k, v := range want {
				if hd[k] != v {
					t.Errorf("dead letter header %s = %q, want %q (all %v)", k, hd[k], v, hd)
				}
			}
			if tt.noError {
				if hd["dlq.error"] != "" {
					t.Errorf("dlq.error = %q, want it dropped", hd["dlq.error"])
				}
			} else if !strings.Contains(hd["dlq.error"], "publish to topic "+testTopic) {
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
			errc := make(chan error, 1)
			go func() { errc <- h.txnCtx(ctx, 100, 110, bad, order("44", "o-3")) }()
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
// earlier transaction's are acked, whatever order the acks come in. An
// error the producer returns never lets a later event of the partition go
// out before the failed one: nothing more is handed over, and once every
// event in flight has settled the pipeline restarts from the watermark and
// publishes the failed event and everything after it again, in order. A
// later event the producer had already written counts as a reorder.
func TestReturnedErrorRewindsInOrder(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(100, 110, order("1", "a"), order("2", "a")); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(200, 210, order("3", "a")); err != nil {
		t.Fatal(err)
	}
	id := func(m *sink.Message) string { return string(m.Headers[0].Value) }
	m1, m2, m3 := h.held(), h.held(), h.held()
	m3.Done(nil) // event 3 is written before event 1 fails: a reorder
	m1.Done(sarama.ErrOutOfOrderSequenceNumber)
	if h.p.Flushed() != 0 {
		t.Fatalf("watermark %s moved past unacked events", h.p.Flushed())
	}
	if got := h.p.order.reorders.Load(); got != 1 {
		t.Errorf("reorders = %d, want 1 (event 3 written before failed event 1)", got)
	}
	// A transaction that arrives now is not published before event 1.
	if err := h.txn(300, 310, order("4", "a")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-h.pub.held:
		t.Fatalf("event %s published while event 1 waits to be resent", id(m))
	default:
	}
	m2.Done(nil) // the last event in flight settles: the rewind can go
	var resent []string
	for range 4 {
		m := h.held()
		resent = append(resent, id(m))
		m.Done(nil)
	}
	if strings.Join(resent, ",") != "1,2,3,4" {
		t.Fatalf("after the error published %v, want 1,2,3,4: the failed event first, then the rest in commit order", resent)
	}
	h.waitFlushed(310)
	if h.restarts.Load() != 1 {
		t.Errorf("%d restarts, want 1", h.restarts.Load())
	}
	if got := h.p.order.reorders.Load(); got != 1 {
		t.Errorf("reorders = %d after the resend, want still 1", got)
	}
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
func TestHeaders(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(0x16B3F28, 0x16B3F40, order("42", "o-1")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	want := [][2]string{{"event_id", "42"}, {"event_type", "order.paid"}, {"aggregate_type", "order"},
		{"aggregate_id", "o-1"}, {"pg_lsn", "0/16B3F28"}, {"outbox_id", "42"}, {"trace", "t-42"}}
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

// rejectingMarker fails every MarkDead with deadErr (nil after fails
// failures) and records MarkFailed on failed.
type rejectingMarker struct {
	deadErr error
	fails   int
	mu      sync.Mutex
	tries   int
	failed  chan string
}

func (r *rejectingMarker) MarkDead(_ context.Context, id int64, _ int, _ string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries++
	if r.fails < 0 || r.tries <= r.fails {
		return false, r.deadErr
	}
	return true, nil
}

func (r *rejectingMarker) MarkFailed(_ context.Context, id int64, _ int, lastErr string) error {
	r.failed <- lastErr
	return nil
}

// A dead-letter row mark that the database rejects for good (no UPDATE
// privilege, a trigger, a check) halts the pipeline with the reason instead
// of being retried silently for ever; a connection error is waited out.
func TestMarkFailureHalts(t *testing.T) {
	bad := pg.Row("43", "order", "o-2", "order.paid", `{}`, pg.Null)
	bad[2] = pg.Null // aggregate_id IS NULL: dead-lettered as a bad row
	tests := []struct {
		name     string
		err      error
		fails    int // -1: for ever
		wantHalt []string
	}{
		{"insufficient privilege", &pgconn.PgError{Code: "42501", Message: "permission denied for table outbox"}, -1,
			[]string{"public.outbox", "id=43", "permission denied", "outbox.dlq"}},
		{"trigger raises", &pgconn.PgError{Code: "P0001", Message: "dead letters are not allowed here"}, -1,
			[]string{"public.outbox", "id=43", "dead letters are not allowed here"}},
		{"check violation", &pgconn.PgError{Code: "23514", Message: "violates check constraint"}, -1,
			[]string{"id=43", "check constraint"}},
		{"connection refused, then fine", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			marker := &rejectingMarker{deadErr: tt.err, fails: tt.fails, failed: make(chan string, 10)}
			h := newHarnessWith(t, fastPolicy, func(string, int) error { return nil }, marker)
			p := h.p
			if err := h.txn(100, 110, bad); err != nil {
				t.Fatal(err)
			}
			if tt.wantHalt == nil {
				h.waitFlushed(110) // acked once the retried mark went through
				if err := p.Halted(); err != nil {
					t.Fatalf("halted on a transient mark error: %v", err)
				}
				return
			}
			h.waitHalted("the pipeline never halted: the mark is retried silently")
			for _, w := range tt.wantHalt {
				if !strings.Contains(p.Halted().Error(), w) {
					t.Errorf("halt reason %q lacks %q", p.Halted(), w)
				}
			}
			select {
			case got := <-marker.failed:
				if !strings.Contains(got, "id=43") {
					t.Errorf("the halt recorded on the row is %q", got)
				}
			case <-time.After(10 * time.Second):
				t.Error("the halt was not recorded on the row (MarkFailed)")
			}
			if p.Flushed() >= 110 {
				t.Errorf("watermark %s passed an event whose row mark failed", p.Flushed())
			}
		})
	}
}

// A row whose headers column holds a reserved key never reaches its topic:
// it is a bad row with reason reserved_header (dead-lettered under dlq, a
// halt under halt), and no record carries a second event_id.
func TestReservedHeaderRow(t *testing.T) {
	forged := pg.Row("42", "order", "o-1", "order.paid", `{}`, pg.Text(`{"event_id": "7", "aggregate_id": "victim"}`))
	for _, halt := range []bool{false, true} {
		t.Run(map[bool]string{false: "dlq", true: "halt"}[halt], func(t *testing.T) {
			policy := fastPolicy
			policy.Halt = halt
			h := newHarness(t, policy, func(string, int) error { return nil })
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			h.ctx = ctx
			errc := make(chan error, 1)
			go func() { errc <- h.txn(100, 110, forged, order("44", "o-1")) }()
			if halt {
				if got := h.waitMark(); got != "failed 2A attempts=1" {
					t.Fatalf("row mark %q, want failed 2A attempts=1", got)
				}
				cancel()
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("Handle = %v, want context.Canceled", err)
				}
				if sent, _ := h.pub.snapshot(); len(sent) != 0 {
					t.Errorf("published %d records of a halted transaction", len(sent))
				}
				if err := h.p.Halted(); err == nil || !strings.Contains(err.Error(), `"event_id"`) {
					t.Errorf("Halted() = %v, want the reserved key named", err)
				}
				return
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if got := h.waitMark(); got != "dead 2A attempts=1" {
				t.Fatalf("row mark %q, want dead 2A attempts=1", got)
			}
			h.waitFlushed(110)
			sent, tries := h.pub.snapshot()
			if tries[testDLQ] != 1 || tries[testTopic] != 1 || len(sent) != 2 {
				t.Fatalf("sent %v, want one dead letter and one event", tries)
			}
			for _, m := range sent {
				count, hd := map[string]int{}, map[string]string{}
				for _, x := range m.Headers {
					count[string(x.Key)]++
					hd[string(x.Key)] = string(x.Value)
				}
				if count["event_id"] != 1 || count["aggregate_id"] != 1 || hd["aggregate_id"] != "o-1" {
					t.Errorf("record on %s: headers %v; want one event_id and one aggregate_id o-1", m.Topic, m.Headers)
				}
				switch m.Topic {
				case testDLQ:
					if hd["event_id"] != "42" || hd["dlq.reason"] != "reserved_header" || !strings.Contains(hd["dlq.error"], `"event_id"`) {
						t.Errorf("dead letter headers %v, want event_id 42, dlq.reason reserved_header, the key in dlq.error", hd)
					}
				case testTopic:
					if hd["event_id"] != "44" {
						t.Errorf("event headers %v, want event_id 44", hd)
					}
				}
			}
		})
	}
}

// Under on_poison: dlq, an event too large for kafka.max_message_bytes
// because of its headers (2 MB) or its key (1.5 MB) is dead-lettered in a
// form that fits: the relay never halts, and the event after it is acked.
func TestOversizedEventsDeadLetterFits(t *testing.T) {
	const limit = 1_000_000
	bigKey := strings.Repeat("k", 1_500_000)
	policy := fastPolicy
	policy.MaxMessageBytes = limit
	h := newHarness(t, policy, func(string, int) error { return nil })
	h.pub.maxBytes = limit
	bigHeaders := pg.Row("1", "order", "o-1", "order.paid", `{}`, pg.Text(`{"blob": "`+strings.Repeat("h", 2<<20)+`"}`))
	bigAggID := pg.Row("2", "order", bigKey, "order.paid", `{}`, pg.Text(`{"trace": "t"}`))
	if err := h.txn(100, 110, bigHeaders, bigAggID, order("3", "o-1")); err != nil {
		t.Fatal(err)
	}
	marks := map[string]bool{h.waitMark(): true, h.waitMark(): true}
	// The producer's own size check is certain: dead-lettered at once.
	if !marks["dead 1 attempts=1"] || !marks["dead 2 attempts=1"] {
		t.Fatalf("row marks %v, want both rows dead-lettered at the first refusal", marks)
	}
	h.waitFlushed(110)
	if err := h.p.Halted(); err != nil {
		t.Fatalf("halted: %v", err)
	}
	sent, _ := h.pub.snapshot()
	letters := 0
	for _, m := range sent {
		if m.Topic != testDLQ {
			continue
		}
		letters++
		if n := deadletter.RecordSize(m.Key, m.Value, m.Headers); n > limit {
			t.Errorf("dead letter of %d bytes over the limit %d", n, limit)
		}
		hd := map[string]string{}
		for _, x := range m.Headers {
			hd[string(x.Key)] = string(x.Value)
		}
		if hd["dlq.reason"] != "message_too_large" || hd["dlq.payload_omitted"] != "true" || hd["dlq.headers_omitted"] != "true" {
			t.Errorf("dead letter of %s: %v", hd["dlq.event_id"], hd)
		}
		if hd["dlq.event_id"] == "2" && (hd["dlq.key_truncated"] != "1500000" || len(m.Key) > deadletter.MaxField) {
			t.Errorf("dead letter of the 1.5 MB key: key of %d bytes, dlq.key_truncated %q", len(m.Key), hd["dlq.key_truncated"])
		}
	}
	if letters != 2 {
		t.Errorf("%d dead letters sent, want 2", letters)
	}
}

// A rewind resends the transactions after the watermark, but an event whose
// dead letter is already in Kafka and whose row is marked is not
// dead-lettered a second time.
func TestRewindKeepsFinishedDeadLetters(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	bad := pg.Row("2", "order", "o-2", "order.paid", `{}`, pg.Text(`["not an object"]`))
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(200, 210, bad); err != nil {
		t.Fatal(err)
	}
	m1, letter := h.held(), h.held()
	if letter.Topic != testDLQ {
		t.Fatalf("second record went to %s, want the dead letter", letter.Topic)
	}
	letter.Done(nil)
	if got := h.waitMark(); got != "dead 2 attempts=1" {
		t.Fatalf("row mark %q", got)
	}
	m1.Done(sarama.ErrNotEnoughReplicas) // rewinds to 0: both transactions come again
	r1 := h.held()
	if id := string(r1.Headers[0].Value); id != "1" || r1.Topic != testTopic {
		t.Fatalf("resent %s to %s, want event 1", id, r1.Topic)
	}
	r1.Done(nil)
	h.waitFlushed(210)
	select {
	case m := <-h.pub.held:
		t.Errorf("a finished dead letter was sent again: %s to %s", m.Headers[0].Value, m.Topic)
	case m := <-h.marker.marked:
		t.Errorf("the row was marked again: %s", m)
	default:
	}
}

// A heartbeat read from the slot is no event: nothing is published,
// tracked or counted. It passes once everything before it is acked, and
// with nothing in flight it moves the watermark itself, so heartbeats never
// hold the slot back.
// A streamed transaction (protocol 2) goes through the pipeline only at its
// Stream Commit, in order, under the in-flight limits, with the commit LSN
// as its position; a rolled-back subtransaction's rows never go out, and
// nothing moves the watermark before the commit's end LSN is acked.
