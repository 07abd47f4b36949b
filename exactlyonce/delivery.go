// Package exactlyonce is delivery: exactly_once. It takes the pipeline's
// records one PostgreSQL transaction at a time (relay.Delivery), groups
// whole PostgreSQL transactions into Kafka transactions (batcher), ends
// each with a checkpoint record (the last commit LSN it holds) in the
// compacted checkpoint topic, and acks the records only once the commit
// succeeded: the commit is the ack, so the tracker, and with it the slot,
// moves only past committed transactions. Any failure aborts the Kafka
// transaction and fails its records with a *sink.AbortError: the pipeline
// rewinds, and on the way back the pipeline skips, verified, every
// PostgreSQL transaction the checkpoint says is committed already (Kept;
// package history decides whether the checkpoint is on the server's history).
//
// The package owns the producer's lifecycle: Run checks the checkpoint
// topic, learns the server's system id (Options.SystemID), opens the
// transactional producer (fencing older ones with the same transactional
// id), reads the checkpoint, then commits batches as they age. When a
// producer must be rebuilt (a commit of unknown outcome, a fenced or fatal
// producer, a failed abort) Run rebuilds it and reads the checkpoint again,
// without holding the lock; Begin and Kept wait for that, so the next
// session finds the checkpoint current.
package exactlyonce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Producer is the transactional producer Delivery drives
// (*sink.TxnProducer; tests use a fake). One owner at a time: Delivery
// calls it under its lock, or from its commit goroutine or Run while no
// one else may.
type Producer interface {
	CheckTopic(topic string) error
	Open(ctx context.Context) error
	Opened() bool
	Begin() error
	Send(ctx context.Context, m *sink.Message) error
	Sync(ctx context.Context, m *sink.Message) error
	Commit(ctx context.Context) (error, map[*sink.Message]error)
	Abort(ctx context.Context) (error, map[*sink.Message]error)
	Fatal() bool
	Close()
	ReadCheckpoint(ctx context.Context, topic string, key []byte) ([]byte, error)
	Connected() bool
	SetConnected(ok bool)
}

// Options is what Delivery takes from the relay besides its Config.
type Options struct {
	// Slot is postgres.slot: the default transactional id, and recorded in
	// each checkpoint.
	Slot string
	// MaxEvents and MaxBytes are inflight.max_events and max_bytes: a
	// Kafka transaction's events stay in flight until its commit.
	MaxEvents int
	MaxBytes  int64
	// SystemID reads the PostgreSQL server's system identifier, which the
	// checkpoint is bound to; Run retries it until it answers.
	SystemID func(ctx context.Context) (string, error)
	// Valid checks with a round trip that the lease is still ours (nil
	// without election): a deposed leader must not fence the new one's
	// producer.
	Valid func(ctx context.Context) error
	// Activity counts the WAL messages the pipeline handled
	// (relay.Pipeline.Handled): max_batch_idle commits once it stops
	// moving. nil: never idle.
	Activity func() uint64
	Log      zerolog.Logger
	// Registerer gets the exactly-once metrics (nil: none).
	Registerer prometheus.Registerer
}

