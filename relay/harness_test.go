package relay

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/history"
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
	// partition, when set, picks each record's partition (0 otherwise).
	// Set it before the first transaction.
	partition func(m *sink.Message) int32
}

func (s *scriptedPublisher) OnAcked(f func([]*sink.Message, time.Time)) { s.acked = f }

// wireAcks gives a fake that acks in batches the pipeline's ack path, as
// the term does with its producer.
func wireAcks(p *Pipeline, pub any) {
	if a, ok := pub.(interface {
		OnAcked(func([]*sink.Message, time.Time))
	}); ok {
		a.OnAcked(p.Acked)
	}
}

func (s *scriptedPublisher) Publish(_ context.Context, m *sink.Message) error {
	m.Partition = 0 // one partition: every test event shares it, unless partition says otherwise
	if s.partition != nil {
		m.Partition = s.partition(m)
	}
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
	logs     *lockedBuffer // what the pipeline logged
}

// lockedBuffer is a log sink the pipeline's goroutines write while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
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
	logs := &lockedBuffer{}
	p, err := NewPipeline(cfg, atLeastOnce{pub}, marker, zerolog.New(logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	wireAcks(p, pub)
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, p: p, pub: pub, ctx: ctx, in: make(chan walReq), logs: logs}
	h.start(cancel, nil, nil)
	return h
}

// txn hands one transaction of outbox rows to Handle through the stream
// emulator: committed at commit, ending at end, each insert at commit-10+i.
// It returns what Handle returned.
// start runs the pipeline and feeds it (stream) until the test ends.
// delivery, when not nil, is a delivery's Run: it starts first, and the
// pipeline once ready is closed.
func (h *harness) start(cancel context.CancelFunc, delivery func(context.Context) error, ready <-chan struct{}) {
	ctx := h.ctx // a test may replace h.ctx for its own calls afterwards
	ran, delivered, streamed := make(chan error, 1), make(chan error, 1), make(chan struct{})
	if delivery != nil {
		go func() { delivered <- delivery(ctx) }()
		<-ready
	} else {
		delivered <- nil
	}
	// Before the goroutines: a test may call Handle on its own.
	if err := h.session(ctx); err != nil {
		h.t.Fatalf("Session = %v", err)
	}
	go func() { ran <- h.p.Run(ctx) }()
	go func() {
		defer close(streamed)
		h.stream(ctx)
	}()
	h.t.Cleanup(func() {
		cancel()
		<-streamed
		if err := <-ran; err != nil {
			h.t.Errorf("Run = %v", err)
		}
		if err := <-delivered; err != nil {
			h.t.Errorf("the delivery's Run = %v", err)
		}
	})
}

// session tells the pipeline its session's history, as replication.Stream
// does before any WAL of a session: the same one every time.
func (h *harness) session(ctx context.Context) error {
	return h.p.Session(ctx, history.Now{Mark: history.Mark{SystemID: "sys", Timeline: 1, Slot: "s"},
		Confirmed: h.p.Flushed(), ServerEnd: 1 << 40})
}

func (h *harness) txn(commit, end pglogrepl.LSN, rows ...[]pg.Col) error {
	return h.txnCtx(h.ctx, commit, end, rows...)
}

func (h *harness) txnCtx(ctx context.Context, commit, end pglogrepl.LSN, rows ...[]pg.Col) error {
	return h.txnXid(ctx, commit, end, 7, rows...)
}

// txnXid is txn with the transaction's xid.
func (h *harness) txnXid(ctx context.Context, commit, end pglogrepl.LSN, xid uint32, rows ...[]pg.Col) error {
	t := walTxn{commit: commit, end: end, msgs: [][]byte{pg.Begin(commit, xid)}}
	for _, r := range rows {
		t.msgs = append(t.msgs, pg.Insert(pg.OutboxID, r...))
	}
	t.msgs = append(t.msgs, pg.Commit(commit, end))
	done := make(chan error, 1)
	h.in <- walReq{ctx: ctx, txn: t, done: done}
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
	// reconnect, when set, ends the session as replication.Stream does
	// before a new one: Drain, Reset to the slot's confirmed position, and
	// Session with now; the transactions after it are the test's to send.
	reconnect *history.Now
	// idle, when set, is a keepalive's WAL end: AdvanceIdle, as the
	// stream calls it between transactions.
	idle pglogrepl.LSN
}

// keepalive hands the pipeline a keepalive's WAL end on the loop goroutine.
func (h *harness) keepalive(walEnd pglogrepl.LSN) {
	done := make(chan error, 1)
	h.in <- walReq{ctx: h.ctx, done: done, idle: walEnd}
	<-done
}

// reconnect starts a new session on now's history (now.Confirmed is the
// slot's position).
func (h *harness) reconnect(now history.Now) error {
	done := make(chan error, 1)
	h.in <- walReq{ctx: h.ctx, done: done, reconnect: &now}
	return <-done
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
				if errors.Is(err, replication.ErrRestart) && h.p.Restarting() {
					return nil // the rest comes again after the restart
				}
				return err
			}
		}
		return nil
	}
	session := func() error { return h.session(ctx) }
	tick := time.NewTicker(time.Millisecond) // the real loop checks once per message or status interval
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-h.in:
			if r.idle != 0 {
				h.p.AdvanceIdle(r.idle)
				r.done <- nil
				continue
			}
			if now := r.reconnect; now != nil {
				err := h.p.Drain(ctx)
				if err == nil {
					err = h.p.Reset(now.Confirmed)
				}
				if err == nil {
					err = h.p.Session(ctx, *now)
				}
				log, sawRel = nil, false
				r.done <- err
				continue
			}
			log = append(log, r.txn)
			r.done <- feed(r.ctx, r.txn)
		case <-tick.C:
			if !h.p.Restarting() {
				continue
			}
			if err := h.p.Drain(ctx); err != nil {
				return
			}
			if err := session(); err != nil {
				h.t.Errorf("Session = %v", err)
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
