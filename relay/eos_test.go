package relay

import (
	"context"
	"encoding/json"
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
	"github.com/outbox-relay/outbox-relay/exactlyonce"
	"github.com/outbox-relay/outbox-relay/sink"
)

// fakeTxn is a transactional producer over an in-memory partition log:
// records of a committed transaction become visible (to a read_committed
// reader) at its commit, those of an aborted one never.
type fakeTxn struct {
	mu      sync.Mutex
	opened  bool
	opens   int
	open    []*sink.Message
	recs    map[*sink.Message]error
	visible []sink.Message
	commits int
	// commit scripts the n-th commit (1-based): apply says whether the
	// records become visible, err what Commit returns.
	commit func(n int) (apply bool, err error)
	// record, when it returns an error, fails that record (the broker's
	// refusal); the transaction cannot commit then.
	record func(m *sink.Message) error
}

func (f *fakeTxn) CheckTopic(string) error { return nil }

func (f *fakeTxn) Open(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened, f.open, f.recs = true, nil, map[*sink.Message]error{} // InitProducerId aborts what was open
	f.opens++
	return nil
}
func (f *fakeTxn) Opened() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.opened }
func (f *fakeTxn) Begin() error { return nil }
func (f *fakeTxn) Send(_ context.Context, m *sink.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m.Partition = 0
	f.open = append(f.open, m)
	for _, err := range f.recs {
		f.recs[m] = err // as sarama: once one failed, the later ones fail with its error
		return nil
	}
	if f.record != nil {
		if err := f.record(m); err != nil {
			f.recs[m] = err
		}
	}
	return nil
}
func (f *fakeTxn) Sync(_ context.Context, m *sink.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recs[m]
}
func (f *fakeTxn) Commit(context.Context) (error, map[*sink.Message]error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commits++
	if len(f.recs) > 0 {
		recs := f.recs
		f.recs, f.open = map[*sink.Message]error{}, nil
		return sarama.ErrTransactionNotReady, recs
	}
	apply, err := true, error(nil)
	if f.commit != nil {
		apply, err = f.commit(f.commits)
	}
	if apply {
		for _, m := range f.open {
			f.visible = append(f.visible, written(m))
		}
	}
	f.open = nil
	return err, nil
}
func (f *fakeTxn) Abort(context.Context) (error, map[*sink.Message]error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	recs := f.recs
	f.recs, f.open = map[*sink.Message]error{}, nil
	return nil, recs
}
func (f *fakeTxn) Fatal() bool { return false }
func (f *fakeTxn) Close()      { f.mu.Lock(); f.opened = false; f.mu.Unlock() }
func (f *fakeTxn) ReadCheckpoint(_ context.Context, topic string, key []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last []byte
	for _, m := range f.visible {
		if m.Topic == topic && string(m.Key) == string(key) {
			last = m.Value
		}
	}
	return last, nil
}
func (f *fakeTxn) Connected() bool   { return true }
func (f *fakeTxn) SetConnected(bool) {}

// events returns the event ids visible, in order (checkpoints left out),
// and the last checkpoint's commit LSN.
func (f *fakeTxn) events(cpTopic string) (ids []string, checkpoint string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.visible {
		if m.Topic == cpTopic {
			var cp exactlyonce.Checkpoint
			_ = json.Unmarshal(m.Value, &cp)
			checkpoint = cp.CommitLSN
			continue
		}
		ids = append(ids, string(m.Headers[0].Value))
	}
	return ids, checkpoint
}

// cpTopic is the default checkpoint topic, the harness's.
var cpTopic = exactlyonce.DefaultConfig().CheckpointTopic