// Delivery is the exactly-once delivery. New allocates; Run connects and
// runs the term's Kafka side; Begin, Publish, End, Flush and Restart come
// from the pipeline on the replication loop goroutine (Publish also from
// its retry goroutine). mu guards the batch state; a commit runs on a
// goroutine of its own and takes mu only to settle, so the loop reads on
// while the broker commits.
type Delivery struct {
	cfg   Config
	opt   Options
	id    string // the transactional id
	prod  Producer
	log   zerolog.Logger
	m     metrics
	acked func(msgs []*sink.Message, at time.Time) // OnAcked; nil: each record's Done(nil)

	ready     chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	rebuild   chan struct{} // asks Run for a new producer (failLocked)
	ctx       atomic.Pointer[context.Context]

	systemID string

	mu sync.Mutex
	// kept is the last PostgreSQL transaction committed to Kafka (the
	// checkpoint read at start, then each commit's); keptOK false: none.
	// mark is the history of the session the pipeline streams now, which
	// the next checkpoints are written for; last is the batch's last whole
	// transaction (its checkpoint, once the batch commits).
	kept    history.Point
	keptOK  bool
	mark    history.Mark
	last    history.Point
	b       batcher
	msgs    []*sink.Message // records of the open Kafka transaction, checkpoint excluded
	discard bool            // aborted: refuse records until the pipeline restarted
	next    nextPG          // let in by Begin, not counted in the batch yet
	// reopen: the producer was closed for a rebuild Run has not finished;
	// Begin waits on reopened, Publish refuses.
	reopen   bool
	reopened chan struct{}
	// isolate counts the records still to be sent one at a time after a
	// Kafka transaction failed on a record error: sarama fails every
	// record after the refused one with the refused one's error, so only
	// one at a time tells the culprit (whose error then counts towards
	// on_poison) from the innocent.
	isolate int
	// A commit runs on a goroutine of its own, so the replication loop goes
	// on reading while the broker commits: records published meanwhile wait
	// in pending and go out in the next Kafka transaction once it is through
	// (one transaction at a time per producer).
	committing bool
	commitDone chan struct{} // closed when the commit in flight is settled
	pending    []*sink.Message
	begun      bool // the Kafka transaction of msgs has begun at the producer
	// exactly_once.max_batch_idle: the open Kafka transaction is committed
	// once Activity did not move since the timer was armed at seenAtArm and
	// no commit is in flight. A drain never idles that long, a quiet stream
	// does at once.
	seenAtArm uint64
	idleTimer *time.Timer
	idleArmed bool
	stopped   bool // the term ended: no commit starts any more
}

// Checkpoint is the value of a checkpoint record; its key is the
// transactional id.
//
// Besides the position it records the history it was taken on and the
// transaction at it (package history): a checkpoint is applied only on the
// same history, and only provisionally until the stream shows that
// transaction again. Records written before those fields existed have them
// empty; they are compared by their LSNs.
type Checkpoint struct {
	Slot       string `json:"slot"`
	SystemID   string `json:"system_id"`
	Timeline   int32  `json:"timeline,omitempty"`
	SlotLSN    string `json:"slot_lsn,omitempty"`   // the slot's creation (slot registry)
	SlotXid    uint64 `json:"slot_xid,omitempty"`   // the slot's creation xid (slot registry)
	Generation int64  `json:"generation,omitempty"` // the slot registry's generation
	CommitLSN  string `json:"commit_lsn"`
	EndLSN     string `json:"end_lsn"`
	Xid        uint32 `json:"xid,omitempty"`         // of the transaction at commit_lsn
	CommitTime string `json:"commit_time,omitempty"` // of the transaction at commit_lsn, RFC 3339 with nanoseconds
	WrittenAt  string `json:"written_at"`
}

// checkpointOf is the record of p.
func checkpointOf(p history.Point) Checkpoint {
	c := Checkpoint{Slot: p.Mark.Slot, SystemID: p.Mark.SystemID, Timeline: p.Mark.Timeline, SlotXid: p.Mark.SlotXid,
		Generation: p.Mark.Generation, CommitLSN: p.CommitLSN.String(), EndLSN: p.EndLSN.String(), Xid: p.Xid,
		WrittenAt: time.Now().UTC().Format(time.RFC3339Nano)}
	if p.Mark.SlotLSN != 0 {
		c.SlotLSN = p.Mark.SlotLSN.String()
	}
	if !p.CommitTime.IsZero() {
		c.CommitTime = p.CommitTime.UTC().Format(time.RFC3339Nano)
	}
	return c
}

// point is c's position; an error names the field that is not valid.
func (c Checkpoint) point() (history.Point, error) {
	p := history.Point{Mark: history.Mark{SystemID: c.SystemID, Timeline: c.Timeline, Slot: c.Slot, SlotXid: c.SlotXid,
		Generation: c.Generation}, Xid: c.Xid}
	var err error
	if p.CommitLSN, err = pglogrepl.ParseLSN(c.CommitLSN); err != nil {
		return p, fmt.Errorf("commit_lsn %q: %w", c.CommitLSN, err)
	}
	if p.EndLSN, err = pglogrepl.ParseLSN(c.EndLSN); err != nil {
		return p, fmt.Errorf("end_lsn %q: %w", c.EndLSN, err)
	}
	if c.SlotLSN != "" {
		if p.Mark.SlotLSN, err = pglogrepl.ParseLSN(c.SlotLSN); err != nil {
			return p, fmt.Errorf("slot_lsn %q: %w", c.SlotLSN, err)
		}
	}
	if c.CommitTime != "" {
		if p.CommitTime, err = time.Parse(time.RFC3339Nano, c.CommitTime); err != nil {
			return p, fmt.Errorf("commit_time %q: %w", c.CommitTime, err)
		}
	}
	return p, nil
}

