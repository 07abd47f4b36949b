package relay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/replication"
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
	// maxBytes, when set, refuses larger records as sarama does
	// (kafka.max_message_bytes), with no answer asked.
	maxBytes int
	// acked is what the pipeline gave OnAcked: a test may ack a held
	// batch through it, as the direct engine does.
	acked func(msgs []*sink.Message, at time.Time)
}

func (s *scriptedPublisher) OnAcked(f func([]*sink.Message, time.Time)) { s.acked = f }

func (s *scriptedPublisher) Publish(_ context.Context, m *sink.Message) error {
	m.Partition = 0 // one partition: every test event shares it
	if s.maxBytes > 0 && deadletter.RecordSize(m.Key, m.Value, m.Headers) > s.maxBytes {
		// sarama's own check, before anything is sent
		s.mu.Lock()
		s.tries[m.Topic]++
		s.mu.Unlock()
		go m.Done(sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes"))
		return nil
	}
	s.mu.Lock()
	s.tries[m.Topic]++
	n := s.tries[m.Topic]
	s.sent = append(s.sent, written(m))
	s.mu.Unlock()
	if s.answer == nil {
		s.held <- m
		return nil
	}
	go m.Done(s.answer(m.Topic, n))
	return nil
}

// written is what a broker keeps of m: a copy of its bytes. The pipeline
// reuses a transaction's Messages and headers once all of them are acked,
// so a test that looks at records after their ack needs the copy.
func written(m *sink.Message) sink.Message {
	c := *m
	c.Key, c.Value = bytes.Clone(m.Key), bytes.Clone(m.Value)
	c.Headers = make([]sink.Header, len(m.Headers))
	for i, h := range m.Headers {
		c.Headers[i] = sink.Header{Key: bytes.Clone(h.Key), Value: bytes.Clone(h.Value)}
	}
	return c
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
	t        *testing.T
	p        *Pipeline
	pub      *scriptedPublisher
	marker   *fakeMarker
	ctx      context.Context
	in       chan walReq
	restarts atomic.Int32
}

func newHarness(t *testing.T, policy record.Policy, answer func(string, int) error) *harness {
	t.Helper()
	marker := &fakeMarker{marked: make(chan string, 10)}
	h := newHarnessWith(t, policy, answer, marker)
	h.marker = marker
	return h
}

// newHarnessWith is newHarness with the row marker given.
// configure, when given, changes the pipeline's config before NewPipeline.
func newHarnessWith(t *testing.T, policy record.Policy, answer func(string, int) error, marker RowMarker, configure ...func(*PipelineConfig)) *harness {
	t.Helper()
	pub := &scriptedPublisher{answer: answer, held: make(chan *sink.Message, 100), tries: map[string]int{}}
	tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PipelineConfig{Table: "public.outbox", Template: tmpl, MaxTopics: 100, Policy: policy,
		Limits: checkpoint.Limits{MaxEvents: 10, MaxBytes: 1 << 20}}
	for _, f := range configure {
		f(&cfg)
	}
	p, err := NewPipeline(cfg, pub, marker, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, p: p, pub: pub, ctx: ctx, in: make(chan walReq)}
	ran, streamed := make(chan error, 1), make(chan struct{})
	go func() { ran <- p.Run(ctx) }()
	go func() {
		defer close(streamed)
		h.stream(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-streamed
		if err := <-ran; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return h
}

// txn hands one transaction of outbox rows to Handle through the stream
// emulator: committed at commit, ending at end, each insert at commit-10+i.
// It returns what Handle returned.
func (h *harness) txn(commit, end pglogrepl.LSN, rows ...[]pg.Col) error {
	return h.txnCtx(h.ctx, commit, end, rows...)
}

func (h *harness) txnCtx(ctx context.Context, commit, end pglogrepl.LSN, rows ...[]pg.Col) error {
	t := walTxn{commit: commit, end: end, msgs: [][]byte{pg.Begin(commit, 7)}}
	for _, r := range rows {
		t.msgs = append(t.msgs, pg.Insert(pg.OutboxID, r...))
	}
	t.msgs = append(t.msgs, pg.Commit(commit, end))
	done := make(chan error, 1)
	h.in <- walReq{ctx, t, done}
	return <-done
}

type walTxn struct {
	commit, end pglogrepl.LSN
	msgs        [][]byte
	at          []pglogrepl.LSN // the walStart of each of msgs; nil: commit-len(msgs)+i
}

type walReq struct {
	ctx  context.Context
	txn  walTxn
	done chan error
}

// stream emulates replication.Stream for the pipeline: the one goroutine
// that calls Handle, and, when the pipeline asks for a restart, Drain and a
// resend of every transaction after the watermark, as the server does.
func (h *harness) stream(ctx context.Context) {
	var log []walTxn
	sawRel := false
	feed := func(ctx context.Context, t walTxn) error {
		for i, m := range t.msgs {
			if !sawRel {
				if err := h.p.Handle(ctx, t.commit-100, pg.OutboxRelation()); err != nil {
					return err
				}
				sawRel = true
			}
			at := t.commit - pglogrepl.LSN(len(t.msgs)) + pglogrepl.LSN(i)
			if t.at != nil {
				at = t.at[i]
			}
			if err := h.p.Handle(ctx, at, m); err != nil {
				if errors.Is(err, replication.ErrRestart) {
					return nil // the rest comes again after the restart
				}
				return err
			}
		}
		return nil
	}
	tick := time.NewTicker(time.Millisecond) // the real loop checks once per message or status interval
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-h.in:
			log = append(log, r.txn)
			r.done <- feed(r.ctx, r.txn)
		case <-tick.C:
			if !h.p.Restarting() {
				continue
			}
			if err := h.p.Drain(ctx); err != nil {
				return
			}
			h.restarts.Add(1)
			sawRel = false
			for _, t := range log {
				if t.end > h.p.Flushed() {
					if err := feed(ctx, t); err != nil {
						return
					}
				}
			}
		}
	}
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

// waitHalted waits for the pipeline to halt; Halted has no signal, so it
// is checked on a ticker.
func (h *harness) waitHalted(why string) {
	h.t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for h.p.Halted() == nil {
		select {
		case <-tick.C:
		case <-deadline:
			h.t.Fatal(why)
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

var fastPolicy = record.Policy{Topic: testDLQ, MaxAttempts: 3, Backoff: time.Millisecond, TransientMax: 5 * time.Millisecond}

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
			if tt.noValue { // too large: the row's headers stay in the row too
				delete(want, "trace")
				want["dlq.headers_omitted"] = "true"
			}
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
	if !marks["dead 1 attempts=3"] || !marks["dead 2 attempts=3"] {
		t.Fatalf("row marks %v, want both rows dead-lettered after 3 attempts", marks)
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
func TestHeartbeatThroughPipeline(t *testing.T) {
	const prefix = "outbox-relay/outbox_relay"
	h := newHarnessWith(t, fastPolicy, nil, &fakeMarker{marked: make(chan string, 10)},
		func(c *PipelineConfig) { c.HeartbeatPrefix = prefix })
	h.pub.answer = nil
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	sent := time.Now().Add(-10 * time.Second)
	h.p.Emitted(0x160, sent) // the record ends at 0x160, starts at 150
	if err := h.p.Handle(h.ctx, 150, pg.Message(false, 150, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatal(err)
	}
	if n := h.p.decoded.Load(); n != 1 {
		t.Errorf("events decoded = %d after a heartbeat, want 1", n)
	}
	if e, _ := h.p.InFlight(); e != 1 {
		t.Errorf("in flight = %d after a heartbeat, want 1", e)
	}
	if lag := h.p.Lag(); lag < 10*time.Second {
		t.Errorf("lag = %s with an event before a 10s old heartbeat unacked, want >= 10s", lag)
	}
	m.Done(nil)
	// The ack of the only event before the heartbeat moves the watermark
	// to the heartbeat, not just to the event's transaction.
	h.waitFlushed(150)
	if lag := h.p.Lag(); lag != 0 {
		t.Errorf("lag = %s once every event before the heartbeat is acked, want 0", lag)
	}
	// The server resends it after a reconnect: ignored.
	if err := h.p.Handle(h.ctx, 150, pg.Message(false, 150, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatalf("a resent heartbeat: %v", err)
	}

	// Idle: the heartbeat moves the watermark to its record by itself.
	sent = time.Now()
	h.p.Emitted(0x260, sent)
	if err := h.p.Handle(h.ctx, 0x200, pg.Message(false, 0x200, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatal(err)
	}
	if got := h.p.Flushed(); got != 0x200 {
		t.Errorf("watermark %s after an idle heartbeat at 0/200, want 0/200", got)
	}
	if lag := h.p.Lag(); lag != 0 {
		t.Errorf("lag = %s after an idle heartbeat passed, want 0", lag)
	}
	// Another relay's heartbeat (another slot) is ignored.
	if err := h.p.Handle(h.ctx, 0x300, pg.Message(false, 0x300, "outbox-relay/other", "1")); err != nil {
		t.Fatal(err)
	}
	if got := h.p.Flushed(); got != 0x200 {
		t.Errorf("watermark %s after another slot's heartbeat, want 0/200", got)
	}
}

// A streamed transaction (protocol 2) goes through the pipeline only at its
// Stream Commit, in order, under the in-flight limits, with the commit LSN
// as its position; a rolled-back subtransaction's rows never go out, and
// nothing moves the watermark before the commit's end LSN is acked.
func TestStreamedTransactionThroughPipeline(t *testing.T) {
	h := newHarness(t, fastPolicy, func(string, int) error { return nil })
	feed := func(lsn pglogrepl.LSN, msg []byte) {
		t.Helper()
		if err := h.p.Handle(h.ctx, lsn, msg); err != nil {
			t.Fatalf("Handle at %s: %v", lsn, err)
		}
	}
	feed(1, pg.StreamStart(100, true))
	feed(2, pg.Streamed(100, pg.OutboxRelation()))
	lsn := pglogrepl.LSN(10)
	for i := 1; i <= 30; i++ {
		xid := uint32(100)
		if i > 25 {
			xid = 101 // a savepoint, rolled back below
		}
		feed(lsn, pg.Streamed(xid, pg.Insert(pg.OutboxID, order(strconv.Itoa(i), "a")...)))
		lsn++
	}
	feed(lsn, pg.StreamStop())
	feed(lsn+1, pg.StreamAbort(100, 101))
	if sent, _ := h.pub.snapshot(); len(sent) != 0 {
		t.Fatalf("%d events published before the Stream Commit", len(sent))
	}
	h.p.AdvanceIdle(lsn + 2) // between blocks, nothing in flight: the server resends the open transaction whole
	feed(lsn+3, pg.StreamCommit(100, 500, 510))
	h.waitFlushed(510)
	sent, _ := h.pub.snapshot()
	if len(sent) != 25 {
		t.Fatalf("%d events published, want 25 (the 5 of the rolled-back savepoint dropped)", len(sent))
	}
	for i, m := range sent {
		var id, lsnHdr string
		for _, hd := range m.Headers {
			switch string(hd.Key) {
			case "event_id":
				id = string(hd.Value)
			case "pg_lsn":
				lsnHdr = string(hd.Value)
			}
		}
		if id != strconv.Itoa(i+1) || lsnHdr != pglogrepl.LSN(500).String() {
			t.Fatalf("event %d: id %s pg_lsn %s, want id %d at the commit LSN 0/1F4", i, id, lsnHdr, i+1)
		}
	}
	if c := h.p.streamed.Load(); c != 1 {
		t.Fatalf("streamed transactions counted %d, want 1", c)
	}
}