// newEOSHarness is the pipeline harness with the exactly-once delivery over
// prod: batches of maxBatch events, committed after interval, or once the
// stream was idle for idle (0: off).
func newEOSHarness(t *testing.T, prod exactlyonce.Producer, maxBatch int, interval, idle time.Duration, configure ...func(*PipelineConfig)) *harness {
	t.Helper()
	cfg := exactlyonce.DefaultConfig()
	cfg.MaxBatchEvents, cfg.MaxBatchInterval, cfg.MaxBatchIdle = maxBatch, interval, idle
	var p *Pipeline
	e := exactlyonce.NewWith(cfg, prod, exactlyonce.Options{Slot: "s", MaxEvents: 10, MaxBytes: 1 << 20,
		SystemID: func(context.Context) (string, error) { return "sys", nil },
		Activity: func() uint64 { return p.Handled() }, Log: zerolog.Nop()})
	tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	marker := &fakeMarker{marked: make(chan string, 10)}
	pc := PipelineConfig{Table: "public.outbox", Template: tmpl, MaxTopics: 100, Policy: fastPolicy,
		Limits: checkpoint.Limits{MaxEvents: 10, MaxBytes: 1 << 20}}
	for _, f := range configure {
		f(&pc)
	}
	p, err = NewPipeline(pc, e, marker, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.OnAcked(p.Acked)
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, p: p, ctx: ctx, in: make(chan walReq), marker: marker}
	h.start(cancel, e.Run, e.Ready())
	return h
}

// The commit is the ack: the watermark stays put while a Kafka transaction
// is open, whole PostgreSQL transactions share one up to max_batch_events,
// and the checkpoint record ends each with its last commit LSN.
func TestExactlyOnceCommitIsTheAck(t *testing.T) {
	f := &fakeTxn{}
	h := newEOSHarness(t, f, 3, time.Hour, 0)
	if err := h.txn(100, 110, order("1", "a"), order("2", "a")); err != nil {
		t.Fatal(err)
	}
	if ids, _ := f.events(cpTopic); len(ids) != 0 || h.p.Flushed() != 0 {
		t.Fatalf("visible %v, watermark %s before any commit", ids, h.p.Flushed())
	}
	// 2 + 2 > 3: the first Kafka transaction is committed before this one.
	if err := h.txn(200, 210, order("3", "b"), order("4", "b")); err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	ids, cp := f.events(cpTopic)
	if strings.Join(ids, ",") != "1,2" || cp != pglogrepl.LSN(100).String() {
		t.Fatalf("visible %v checkpoint %s, want 1,2 and %s", ids, cp, pglogrepl.LSN(100))
	}
	if h.p.Flushed() != 110 {
		t.Fatalf("watermark %s passed the open Kafka transaction", h.p.Flushed())
	}
	// The session ends (Drain): the open Kafka transaction is committed.
	if err := h.p.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids, cp := f.events(cpTopic); strings.Join(ids, ",") != "1,2,3,4" || cp != pglogrepl.LSN(200).String() {
		t.Fatalf("after Drain visible %v checkpoint %s", ids, cp)
	}
}

// max_batch_idle: a quiet stream's transaction is committed once idle, not
// max_batch_interval (an hour here) after it opened, and what arrived while
// a commit was in flight is committed right after it (group commit), with
// no further PostgreSQL transaction to trigger it.
func TestExactlyOnceIdleCommit(t *testing.T) {
	release := make(chan struct{})
	f := &fakeTxn{}
	// The second commit is slow: two transactions arrive meanwhile.
	started := make(chan struct{})
	h := newEOSHarness(t, &gatedCommit{fakeTxn: f, gate: func(n int) {
		if n == 2 {
			close(started)
			<-release
		}
	}}, 10, time.Hour, 20*time.Millisecond)
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	if err := h.txn(200, 210, order("2", "a")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for the second commit to start")
	}
	if err := h.txn(300, 310, order("3", "b")); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(400, 410, order("4", "b")); err != nil {
		t.Fatal(err)
	}
	close(release)
	h.waitFlushed(410)
	ids, cp := f.events(cpTopic)
	if strings.Join(ids, ",") != "1,2,3,4" || cp != pglogrepl.LSN(400).String() {
		t.Fatalf("visible %v checkpoint %s, want 1,2,3,4 and %s", ids, cp, pglogrepl.LSN(400))
	}
	f.mu.Lock()
	commits := f.commits
	f.mu.Unlock()
	if commits != 3 {
		t.Errorf("%d commits, want 3 (the two transactions that waited for the slow commit share one)", commits)
	}
}

// gatedCommit calls gate(n) before the n-th commit, outside the fake's lock.
type gatedCommit struct {
	*fakeTxn
	n    int
	gate func(n int)
}