type metrics struct {
	txns        *prometheus.CounterVec
	events      prometheus.Histogram
	commit      prometheus.Histogram
	skipped     prometheus.Counter
	committed   prometheus.Counter
	abortedTxns prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_kafka_transactions_total",
			Help: "Kafka transactions ended under delivery: exactly_once, by result (committed or aborted)."}, []string{"result"}),
		events: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_kafka_transaction_events",
			Help:    "Events per committed Kafka transaction (the checkpoint record not counted).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9)}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_kafka_transaction_commit_seconds",
			Help:    "Duration of CommitTxn (flush of the transaction's records and EndTxn).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10)}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_exactly_once_skipped_events_total",
			Help: "Events of PostgreSQL transactions at or below the checkpoint, read again from the slot and skipped (already committed to Kafka)."}),
	}
	m.committed, m.abortedTxns = m.txns.WithLabelValues("committed"), m.txns.WithLabelValues("aborted")
	if reg != nil {
		reg.MustRegister(m.txns, m.events, m.commit, m.skipped)
	}
	return m
}

// New builds the transactional producer from kafka (it does not dial) and
// the Delivery over it.
func New(cfg Config, kafka sink.Config, o Options) (*Delivery, error) {
	id := cfg.ID(o.Slot)
	prod, err := sink.NewTxn(kafka, id, cfg.TransactionTimeout, o.Log)
	if err != nil {
		return nil, err
	}
	// The at-least-once producer's series (events published, errors), so
	// dashboards work in both modes; it is never run.
	counters, err := sink.New(kafka, o.Log, o.Registerer)
	if err != nil {
		return nil, err
	}
	prod.SetMetrics(counters)
	return NewWith(cfg, prod, o), nil
}

// NewWith is New over a producer of the caller's (tests).
func NewWith(cfg Config, prod Producer, o Options) *Delivery {
	id := cfg.ID(o.Slot)
	return &Delivery{cfg: cfg, opt: o, id: id, prod: prod, m: newMetrics(o.Registerer),
		log:   o.Log.With().Str("component", "exactly_once").Str("transactional_id", id).Logger(),
		ready: make(chan struct{}), closing: make(chan struct{}), rebuild: make(chan struct{}, 1),
		reopened: make(chan struct{}),
		b: batcher{maxEvents: cfg.MaxBatchEvents, inflightEvents: o.MaxEvents,
			inflightBytes: o.MaxBytes, interval: cfg.MaxBatchInterval}}
}

// OnAcked makes a commit hand its records to f in one call, with the time
// it succeeded, instead of calling each record's Done(nil). Call it before
// Run. Failures still go to each Done.
func (e *Delivery) OnAcked(f func(msgs []*sink.Message, at time.Time)) { e.acked = f }

// Ready is closed once the producer is initialised and the checkpoint read:
// the stream may start.
func (e *Delivery) Ready() <-chan struct{} { return e.ready }

// Connected reports whether the last transaction went through. Any goroutine.
func (e *Delivery) Connected() bool { return e.prod.Connected() }

// Close stops Run: an open Kafka transaction is aborted (its events are
// unacked; the slot keeps them). Idempotent; does not block.
func (e *Delivery) Close() { e.closeOnce.Do(func() { close(e.closing) }) }

