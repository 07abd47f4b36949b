package relay

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
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// exactlyOnce is the publisher of delivery: exactly_once. The pipeline
// publishes into it as into the at-least-once producer; it groups whole
// PostgreSQL transactions into Kafka transactions (batcher), ends each with
// a checkpoint record (the last commit LSN it holds) in the compacted
// checkpoint topic, and calls every record's Done only once CommitTxn
// succeeded: the commit is the ack, so the tracker, and with it the slot,
// moves only past committed transactions. Any failure aborts the Kafka
// transaction and fails its records with a transient error: the pipeline
// rewinds (rewind.go) and the checkpoint filter (skipThrough) drops, on the
// way back, every PostgreSQL transaction already committed.
//
// Run opens the transactional producer (fencing older ones with the same
// transactional id), reads the checkpoint, then commits batches as they
// age. Publish, before, after, flush and rewound come from the pipeline;
// every method takes mu, so a commit never interleaves with a publish.
type exactlyOnce struct {
	cfg  Config
	prod txnSink
	// prepare makes the checkpoint topic and learns the server's system
	// id (tests swap it).
	prepare func(ctx context.Context) error
	log     zerolog.Logger
	m       eosMetrics
	// valid checks with a round trip that the lease is still ours (nil
	// without election): a deposed leader must not fence the new one's
	// producer.
	valid func(ctx context.Context) error

	ready     chan struct{}
	closing   chan struct{}
	closeOnce sync.Once
	fatal     chan error // ends the term: lost leadership, or a checkpoint it must not use
	ctx       atomic.Pointer[context.Context]

	skip     atomic.Uint64 // commit LSN of the last committed PostgreSQL transaction (checkpoint)
	systemID string

	mu      sync.Mutex
	b       batcher
	msgs    []*sink.Message // records of the open Kafka transaction, checkpoint excluded
	discard bool            // aborted: refuse records until the pipeline rewound
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
	// once no WAL message reached the pipeline for this long (seen did not
	// move since the timer was armed at seenAtArm) and no commit is in
	// flight. A drain never idles that long, a quiet stream does at once.
	seen      atomic.Uint64 // WAL messages handled (pipeline.Handle)
	seenAtArm uint64
	idleTimer *time.Timer
	idleArmed bool
	stopped   bool // the term ended: no commit starts any more
}

// txnSink is what exactlyOnce needs of the transactional producer
// (*sink.TxnProducer; tests use a fake).
type txnSink interface {
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

// errAborted is what the records of an aborted Kafka transaction fail
// with: transient, so the pipeline rewinds and publishes them again.
var errAborted = errors.New("kafka transaction aborted")

// checkpointRecord is the value of a checkpoint record (design: key = the
// transactional id).
type checkpointRecord struct {
	Slot      string `json:"slot"`
	SystemID  string `json:"system_id"`
	CommitLSN string `json:"commit_lsn"`
	EndLSN    string `json:"end_lsn"`
	WrittenAt string `json:"written_at"`
}

type eosMetrics struct {
	txns        *prometheus.CounterVec
	events      prometheus.Histogram
	commit      prometheus.Histogram
	skipped     prometheus.Counter
	committed   prometheus.Counter
	abortedTxns prometheus.Counter
}

func newEOSMetrics(reg prometheus.Registerer) eosMetrics {
	m := eosMetrics{
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

func newExactlyOnce(cfg Config, log zerolog.Logger, reg prometheus.Registerer, valid func(ctx context.Context) error) (*exactlyOnce, error) {
	prod, err := sink.NewTxn(cfg.Kafka, cfg.TxnID(), cfg.ExactlyOnce.TransactionTimeout, log)
	if err != nil {
		return nil, err
	}
	// The at-least-once producer's series (events published, errors), so
	// dashboards work in both modes; it is never run.
	counters, err := sink.New(cfg.Kafka, log, reg)
	if err != nil {
		return nil, err
	}
	prod.SetMetrics(counters)
	e := &exactlyOnce{cfg: cfg, prod: prod, valid: valid, m: newEOSMetrics(reg),
		log:   log.With().Str("component", "exactly_once").Str("transactional_id", cfg.TxnID()).Logger(),
		ready: make(chan struct{}), closing: make(chan struct{}), fatal: make(chan error, 1),
		b: batcher{maxEvents: cfg.ExactlyOnce.MaxBatchEvents, inflightEvents: cfg.InFlight.MaxEvents,
			inflightBytes: cfg.InFlight.MaxBytes, interval: cfg.ExactlyOnce.MaxBatchInterval}}
	e.prepare = e.prepareKafkaAndPostgres
	return e, nil
}

// Ready is closed once the producer is initialised and the checkpoint read:
// the stream may start.
func (e *exactlyOnce) Ready() <-chan struct{} { return e.ready }

// Connected reports whether the last transaction went through.
func (e *exactlyOnce) Connected() bool { return e.prod.Connected() }

// Close stops Run: an open Kafka transaction is aborted (its events are
// unacked; the slot keeps them). Idempotent.
func (e *exactlyOnce) Close() { e.closeOnce.Do(func() { close(e.closing) }) }

// skipThrough is the commit LSN at or below which PostgreSQL transactions
// are already in Kafka.
func (e *exactlyOnce) skipThrough() pglogrepl.LSN { return pglogrepl.LSN(e.skip.Load()) }

func (e *exactlyOnce) raiseSkip(lsn pglogrepl.LSN) {
	for cur := e.skip.Load(); uint64(lsn) > cur && !e.skip.CompareAndSwap(cur, uint64(lsn)); cur = e.skip.Load() {
	}
}

func (e *exactlyOnce) context() context.Context {
	if c := e.ctx.Load(); c != nil {
		return *c
	}
	return context.Background()
}

// Run prepares the checkpoint topic, opens the producer, reads the
// checkpoint, then commits Kafka transactions as they reach
// exactly_once.max_batch_interval, until Close or ctx ends.
func (e *exactlyOnce) Run(ctx context.Context) error {
	e.ctx.Store(&ctx)
	if err := e.start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, context.Canceled) {
			e.log.Warn().Err(err).Msg("term ends")
		}
		return err
	}
	close(e.ready)
	tick := time.NewTicker(max(time.Millisecond, e.cfg.ExactlyOnce.MaxBatchInterval/4))
	defer tick.Stop()
	defer e.stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.closing:
			return nil
		case err := <-e.fatal:
			if errors.Is(err, context.Canceled) {
				e.log.Warn().Err(err).Msg("term ends")
			}
			return err
		case now := <-tick.C:
			e.mu.Lock()
			if !e.discard && !e.committing && e.b.due(now) {
				e.startCommitLocked()
			}
			e.mu.Unlock()
		}
	}
}