func (g *gatedCommit) Commit(ctx context.Context) (error, map[*sink.Message]error) {
	g.n++ // commits never overlap
	g.gate(g.n)
	return g.fakeTxn.Commit(ctx)
}

// Every failure of a Kafka transaction rewinds, and the checkpoint filter
// keeps the result exactly once: a commit whose answer is lost after the
// broker applied it (the relay builds a new producer and reads the
// checkpoint), one that failed, and a record the broker refused.
func TestExactlyOnceFailuresDeliverOnce(t *testing.T) {
	lost := errors.New("read tcp: i/o timeout")
	cases := []struct {
		name   string
		commit func(n int) (bool, error)
		record func(m *sink.Message) error
		opens  int // producers built: 1 + one per unknown outcome
	}{
		{"commit applied, answer lost", func(n int) (bool, error) {
			if n == 2 {
				return true, lost
			}
			return true, nil
		}, nil, 2},
		{"commit failed", func(n int) (bool, error) {
			if n == 2 {
				return false, lost
			}
			return true, nil
		}, nil, 2},
		{"a record refused once", nil, func() func(m *sink.Message) error {
			refused := false
			return func(m *sink.Message) error {
				if len(m.Headers) > 0 && string(m.Headers[0].Value) == "4" && !refused {
					refused = true
					return sarama.ErrNotEnoughReplicas
				}
				return nil
			}
		}(), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTxn{commit: tc.commit, record: tc.record}
			h := newEOSHarness(t, f, 2, time.Millisecond, 0)
			want := []string{}
			for i := range 6 {
				id := itoa(int64(i + 1))
				if err := h.txn(pglogrepl.LSN(100*(i+1)), pglogrepl.LSN(100*(i+1)+10), order(id, "a")); err != nil {
					t.Fatal(err)
				}
				want = append(want, id)
			}
			h.waitFlushed(610)
			ids, _ := f.events(cpTopic)
			if strings.Join(ids, ",") != strings.Join(want, ",") {
				t.Fatalf("visible %v, want %v exactly once, in order", ids, want)
			}
			if f.opens != tc.opens {
				t.Errorf("%d producers built, want %d", f.opens, tc.opens)
			}
			if h.restarts.Load() < 1 {
				t.Errorf("no rewind")
			}
			// Exactly-once's way back is its own: the at-least-once skips
			// and their counters stay out of it.
			if h.p.resend.on || h.p.resend.republished.Load() != 0 || h.p.resend.skipped.Load() != 0 {
				t.Errorf("resend log on=%v republished=%d skipped=%d under exactly-once", h.p.resend.on,
					h.p.resend.republished.Load(), h.p.resend.skipped.Load())
			}
		})
	}
}