// Kept implements relay.Keeper: the next checkpoints are written for m,
// and the last PostgreSQL transaction committed to Kafka is returned, once
// the checkpoint was read (again, after a producer rebuild). The pipeline
// decides whether it applies (package history); the delivery itself never
// skips anything.
func (e *Delivery) Kept(ctx context.Context, m history.Mark) (history.Point, bool, error) {
	select {
	case <-e.ready:
	case <-ctx.Done():
		return history.Point{}, false, ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.waitReopenLocked(ctx); err != nil {
		return history.Point{}, false, err
	}
	e.mark = m
	return e.kept, e.keptOK, nil
}

// Skipped counts events the pipeline read again and did not publish: at or
// before a kept position (this checkpoint, or its own acks) verified on the
// same history.
func (e *Delivery) Skipped(events int) { e.m.skipped.Add(float64(events)) }

// waitReopenLocked waits, mu released meanwhile, until Run finished
// rebuilding the producer (and read the checkpoint again), or ctx ends.
// Caller holds mu.
func (e *Delivery) waitReopenLocked(ctx context.Context) error {
	for e.reopen {
		ch := e.reopened
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			e.mu.Lock()
			return ctx.Err()
		}
		e.mu.Lock()
	}
	return nil
}

// keepLocked records p as committed to Kafka. Caller holds mu.
func (e *Delivery) keepLocked(p history.Point) {
	if !e.keptOK || p.EndLSN >= e.kept.EndLSN {
		e.kept, e.keptOK = p, true
	}
}

func (e *Delivery) context() context.Context {
	if c := e.ctx.Load(); c != nil {
		return *c
	}
	return context.Background()
}

func (e *Delivery) activity() uint64 {
	if e.opt.Activity == nil {
		return 0
	}
	return e.opt.Activity()
}

// Run prepares the checkpoint topic, opens the producer, reads the
// checkpoint, then commits Kafka transactions as they reach
// exactly_once.max_batch_interval and rebuilds the producer when asked,
// until Close or ctx ends. It returns nil then, or the error that must end
// the term (a checkpoint it must not use, lost leadership, a producer it
// cannot rebuild).
func (e *Delivery) Run(ctx context.Context) error {
	e.ctx.Store(&ctx)
	if err := e.start(ctx); err != nil {
		return e.ended(ctx, err)
	}
	close(e.ready)
	tick := time.NewTicker(max(time.Millisecond, e.cfg.MaxBatchInterval/4))
	defer tick.Stop()
	defer e.stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.closing:
			return nil
		case <-e.rebuild:
			if err := e.reopenProducer(ctx); err != nil {
				return e.ended(ctx, err)
			}
		case now := <-tick.C:
			e.mu.Lock()
			if !e.discard && !e.committing && e.b.due(now) {
				e.startCommitLocked()
			}
			e.mu.Unlock()
		}
	}
}

// ended is what Run returns when opening a producer failed with err: nil
// once ctx ended (a stop, not a failure), else err; a lost lease
// (context.Canceled) is logged as the term's end.
func (e *Delivery) ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		e.log.Warn().Err(err).Msg("term ends")
	}
	return err
}

// reopenProducer opens a new producer and reads the checkpoint again
// (open), outside the lock; then Begin may go on.
func (e *Delivery) reopenProducer(ctx context.Context) error {
	err := e.open(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		e.reopen = false
		close(e.reopened)
		e.reopened = make(chan struct{})
	}
	return err
}

// start makes the checkpoint topic, learns the server's system id, opens
// the producer and reads the checkpoint; network errors are retried.
func (e *Delivery) start(ctx context.Context) error {
	if err := e.prepare(ctx); err != nil {
		return err
	}
	return e.open(ctx)
}

// prepare creates or checks the checkpoint topic and reads the server's
// system identifier, retrying what may heal.
func (e *Delivery) prepare(ctx context.Context) error {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	for {
		err := e.prod.CheckTopic(e.cfg.CheckpointTopic)
		if err == nil {
			break
		}
		if errors.Is(err, sink.ErrNotCompacted) || sink.IsAuthError(err) {
			return err // retrying cannot fix the topic's settings or refused credentials
		}
		e.log.Warn().Err(err).Msg("cannot check the checkpoint topic yet; retrying")
		if backoff.Sleep(ctx, b.Next()) != nil {
			return ctx.Err()
		}
	}
	for {
		id, err := e.opt.SystemID(ctx)
		if err == nil {
			e.systemID = id
			break
		}
		e.log.Warn().Err(err).Msg("cannot read the PostgreSQL system identifier yet; retrying")
		if backoff.Sleep(ctx, b.Next()) != nil {
			return ctx.Err()
		}
	}
	return nil
}