// start makes the checkpoint topic, learns the server's system id, opens
// the producer and reads the checkpoint; network errors are retried.
func (e *exactlyOnce) start(ctx context.Context) error {
	if err := e.prepare(ctx); err != nil {
		return err
	}
	return e.open(ctx)
}

// prepareKafkaAndPostgres creates or checks the checkpoint topic and reads
// the server's system identifier, retrying what may heal.
func (e *exactlyOnce) prepareKafkaAndPostgres(ctx context.Context) error {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	for {
		err := sink.EnsureCheckpointTopic(e.cfg.Kafka, e.cfg.ExactlyOnce.CheckpointTopic)
		if err == nil {
			break
		}
		if errors.Is(err, sink.ErrNotCompacted) {
			return err
		}
		e.log.Warn().Err(err).Msg("cannot check the checkpoint topic yet; retrying")
		if backoff.Sleep(ctx, b.Next()) != nil {
			return ctx.Err()
		}
	}
	for {
		id, err := pg.IdentifySystem(ctx, e.cfg.Postgres.URL)
		if err == nil {
			e.systemID = id.SystemID
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
func (e *exactlyOnce) open(ctx context.Context) error {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	for {
		if e.valid != nil {
			if err := e.valid(ctx); err != nil {
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

// resume reads the last committed checkpoint and raises the skip filter to
// it. Called right after the producer was initialised: no older producer
// can commit anything later.
func (e *exactlyOnce) resume(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ExactlyOnce.TransactionTimeout+10*time.Second)
	defer cancel()
	topic := e.cfg.ExactlyOnce.CheckpointTopic
	v, err := e.prod.ReadCheckpoint(rctx, topic, []byte(e.cfg.TxnID()))
	if err != nil {
		return err
	}
	if v == nil {
		e.log.Info().Str("topic", topic).Msg("no checkpoint yet: every PostgreSQL transaction from the slot's position is published")
		return nil
	}
	var cp checkpointRecord
	if err := json.Unmarshal(v, &cp); err != nil {
		return &checkpointError{fmt.Sprintf("exactly_once.checkpoint_topic %s: the checkpoint of %s is not valid JSON (%v); delete it (a tombstone for key %s) only if the slot was recreated, or choose another exactly_once.transactional_id",
			topic, e.cfg.TxnID(), err, e.cfg.TxnID())}
	}
	commit, err1 := pglogrepl.ParseLSN(cp.CommitLSN)
	if _, err2 := pglogrepl.ParseLSN(cp.EndLSN); err1 != nil || err2 != nil {
		return &checkpointError{fmt.Sprintf("exactly_once.checkpoint_topic %s: the checkpoint of %s has invalid LSNs %q/%q", topic, e.cfg.TxnID(), cp.CommitLSN, cp.EndLSN)}
	}
	if cp.SystemID != e.systemID {
		return &checkpointError{fmt.Sprintf("exactly_once.checkpoint_topic %s: the checkpoint of transactional id %s was written for PostgreSQL system_id %s (slot %s), but this server is system_id %s: "+
			"its LSNs mean nothing here. If the database was replaced on purpose, set a new exactly_once.transactional_id (or write a tombstone for key %s) and restart",
			topic, e.cfg.TxnID(), cp.SystemID, cp.Slot, e.systemID, e.cfg.TxnID())}
	}
	e.raiseSkip(commit)
	e.log.Info().Str("commit_lsn", cp.CommitLSN).Str("end_lsn", cp.EndLSN).Str("written_at", cp.WrittenAt).
		Msg("resuming from the checkpoint: PostgreSQL transactions committed at or before commit_lsn are skipped")
	return nil
}

// stop aborts what is open and closes the producer.
func (e *exactlyOnce) stop() {
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

// Publish adds m to the open Kafka transaction (opening one). m.Done is
// called once the transaction committed or aborted. After an abort, until
// the pipeline rewound, m fails at once.
func (e *exactlyOnce) Publish(ctx context.Context, m *sink.Message) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isolate > 0 {
		e.waitCommitLocked() // one record at a time, in a transaction of their own
	}
	if e.discard || !e.prod.Opened() {
		m.Done(errAborted)
		return nil
	}
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

// before is called by the pipeline before a PostgreSQL transaction (or a
// chunk of one) enters the tracker. It commits the open Kafka transaction
// first when the PostgreSQL transaction would not fit it. ErrRestart: an
// abort happened, the session must rewind.
func (e *exactlyOnce) before(txn *eosTxn) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.discard {
		return replication.ErrRestart
	}
	commitFirst, err := e.b.before(txn.commit, txn.events, txn.bytes, txn.partial)
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
	e.b.added(txn.events, txn.bytes)
	return nil
}

// after is called once the last chunk of a PostgreSQL transaction was
// published: a full Kafka transaction is committed now.
func (e *exactlyOnce) after(commit, end pglogrepl.LSN) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.discard {
		return
	}
	// The age check here too, not only on the timer: under load the loop
	// goes from one PostgreSQL transaction to the next and the timer would
	// rarely find the boundary.
	if full := e.b.after(commit, end); (full || e.b.due(time.Now())) && !e.committing {
		e.startCommitLocked()
		return
	}
	e.armIdleLocked()
}

// handled counts a WAL message reaching the pipeline (the replication
// loop, per message: one atomic add).
func (e *exactlyOnce) handled() { e.seen.Add(1) }

// armIdleLocked makes idleCheck run after max_batch_idle unless it is
// armed already, a commit is in flight (its end arms it) or nothing is
// open. Caller holds mu.
func (e *exactlyOnce) armIdleLocked() {
	d := e.cfg.ExactlyOnce.MaxBatchIdle
	if d <= 0 || e.idleArmed || e.committing || !e.b.open || e.stopped {
		return
	}
	e.idleArmed, e.seenAtArm = true, e.seen.Load()
	if e.idleTimer == nil {
		e.idleTimer = time.AfterFunc(d, e.idleCheck)
	} else {
		e.idleTimer.Reset(d)
	}
}

// idleCheck commits the open Kafka transaction when no WAL message came
// since the timer was armed, max_batch_idle ago; otherwise it looks again
// after another max_batch_idle.
func (e *exactlyOnce) idleCheck() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.idleArmed = false
	if e.discard || e.committing || e.stopped || !e.b.open || e.b.inPG {
		return // a commit's end, or the next after, arms it again
	}
	if e.seen.Load() != e.seenAtArm {
		e.armIdleLocked()
		return
	}
	e.startCommitLocked()
}

// commitNextLocked follows a commit: the transaction that collected
// records meanwhile is committed at once when it is due, else once the
// stream is idle (group commit). Caller holds mu.
func (e *exactlyOnce) commitNextLocked() {
	if e.discard || e.stopped || !e.b.open || e.b.inPG {
		return
	}
	if e.b.due(time.Now()) {
		e.startCommitLocked()
		return
	}
	e.armIdleLocked()
}

// flush ends the session's Kafka transaction (Drain): committed when it
// holds whole PostgreSQL transactions only, aborted when one was cut off.
func (e *exactlyOnce) flush() {
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

// rewound is called when the pipeline restarted the stream after an abort.
func (e *exactlyOnce) rewound() {
	e.mu.Lock()
	e.discard = false
	e.b.inPG, e.b.pgEvents, e.b.pgBytes = false, 0, 0
	e.mu.Unlock()
}

// skipped counts n events skipped by the checkpoint filter.
func (e *exactlyOnce) skipped(n int) { e.m.skipped.Add(float64(n)) }

// waitCommitLocked waits until no commit is in flight. Caller holds mu;
// it is released meanwhile.
func (e *exactlyOnce) waitCommitLocked() {
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
func (e *exactlyOnce) startCommitLocked() {
	if !e.b.open || e.committing {
		return
	}
	batch, commitLSN, endLSN := e.msgs, e.b.commitLSN, e.b.endLSN
	e.msgs, e.begun = nil, false
	e.b.closed(false)
	e.committing = true
	done := make(chan struct{})
	e.commitDone = done
	go e.finishCommit(batch, commitLSN, endLSN, done)
}

// finishCommit writes the checkpoint record (the last commit LSN of the
// batch) and commits. Success acks the batch (Done(nil): the tracker, and
// with it the slot, moves) and sends the records that waited; failure
// aborts, and fails both. It closes done once settled.
func (e *exactlyOnce) finishCommit(batch []*sink.Message, commitLSN, endLSN pglogrepl.LSN, done chan struct{}) {
	ctx := e.context()
	var err error
	var recs map[*sink.Message]error
	attempted := false
	if endLSN != 0 {
		v, _ := json.Marshal(checkpointRecord{Slot: e.cfg.Postgres.Slot, SystemID: e.systemID, CommitLSN: commitLSN.String(),
			EndLSN: endLSN.String(), WrittenAt: time.Now().UTC().Format(time.RFC3339Nano)})
		cp := &sink.Message{Topic: e.cfg.ExactlyOnce.CheckpointTopic, Key: []byte(e.cfg.TxnID()), Value: v, Timestamp: time.Now()}
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
		if commitLSN != 0 {
			e.raiseSkip(commitLSN)
		}
		for _, m := range batch {
			m.Done(nil)
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
func (e *exactlyOnce) sendPendingLocked(ctx context.Context) {
	pend := e.pending
	e.pending = nil
	if len(pend) == 0 {
		return
	}
	if e.discard {
		for _, m := range pend {
			m.Done(errAborted)
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

// failLocked aborts the open Kafka transaction and fails its records: each
// with its error in recs (only a record known to be refused itself), else
// errAborted (transient, and no attempt against on_poison). When the
// outcome of a commit is unknown, the producer is fatal or the abort
// failed, it builds a new producer and reads the checkpoint again before
// failing them, so the rewind they cause finds the filter current.
// Caller holds mu.
func (e *exactlyOnce) failLocked(cause error, recs map[*sink.Message]error, unknown bool) {
	ctx := e.context()
	e.m.abortedTxns.Inc()
	msgs := e.msgs
	e.msgs, e.discard, e.begun = nil, true, false
	e.b.closed(true)
	rebuild := unknown || !e.prod.Opened() || e.prod.Fatal() || sink.IsFenced(cause)
	if !rebuild {
		aerr, _ := e.prod.Abort(ctx)
		if aerr != nil {
			e.log.Warn().Err(aerr).Msg("abort kafka transaction failed; building a new producer")
			rebuild = true
		}
	}
	e.log.Warn().Err(cause).Int("records", len(msgs)).Bool("new_producer", rebuild).
		Msg("kafka transaction aborted: rewinding to the ack watermark; the checkpoint filter skips what is already committed")
	if rebuild {
		e.prod.Close()
		if err := e.open(ctx); err != nil {
			select {
			case e.fatal <- err:
			default:
			}
		}
	}
	e.prod.SetConnected(false)
	for _, m := range msgs {
		err := recs[m]
		if err == nil {
			err = fmt.Errorf("%w: %v", errAborted, cause) // %v: the cause's kind is not the record's
		}
		m.Done(err)
	}
}

// eosTxn is a PostgreSQL transaction (or chunk) as the batcher sees it.
type eosTxn struct {
	commit  pglogrepl.LSN
	events  int
	bytes   int64
	partial bool
}