// The exactly_once keys are checked by name; the batch bound by
// inflight.max_events only under delivery: exactly_once.
func TestExactlyOnceConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		set  func(c *Config)
		want string // "" = valid
	}{
		{"defaults, at least once", func(c *Config) {}, ""},
		{"defaults, exactly once", func(c *Config) { c.Delivery = ExactlyOnce }, ""},
		{"batch above inflight under exactly once", func(c *Config) {
			c.Delivery, c.InFlight.MaxEvents = ExactlyOnce, 1000
		}, "exactly_once.max_batch_events: 5000 must be between 1 and inflight.max_events (1000)"},
		{"batch above inflight is fine at least once", func(c *Config) { c.InFlight.MaxEvents = 1000 }, ""},
		{"unknown delivery", func(c *Config) { c.Delivery = "exactly-once" }, "delivery: \"exactly-once\""},
		{"timeout above the brokers' default maximum", func(c *Config) { c.ExactlyOnce.TransactionTimeout = 16 * time.Minute }, "exactly_once.transaction_timeout"},
		{"checkpoint topic", func(c *Config) { c.ExactlyOnce.CheckpointTopic = "a b" }, "exactly_once.checkpoint_topic"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Postgres.URL, c.Postgres.Slot, c.Kafka.Brokers = "postgres://u@h/db", "orders", []string{"k:9092"}
			tc.set(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	c := DefaultConfig()
	c.Postgres.Slot = "orders"
	if got := c.TxnID(); got != "outbox-relay-orders" {
		t.Errorf("default transactional id %q, want outbox-relay-orders", got)
	}
}

// A record the broker always refuses (too large for its topic) fails the
// Kafka transaction, and sarama fails every later record of it with the
// same error. The relay sends the aborted records again one at a time, so
// only the culprit counts an attempt and becomes a dead letter (at once:
// refused alone, its refusal is certain), inside a
// Kafka transaction; every other event is delivered once.
func TestExactlyOncePoisonIsolated(t *testing.T) {
	f := &fakeTxn{record: func(m *sink.Message) error {
		if m.Topic != testDLQ && len(m.Headers) > 0 && string(m.Headers[0].Value) == "3" {
			return sarama.ErrMessageSizeTooLarge
		}
		return nil
	}}
	h := newEOSHarness(t, f, 100, time.Millisecond, 0)
	want := []string{}
	for i := range 6 {
		id := itoa(int64(i + 1))
		if err := h.txn(pglogrepl.LSN(100*(i+1)), pglogrepl.LSN(100*(i+1)+10), order(id, "a")); err != nil {
			t.Fatal(err)
		}
		if id != "3" {
			want = append(want, id)
		}
	}
	// Sent alone, its refusal is certain (sink.Certain): dead-lettered at
	// the first answer, not after fastPolicy.MaxAttempts.
	if m := h.waitMark(); m != "dead 3 attempts=1" {
		t.Fatalf("row mark %q, want dead 3 attempts=1 (refused alone: at once)", m)
	}
	h.waitFlushed(610)
	var letters int
	events := []string{}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.visible {
		if m.Topic == testDLQ {
			letters++
		}
		if m.Topic != testDLQ && m.Topic != cpTopic {
			events = append(events, string(m.Headers[0].Value))
		}
	}
	if strings.Join(events, ",") != strings.Join(want, ",") || letters != 1 {
		t.Fatalf("events %v and %d dead letters, want %v once and 1 dead letter", events, letters, want)
	}
	if h.p.Halted() != nil {
		t.Fatalf("halted: %v", h.p.Halted())
	}
}

// gatedOpen calls gate(n) before the n-th Open (producer built).
type gatedOpen struct {
	*fakeTxn
	n    int
	gate func(n int)
}

func (g *gatedOpen) Open(ctx context.Context) error {
	g.n++ // Run builds producers one at a time
	g.gate(g.n)
	return g.fakeTxn.Open(ctx)
}

// While the producer is rebuilt after a commit of unknown outcome, the
// stream waits in Begin for it (and for the checkpoint read again) instead
// of rewinding over and over into a closed producer; then every event is
// visible exactly once.
func TestExactlyOnceRebuildWaits(t *testing.T) {
	lost := errors.New("read tcp: i/o timeout")
	f := &fakeTxn{commit: func(n int) (bool, error) {
		if n == 2 {
			return true, lost
		}
		return true, nil
	}}
	rebuilding, release := make(chan struct{}), make(chan struct{})
	h := newEOSHarness(t, &gatedOpen{fakeTxn: f, gate: func(n int) {
		if n == 2 {
			close(rebuilding)
			<-release
		}
	}}, 2, time.Millisecond, 0)
	fed := make(chan error, 1)
	go func() { // a txn may wait in Begin while the producer is rebuilt
		for i := range 6 {
			id := itoa(int64(i + 1))
			if err := h.txn(pglogrepl.LSN(100*(i+1)), pglogrepl.LSN(100*(i+1)+10), order(id, "a")); err != nil {
				fed <- err
				return
			}
		}
		fed <- nil
	}()
	select {
	case <-rebuilding:
	case <-time.After(5 * time.Second):
		t.Fatal("the lost commit answer never made the delivery rebuild its producer")
	}
	// An absence over a window: a delivery that does not wait rewinds
	// every few milliseconds meanwhile (each rewind's backoff is short).
	time.Sleep(300 * time.Millisecond)
	if n := h.restarts.Load(); n > 1 {
		t.Errorf("%d rewinds while the producer was rebuilt, want at most 1", n)
	}
	close(release)
	if err := <-fed; err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(610)
	ids, _ := f.events(cpTopic)
	if strings.Join(ids, ",") != "1,2,3,4,5,6" {
		t.Fatalf("visible %v, want 1..6 exactly once, in order", ids)
	}
}

// on_poison: halt stops at a bad row while its transaction's records are
// being built; the transactions before it, in the open Kafka transaction,
// still commit (max_batch_idle), so the slot moves up to the bad row's
// transaction and no further.
func TestExactlyOnceHaltCommitsWhatCameBefore(t *testing.T) {
	f := &fakeTxn{}
	h := newEOSHarness(t, f, 100, time.Hour, 5*time.Millisecond, func(c *PipelineConfig) { c.Policy.Halt = true })
	for i, id := range []string{"1", "2"} {
		lsn := pglogrepl.LSN(100 * (i + 1))
		if err := h.txn(lsn, lsn+10, order(id, "a")); err != nil {
			t.Fatal(err)
		}
	}
	bad := pg.Row("3", "order", "o-3", "order.paid", `{}`, pg.Null)
	bad[2] = pg.Null // aggregate_id IS NULL
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- h.txnCtx(ctx, 300, 310, order("4", "a"), bad) }()
	if got := h.waitMark(); got != "failed 3 attempts=1" {
		t.Fatalf("row mark %q", got)
	}
	h.waitFlushed(210)
	if ids, cp := f.events(cpTopic); strings.Join(ids, ",") != "1,2" || cp != pglogrepl.LSN(200).String() {
		t.Fatalf("visible %v checkpoint %s, want 1,2 and %s", ids, cp, pglogrepl.LSN(200))
	}
	if h.p.Flushed() != 210 {
		t.Fatalf("watermark %s, want 0/D2: not past the halted transaction", h.p.Flushed())
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Handle = %v, want context.Canceled", err)
	}
}

// Issue 36: in exactly-once mode too, a dead letter its topic refuses for
// its size is cut down further (it is made again after each rewind, one
// step smaller) instead of halting the relay; the events around it are
// delivered once.
func TestExactlyOnceDeadLetterCutToFit(t *testing.T) {
	var refusedLetters int
	f := &fakeTxn{record: func(m *sink.Message) error {
		if m.Topic == testDLQ {
			if len(m.Value) > 0 { // the topic takes no dead letter with its payload
				refusedLetters++
				return sarama.ErrMessageSizeTooLarge
			}
			return nil
		}
		if len(m.Headers) > 0 && string(m.Headers[0].Value) == "3" {
			return sarama.ErrInvalidRecord
		}
		return nil
	}}
	h := newEOSHarness(t, f, 100, time.Millisecond, 0)
	want := []string{}
	for i := range 5 {
		id := itoa(int64(i + 1))
		if err := h.txn(pglogrepl.LSN(100*(i+1)), pglogrepl.LSN(100*(i+1)+10), order(id, "a")); err != nil {
			t.Fatal(err)
		}
		if id != "3" {
			want = append(want, id)
		}
	}
	if m := h.waitMark(); !strings.HasPrefix(m, "dead 3") {
		t.Fatalf("row mark %q, want dead 3", m)
	}
	h.waitFlushed(510)
	if h.p.Halted() != nil {
		t.Fatalf("halted: %v", h.p.Halted())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var events []string
	var letter *sink.Message
	for i, m := range f.visible {
		switch m.Topic {
		case testDLQ:
			if letter != nil {
				t.Fatal("two dead letters visible")
			}
			letter = &f.visible[i]
		case cpTopic:
		default:
			events = append(events, string(m.Headers[0].Value))
		}
	}
	if strings.Join(events, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v once", events, want)
	}
	if letter == nil || len(letter.Value) != 0 || refusedLetters == 0 {
		t.Fatalf("dead letter %v after %d refusals, want one without its payload", letter, refusedLetters)
	}
	omitted := false
	for _, hd := range letter.Headers {
		if string(hd.Key) == "dlq.payload_omitted" && string(hd.Value) == "true" {
			omitted = true
		}
	}
	if !omitted {
		t.Error("the cut dead letter does not say dlq.payload_omitted: true")
	}
}