// open initialises a new producer (fencing older ones) and reads the
// checkpoint with it, retrying network errors until ctx ends.
func (e *Delivery) open(ctx context.Context) error {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	for {
		if e.opt.Valid != nil {
			if err := e.opt.Valid(ctx); err != nil {
				// Ends the term like a lost lease (context.Canceled), not the relay.
				return fmt.Errorf("exactly_once: not the leader any more (%v), so not initialising a producer that would fence the new leader's: %w", err, context.Canceled)
			}
		}
		if err := e.prod.Open(ctx); err != nil {
			return err
		}
		err := e.resume(ctx)
		if err == nil {
			return nil
		}
		var cerr *checkpointError
		if errors.As(err, &cerr) {
			e.prod.Close()
			return err
		}
		e.prod.Close()
		e.log.Warn().Err(err).Msg("cannot read the checkpoint yet; retrying with a new producer")
		if backoff.Sleep(ctx, b.Next()) != nil {
			return ctx.Err()
		}
	}
}

// checkpointError is a checkpoint the relay must not use.
type checkpointError struct{ msg string }

func (c *checkpointError) Error() string { return c.msg }

// resume reads the last committed checkpoint and keeps it (Kept hands it to
// the pipeline). Called right after the producer was initialised: no older producer
// can commit anything later.
func (e *Delivery) resume(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.TransactionTimeout+10*time.Second)
	defer cancel()
	topic := e.cfg.CheckpointTopic
	v, err := e.prod.ReadCheckpoint(rctx, topic, []byte(e.id))
	if err != nil {
		return err
	}
	if v == nil {
		e.log.Info().Str("topic", topic).Msg("no checkpoint yet: every PostgreSQL transaction from the slot's position is published")
		return nil
	}
	var cp Checkpoint
	err = json.Unmarshal(v, &cp)
	var pt history.Point
	if err == nil {
		pt, err = cp.point()
	}
	if err != nil {
		return &checkpointError{fmt.Sprintf("exactly_once.checkpoint_topic %s: the checkpoint of %s is not valid (%v); delete it (a tombstone for key %s) only if the slot was recreated, or choose another exactly_once.transactional_id",
			topic, e.id, err, e.id)}
	}
	if cp.SystemID != e.systemID {
		return &checkpointError{fmt.Sprintf("exactly_once.checkpoint_topic %s: the checkpoint of transactional id %s was written for PostgreSQL system_id %s (slot %s), but this server is system_id %s: "+
			"its LSNs mean nothing here. If the database was replaced on purpose, set a new exactly_once.transactional_id (or write a tombstone for key %s) and restart",
			topic, e.id, cp.SystemID, cp.Slot, e.systemID, e.id)}
	}
	if cp.Slot != "" && cp.Slot != e.opt.Slot {
		// Another slot's positions: applied, they would skip this slot's
		// transactions at or below them, which were never published.
		return &checkpointError{fmt.Sprintf("exactly_once.transactional_id %s is used by another slot: its checkpoint in %s was written for slot %s, and this relay reads slot %s. "+
			"Two slots must not share a transactional id (each would skip the other's transactions and fence the other's producer): "+
			"set exactly_once.transactional_id to an id of this slot's own (the default is outbox-relay-<slot>) and restart; "+
			"only if slot %s was renamed to %s on purpose, write a tombstone for key %s instead",
			e.id, topic, cp.Slot, e.opt.Slot, cp.Slot, e.opt.Slot, e.id)}
	}
	e.mu.Lock()
	e.keepLocked(pt)
	e.mu.Unlock()
	e.log.Info().Str("commit_lsn", cp.CommitLSN).Str("end_lsn", cp.EndLSN).Str("written_at", cp.WrittenAt).
		Str("history", pt.Mark.String()).
		Msg("read the checkpoint: transactions up to it are skipped only if the server is on its history and the stream shows its transaction again")
	return nil
}

// stop aborts what is open and closes the producer.
func (e *Delivery) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	if e.idleTimer != nil {
		e.idleTimer.Stop()
	}
	e.waitCommitLocked()
	if e.b.open {
		e.failLocked(errors.New("relay stopping"), nil, false)
	}
	e.prod.Close()
}

// Publish adds m to the open Kafka transaction (opening one). Its verdict
// comes once the transaction committed (OnAcked, or m.Done(nil)) or aborted
// (m.Done with a *sink.AbortError). After an abort, until the pipeline
// restarted, and while the producer is rebuilt, m fails at once. The
// replication loop's goroutine (or the retry goroutine); it blocks while a
// record is being isolated (one at a time) or sarama's input is full.
func (e *Delivery) Publish(ctx context.Context, m *sink.Message) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isolate > 0 {
		e.waitCommitLocked() // one record at a time, in a transaction of their own
	}
	if e.discard || e.reopen || !e.prod.Opened() {
		m.Done(&sink.AbortError{Cause: errors.New("the kafka transaction was aborted; the record comes again after the rewind")})
		return nil
	}
	e.applyLocked()
	e.b.opening(time.Now())
	if e.committing {
		e.pending = append(e.pending, m)
		return nil
	}
	if !e.begun {
		if err := e.prod.Begin(); err != nil {
			e.msgs = append(e.msgs, m)
			e.failLocked(fmt.Errorf("begin kafka transaction: %w", err), nil, false)
			return nil
		}
		e.begun = true
	}
	// The term's context, not the caller's (which never ends once a
	// transaction is registered): a stuck send must not outlive the term.
	ctx = e.context()
	if err := e.prod.Send(ctx, m); err != nil {
		return err
	}
	e.msgs = append(e.msgs, m)
	if e.isolate > 0 {
		e.isolate--
		if err := e.prod.Sync(ctx, m); err != nil {
			e.isolate = len(e.msgs) // the same records come again: one at a time again
			e.failLocked(err, map[*sink.Message]error{m: err}, false)
		}
	}
	return nil
}

// Begin is called by the pipeline before a PostgreSQL transaction (or a
// chunk of one) enters its tracker, on the replication loop goroutine. It
// skips nothing (what the checkpoint covers the pipeline skips, Kept). It
// commits the open Kafka transaction first when txn would not
// fit in it (never splitting a PostgreSQL transaction). It blocks while the
// producer is rebuilt (until ctx ends). replication.ErrRestart: an abort
// happened, the session must rewind.
func (e *Delivery) Begin(ctx context.Context, txn *decoder.Txn) error {
	var bytes int64 // as the pipeline's tracker counts them
	for i := range txn.Events {
		bytes += int64(len(txn.Events[i].Payload))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.waitReopenLocked(ctx); err != nil {
		return err
	}
	if e.discard {
		return replication.ErrRestart
	}
	n := len(txn.Events)
	commitFirst, err := e.b.check(txn.CommitLSN, n, bytes, txn.Partial)
	if err != nil {
		return err
	}
	if commitFirst {
		e.waitCommitLocked() // a commit in flight first: it sends what is pending
		if e.discard {
			return replication.ErrRestart
		}
		e.startCommitLocked()
	}
	// Counted in the batch at its first record (or its End): should the
	// pipeline stop before publishing any (its session ending between
	// Begin and the first Publish), the transactions before it still
	// commit. The pipeline builds and encodes the records before Begin.
	e.next = nextPG{n: n, bytes: bytes, set: true}
	return nil
}

// nextPG is (a chunk of) a PostgreSQL transaction Begin let in and the
// batch has not counted yet (applyLocked).
type nextPG struct {
	n     int
	bytes int64
	set   bool
}

// applyLocked counts the transaction Begin let in, once. Caller holds mu.
func (e *Delivery) applyLocked() {
	if e.next.set {
		e.b.begin(e.next.n, e.next.bytes)
		e.b.added(e.next.n, e.next.bytes)
		e.next = nextPG{}
	}
}

// End is called once every record of txn (or of this chunk of it) was
// handed to Publish: after the last chunk, a full Kafka transaction is
// committed now. The replication loop goroutine; does not block.
func (e *Delivery) End(txn *decoder.Txn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.discard {
		return
	}
	e.applyLocked() // a chunk none of whose records was published still counts
	if txn.Partial {
		return
	}
	// The age check here too, not only on the timer: under load the loop
	// goes from one PostgreSQL transaction to the next and the timer would
	// rarely find the boundary.
	e.last = history.Point{Mark: e.mark, CommitLSN: txn.CommitLSN, EndLSN: txn.EndLSN, Xid: txn.Xid, CommitTime: txn.CommitTime}
	if full := e.b.after(txn.CommitLSN, txn.EndLSN); (full || e.b.due(time.Now())) && !e.committing {
		e.startCommitLocked()
		return
	}
	e.armIdleLocked()
}

// armIdleLocked makes idleCheck run after max_batch_idle unless it is
// armed already, a commit is in flight (its end arms it) or nothing is
// open. Caller holds mu.
func (e *Delivery) armIdleLocked() {
	d := e.cfg.MaxBatchIdle
	if d <= 0 || e.opt.Activity == nil || e.idleArmed || e.committing || !e.b.open || e.stopped {
		return
	}
	e.idleArmed, e.seenAtArm = true, e.activity()
	if e.idleTimer == nil {
		e.idleTimer = time.AfterFunc(d, e.idleCheck)
	} else {
		e.idleTimer.Reset(d)
	}
}

// idleCheck commits the open Kafka transaction when no WAL message came
// since the timer was armed, max_batch_idle ago; otherwise it looks again
// after another max_batch_idle.
func (e *Delivery) idleCheck() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.idleArmed = false
	if e.discard || e.committing || e.stopped || !e.b.open || e.b.inPG {
		return // a commit's end, or the next after, arms it again
	}
	if e.activity() != e.seenAtArm {
		e.armIdleLocked()
		return
	}
	e.startCommitLocked()
}

// commitNextLocked follows a commit: the transaction that collected
// records meanwhile is committed at once when it is due, else once the
// stream is idle (group commit). Caller holds mu.
func (e *Delivery) commitNextLocked() {
	if e.discard || e.stopped || !e.b.open || e.b.inPG {
		return
	}
	if e.b.due(time.Now()) {
		e.startCommitLocked()
		return
	}
	e.armIdleLocked()
}

// Flush ends the session's Kafka transaction (the pipeline's Drain, before
// it waits for acks): committed when it holds whole PostgreSQL transactions
// only, aborted when one was cut off. It blocks until that commit settled.
func (e *Delivery) Flush() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waitCommitLocked()
	switch {
	case e.discard || !e.b.open && !e.b.inPG:
	case e.b.inPG:
		e.failLocked(errors.New("replication session ended inside a PostgreSQL transaction"), nil, false)
	default:
		e.startCommitLocked()
		e.waitCommitLocked()
	}
}

// Restart is called once the pipeline dropped what it had in flight and
// reads again from its watermark (after every Drain): records are taken
// again. Does not block.
func (e *Delivery) Restart() {
	e.mu.Lock()
	e.discard, e.next = false, nextPG{}
	e.b.inPG, e.b.pgEvents, e.b.pgBytes = false, 0, 0
	e.mu.Unlock()
}

// waitCommitLocked waits until no commit is in flight. Caller holds mu;
// it is released meanwhile.
func (e *Delivery) waitCommitLocked() {
	for e.committing {
		ch := e.commitDone
		e.mu.Unlock()
		<-ch
		e.mu.Lock()
	}
}

// startCommitLocked hands the open Kafka transaction to a commit goroutine
// (finishCommit); the next one collects records meanwhile. Caller holds mu,
// and no commit is in flight.
func (e *Delivery) startCommitLocked() {
	if !e.b.open || e.committing || e.reopen {
		return
	}
	batch, last := e.msgs, history.Point{}
	if e.b.endLSN != 0 { // the batch ends a PostgreSQL transaction: last is it
		last = e.last
	}
	e.msgs, e.begun = nil, false
	e.b.closed(false)
	e.committing = true
	done := make(chan struct{})
	e.commitDone = done
	go e.finishCommit(batch, last, done)
}

// finishCommit writes the checkpoint record (the last commit LSN of the
// batch) and commits. Success acks the batch (Done(nil): the tracker, and
// with it the slot, moves) and sends the records that waited; failure
// aborts, and fails both. It closes done once settled.
func (e *Delivery) finishCommit(batch []*sink.Message, last history.Point, done chan struct{}) {
	ctx := e.context()
	var err error
	var recs map[*sink.Message]error
	attempted := false
	if last.EndLSN != 0 {
		if last.Mark.SystemID == "" { // no session told its history (tests driving the pipeline alone)
			last.Mark.SystemID, last.Mark.Slot = e.systemID, e.opt.Slot
		}
		v, _ := json.Marshal(checkpointOf(last))
		cp := &sink.Message{Topic: e.cfg.CheckpointTopic, Key: []byte(e.id), Value: v, Timestamp: time.Now()}
		if serr := e.prod.Send(ctx, cp); serr != nil {
			err = fmt.Errorf("write checkpoint record: %w", serr)
		}
	}
	start := time.Now()
	if err == nil {
		attempted = true
		err, recs = e.prod.Commit(ctx)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	defer close(done)
	e.committing = false
	if err == nil && len(recs) == 0 {
		e.m.commit.Observe(time.Since(start).Seconds())
		e.m.committed.Inc()
		e.prod.SetConnected(true)
		e.m.events.Observe(float64(len(batch)))
		if last.EndLSN != 0 {
			e.keepLocked(last)
		}
		if e.acked != nil {
			e.acked(batch, time.Now())
		} else {
			for _, m := range batch {
				m.Done(nil)
			}
		}
		e.sendPendingLocked(ctx)
		e.commitNextLocked()
		return
	}
	if err == nil {
		err = errors.New("a record of the transaction failed")
	}
	unknown := attempted && len(recs) == 0 // EndTxn may have been sent: outcome unknown
	if len(recs) > 0 {
		// Which record the broker refused is unknown (see isolate): the
		// records go again one at a time.
		e.isolate = len(batch)
	}
	e.msgs = append(batch, e.pending...) // the pending ones never reached the producer
	e.pending = nil
	e.failLocked(fmt.Errorf("commit kafka transaction: %w", err), nil, unknown)
}

// sendPendingLocked begins the next Kafka transaction with the records
// that waited for the commit. Caller holds mu.
func (e *Delivery) sendPendingLocked(ctx context.Context) {
	pend := e.pending
	e.pending = nil
	if len(pend) == 0 {
		return
	}
	if e.discard {
		for _, m := range pend {
			m.Done(&sink.AbortError{Cause: errors.New("an earlier kafka transaction failed")})
		}
		return
	}
	if err := e.prod.Begin(); err != nil {
		e.msgs = append(e.msgs, pend...)
		e.failLocked(fmt.Errorf("begin kafka transaction: %w", err), nil, false)
		return
	}
	e.begun = true
	for i, m := range pend {
		if err := e.prod.Send(ctx, m); err != nil {
			e.msgs = append(e.msgs, pend[i:]...)
			e.failLocked(fmt.Errorf("send: %w", err), nil, false)
			return
		}
		e.msgs = append(e.msgs, m)
	}
}

// failLocked aborts the open Kafka transaction and fails its records with
// a *sink.AbortError: Own, with its error, for a record in recs (only one
// known to be refused itself), else aborted for another's sake (transient,
// and no attempt against on_poison). When the outcome of a commit is
// unknown, the producer is fatal or fenced, or the abort failed, it closes
// the producer and asks Run for a new one, which reads the checkpoint
// again; Begin and Kept wait for it, so the session after the rewind the
// failures cause finds the checkpoint current. Caller holds mu; of the network it waits only for
// the abort.
func (e *Delivery) failLocked(cause error, recs map[*sink.Message]error, unknown bool) {
	ctx := e.context()
	e.m.abortedTxns.Inc()
	msgs := e.msgs
	e.msgs, e.discard, e.begun, e.next = nil, true, false, nextPG{}
	e.b.closed(true)
	rebuild := unknown || e.reopen || !e.prod.Opened() || e.prod.Fatal() || sink.IsFenced(cause)
	if !rebuild {
		aerr, _ := e.prod.Abort(ctx)
		if aerr != nil {
			e.log.Warn().Err(aerr).Msg("abort kafka transaction failed; building a new producer")
			rebuild = true
		}
	}
	e.log.Warn().Err(cause).Int("records", len(msgs)).Bool("new_producer", rebuild).
		Msg("kafka transaction aborted: rewinding to the ack watermark; what the checkpoint covers is skipped once verified")
	if rebuild && !e.reopen {
		e.prod.Close()
		e.reopen = true
		select {
		case e.rebuild <- struct{}{}:
		default:
		}
	}
	e.prod.SetConnected(false)
	for _, m := range msgs {
		if err := recs[m]; err != nil {
			m.Done(&sink.AbortError{Cause: err, Own: true})
			continue
		}
		m.Done(&sink.AbortError{Cause: cause})
	}
}
