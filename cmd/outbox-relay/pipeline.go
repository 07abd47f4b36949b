package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// publisher is what the pipeline needs from the sink. Publish is called
// from the replication loop and from the retry goroutine.
type publisher interface {
	Publish(ctx context.Context, m *sink.Message) error
}

// rowMarker is what the pipeline needs from the dead-letter store.
type rowMarker interface {
	MarkDead(ctx context.Context, id int64, attempts int, lastErr string) (bool, error)
	MarkFailed(ctx context.Context, id int64, attempts int, lastErr string) error
}

// poisonPolicy says what happens to an event that can never be published as
// it is (config on_poison and dead_letter.*).
type poisonPolicy struct {
	halt         bool
	topic        string        // dead-letter topic
	maxAttempts  int           // publish attempts before the policy applies
	backoff      time.Duration // first backoff between attempts of a poison event
	transientMax time.Duration // cap of the backoff of transient errors
}

// pipeline is the glue of the data path: replication hands it WAL, it
// decodes, registers each transaction with the tracker (in log order, which
// is where backpressure blocks), and publishes. Acks come back through each
// message's Done into the tracker. It implements replication.Progress.
type pipeline struct {
	table   string
	dec     *decoder.Decoder // owned by the replication loop goroutine
	tracker *checkpoint.Tracker
	pub     publisher
	tmpl    sink.Template
	marker  rowMarker
	policy  poisonPolicy
	log     zerolog.Logger
	// pubCtx outlives the run context by the shutdown timeout: once a
	// transaction is registered with the tracker, all its events must reach
	// the producer, or the final drain waits for acks that cannot come.
	pubCtx context.Context

	retries   retryQueue
	halted    atomic.Pointer[error] // why publishing stopped; nil while it goes on
	otherRows atomic.Uint64
	decoded   atomic.Uint64
	resent    atomic.Uint64
	prevDec   decoder.Counts

	commitToAck  prometheus.Histogram
	deadLettered *prometheus.CounterVec
	haltedGauge  prometheus.Gauge
}

func newPipeline(table string, tracker *checkpoint.Tracker, pub publisher, tmpl sink.Template, marker rowMarker,
	policy poisonPolicy, pubCtx context.Context, log zerolog.Logger, reg prometheus.Registerer) (*pipeline, error) {
	p := &pipeline{table: table, tracker: tracker, pub: pub, tmpl: tmpl, marker: marker, policy: policy, pubCtx: pubCtx,
		log: log.With().Str("component", "pipeline").Logger()}
	p.retries.wake = make(chan struct{}, 1)
	go p.runRetries(pubCtx)
	if err := p.resetDecoder(); err != nil {
		return nil, err
	}
	p.commitToAck = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outbox_relay_commit_to_ack_seconds",
		Help:    "Time from the PostgreSQL commit of an event's transaction to the Kafka ack (acks=all).",
		Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5, 10, 30, 60},
	})
	p.deadLettered = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_dead_lettered_total",
		Help: "Poison events written to the dead-letter topic (acked), by reason."}, []string{"reason"})
	for _, r := range []string{deadletter.ReasonBadRow, deadletter.ReasonInvalidTopic, "message_too_large", "broker_rejected"} {
		p.deadLettered.WithLabelValues(r)
	}
	p.haltedGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_halted",
		Help: "1 when publishing stopped on a poison event (on_poison: halt, or the dead-letter write failed)."})
	if reg != nil {
		reg.MustRegister(p.commitToAck, p.deadLettered, p.haltedGauge,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_inflight_events",
				Help: "Events published and not yet acked by Kafka."},
				func() float64 { e, _ := tracker.InFlight(); return float64(e) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_inflight_bytes",
				Help: "Payload bytes published and not yet acked by Kafka."},
				func() float64 { _, b := tracker.InFlight(); return float64(b) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_acked_lsn",
				Help: "Watermark: every event before this WAL position is acked by Kafka."},
				func() float64 { return float64(tracker.Flushed()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_events_decoded_total",
				Help: "Outbox events decoded from the slot."},
				func() float64 { return float64(p.decoded.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_other_table_rows_total",
				Help: "Inserts of other tables seen in the stream and ignored."},
				func() float64 { return float64(p.otherRows.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_resent_transactions_skipped_total",
				Help: "Transactions the server resent below the confirmed watermark, already delivered."},
				func() float64 { return float64(p.resent.Load()) }),
		)
	}
	return p, nil
}

// Handle is the replication.Handler. It runs on the replication loop
// goroutine and blocks while the in-flight limits are reached, and for good
// once the pipeline halted (the slot stays where it is; keepalives go on).
func (p *pipeline) Handle(ctx context.Context, walStart pglogrepl.LSN, walData []byte) error {
	if err := p.waitIfHalted(ctx); err != nil {
		return err
	}
	txn, err := p.dec.Decode(walStart, walData)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if txn == nil {
		return nil
	}
	p.countDecoder() // per transaction or chunk, not per message; Drain counts the rest
	if txn.CommitLSN < p.tracker.Flushed() {
		// Already delivered and confirmed: the server resends a transaction
		// iff its commit LSN >= the confirmed position, so this is a resend
		// after a reconnect that raced our last status update.
		if !txn.Partial {
			p.resent.Add(1)
		}
		return nil
	}
	ds := make([]delivery, len(txn.Events))
	var bytes int64
	commitLSN := txn.CommitLSN.String()
	for i := range txn.Events {
		ev := &txn.Events[i]
		d := &ds[i]
		*d = delivery{p: p, id: ev.ID, lsn: ev.LSN, commit: txn.CommitTime, size: int64(len(ev.Payload))}
		hdrs, key := headers(ev, commitLSN)
		d.msg = sink.Message{Key: key, Value: ev.Payload, Headers: hdrs, Timestamp: txn.CommitTime, Done: d.done}
		bytes += d.size
		if ev.Err != nil {
			// The WAL bytes never change: no attempt can succeed.
			if err := p.poisonRow(ctx, d, deadletter.ReasonBadRow, ev.Err); err != nil {
				return err
			}
			continue
		}
		topic, err := p.tmpl.Render(ev.AggregateType, ev.EventType)
		if err != nil {
			err = fmt.Errorf("route outbox row %s id=%d at LSN %s (aggregate_type %q, event_type %q): %w; fix kafka.topic_template or the row",
				p.table, ev.ID, ev.LSN, ev.AggregateType, ev.EventType, err)
			if err := p.poisonRow(ctx, d, deadletter.ReasonInvalidTopic, err); err != nil {
				return err
			}
			continue
		}
		d.msg.Topic = topic
	}
	// A Partial chunk is added with end 0: it cannot move the watermark.
	pend, err := p.tracker.Add(ctx, txn.EndLSN, len(ds), bytes)
	if err != nil {
		return err
	}
	for i := range ds {
		d := &ds[i]
		d.pend = pend
		if p.log.Debug().Enabled() {
			p.log.Debug().Int64("id", d.id).Str("lsn", d.lsn.String()).Str("topic", d.msg.Topic).Msg("publish")
		}
		if err := p.pub.Publish(p.pubCtx, &d.msg); err != nil {
			return err
		}
	}
	return nil
}

// poisonRow handles an event that cannot even be built (a bad row, an
// invalid topic), before its transaction enters the tracker: under halt it
// stops here, so nothing of the transaction is published or confirmed;
// under dlq the event becomes its dead letter at once.
func (p *pipeline) poisonRow(ctx context.Context, d *delivery, reason string, err error) error {
	d.attempts = 1
	if p.policy.halt {
		p.halt(d, err)
		return p.waitIfHalted(ctx)
	}
	p.toDeadLetter(d, reason, err)
	return nil
}

// delivery is one event on its way to Kafka, through retries and maybe the
// dead-letter topic. Its Done runs on the producer's goroutines.
type delivery struct {
	p        *pipeline
	pend     *checkpoint.Pending
	msg      sink.Message
	id       int64
	lsn      pglogrepl.LSN
	commit   time.Time
	size     int64
	attempts int                // failed publish attempts so far
	letter   *deadletter.Letter // set once the event is being dead-lettered
}

func (d *delivery) done(err error) {
	p := d.p
	if err == nil {
		if d.letter == nil {
			p.commitToAck.Observe(time.Since(d.commit).Seconds())
			d.pend.Ack(d.size)
			return
		}
		p.deadLettered.WithLabelValues(d.letter.Reason).Inc()
		go p.markDead(d) // acks once the row says so
		return
	}
	d.attempts++
	reason, kind := sink.Classify(err)
	ev := p.log.With().Int64("id", d.id).Str("lsn", d.lsn.String()).Str("topic", d.msg.Topic).
		Str("reason", reason).Int("attempt", d.attempts).Logger()
	switch {
	case kind == sink.Transient:
		// Retried for ever; the tracker holds the slot before this event
		// meanwhile, whatever is acked after it.
		if d.attempts&(d.attempts-1) == 0 { // 1, 2, 4, 8...: a steady trickle, not a flood
			ev.Warn().Err(err).Msg("transient publish error; retrying until the broker takes it")
		}
		p.retry(d, backoff.Policy{Initial: transientFirst, Max: p.policy.transientMax}.Delay(d.attempts))
	case d.letter != nil:
		p.halt(d, fmt.Errorf("write dead letter of outbox row %s id=%d to topic %s: %w", p.table, d.id, d.msg.Topic, err))
	case kind == sink.Refused:
		// Not the event's fault: dead-lettering would empty the outbox into the DLQ.
		p.halt(d, fmt.Errorf("publish outbox row %s id=%d at LSN %s: %w; grant the relay's Kafka user write access to the topic", p.table, d.id, d.lsn, err))
	case d.attempts < p.policy.maxAttempts:
		ev.Warn().Err(err).Msg("publish rejected; retrying before on_poison applies")
		p.retry(d, backoff.Policy{Initial: p.policy.backoff, Max: time.Minute}.Delay(d.attempts))
	case p.policy.halt:
		p.halt(d, fmt.Errorf("publish outbox row %s id=%d at LSN %s: %w", p.table, d.id, d.lsn, err))
	default:
		p.toDeadLetter(d, reason, fmt.Errorf("publish to topic %s: %w", d.msg.Topic, err))
		p.retry(d, 0) // never publish from the producer's goroutine: its input may be full
	}
}

// transientFirst is the first backoff of a transient error, as sarama's own.
const transientFirst = 100 * time.Millisecond

// retryQueue holds failed events until their backoff passes. One goroutine
// republishes them in the order they failed: sarama reports the records of
// a partition in order, so they are resent in order, whatever their
// backoffs (per-message timers with jitter would shuffle them).
type retryQueue struct {
	mu    sync.Mutex
	items []retryItem
	wake  chan struct{}
}

type retryItem struct {
	d   *delivery
	due time.Time
}

func (p *pipeline) retry(d *delivery, after time.Duration) {
	q := &p.retries
	q.mu.Lock()
	q.items = append(q.items, retryItem{d, time.Now().Add(after)})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// runRetries is the retry goroutine; it runs until ctx (pubCtx) ends.
func (p *pipeline) runRetries(ctx context.Context) {
	q := &p.retries
	for {
		q.mu.Lock()
		if len(q.items) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		head := q.items[0]
		q.mu.Unlock()
		if wait := time.Until(head.due); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
		q.mu.Lock()
		q.items[0] = retryItem{}
		q.items = q.items[1:]
		q.mu.Unlock()
		// If the relay is shutting down the event stays unacked: the slot keeps it.
		if err := p.pub.Publish(ctx, &head.d.msg); err != nil {
			p.log.Warn().Err(err).Int64("id", head.d.id).Msg("not resent: shutting down; the slot keeps the event")
			return
		}
	}
}

// toDeadLetter turns d into its dead letter: the dead-letter topic, the same
// key, the payload unless it is what the broker refused, and the dlq.*
// headers. The caller publishes it.
func (p *pipeline) toDeadLetter(d *delivery, reason string, cause error) {
	d.letter = &deadletter.Letter{Table: p.table, ID: d.id, LSN: d.lsn, Topic: d.msg.Topic, Key: d.msg.Key,
		Value: d.msg.Value, Headers: d.msg.Headers, Reason: reason, Err: cause.Error(), Attempts: d.attempts,
		OmitPayload: reason == "message_too_large"}
	value, headers := d.letter.Record(time.Now())
	d.msg = sink.Message{Topic: p.policy.topic, Key: d.msg.Key, Value: value, Headers: headers,
		Timestamp: d.msg.Timestamp, Done: d.done}
	p.log.Error().Err(cause).Int64("id", d.id).Str("lsn", d.lsn.String()).Str("reason", reason).
		Str("dlq_topic", p.policy.topic).Int("attempts", d.attempts).
		Msg("poison event: dead-lettering it; later events of its aggregate go on")
}

// markDead records the dead letter on the outbox row, then acks the event:
// only a dead letter that is both in Kafka and findable with SQL lets the
// slot move past it. PostgreSQL being down is waited out.
func (p *pipeline) markDead(d *delivery) {
	for attempt := 1; d.id != 0; attempt++ {
		found, err := p.marker.MarkDead(p.pubCtx, d.id, d.letter.Attempts, d.letter.Err)
		if err == nil {
			if !found {
				p.log.Warn().Int64("id", d.id).Msg("dead-lettered outbox row no longer exists; the dead letter holds the event")
			}
			break
		}
		if p.pubCtx.Err() != nil {
			return // shutting down: unacked, so the event comes back after restart
		}
		p.log.Warn().Err(err).Int64("id", d.id).Msg("cannot mark the dead-lettered row yet; retrying")
		select {
		case <-time.After(backoff.Policy{Initial: time.Second, Max: 30 * time.Second}.Delay(attempt)):
		case <-p.pubCtx.Done():
			return
		}
	}
	d.pend.Ack(d.size)
}

// halt stops publishing for good: nothing after this is read, the slot
// stays before the event, /readyz fails. The row records why.
func (p *pipeline) halt(d *delivery, err error) {
	if !p.halted.CompareAndSwap(nil, &err) {
		return
	}
	p.haltedGauge.Set(1)
	p.log.Error().Err(err).Str("table", p.table).Int64("id", d.id).Str("lsn", d.lsn.String()).
		Msg("HALTED: publishing stopped at a poison event and the slot is held before it; fix the cause, then restart the relay (or use on_poison: dlq)")
	if d.id != 0 {
		go func() {
			if err := p.marker.MarkFailed(p.pubCtx, d.id, d.attempts, err.Error()); err != nil {
				p.log.Warn().Err(err).Msg("could not record the error on the outbox row")
			}
		}()
	}
}

// Halted returns why publishing stopped, or nil. Any goroutine (/readyz).
func (p *pipeline) Halted() error {
	if e := p.halted.Load(); e != nil {
		return *e
	}
	return nil
}

// waitIfHalted blocks until ctx ends once the pipeline halted.
func (p *pipeline) waitIfHalted(ctx context.Context) error {
	if p.halted.Load() == nil {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// resetDecoder starts a fresh decoder (a new session resends relations) whose
// chunks keep one transaction's buffered events well inside the in-flight
// limits, so a transaction of any size streams in bounded memory.
func (p *pipeline) resetDecoder() error {
	dec, err := decoder.New(p.table)
	if err != nil {
		return err
	}
	events, bytes := p.tracker.Limits()
	dec.SetChunk(min(1000, max(1, events/2)), int(max(1, bytes/2)))
	p.dec, p.prevDec = dec, decoder.Counts{}
	return nil
}

func (p *pipeline) countDecoder() {
	c := p.dec.Counts()
	p.otherRows.Add(c.OtherTableRows - p.prevDec.OtherTableRows)
	p.decoded.Add(c.Events - p.prevDec.Events)
	p.prevDec = c
}

// Header keys the relay sets on every record. sarama only reads them, so
// one copy serves every event.
var (
	hdrEventID       = []byte("event_id")
	hdrEventType     = []byte("event_type")
	hdrAggregateType = []byte("aggregate_type")
	hdrAggregateID   = []byte("aggregate_id")
	hdrLSN           = []byte("pg_lsn")
)

// headers builds the Kafka headers of one event: the relay's own, then each
// top-level key of the row's headers column. The values of all of them
// share one allocation; the key of the record is the aggregate_id header's
// value. commitLSN is the transaction's commit LSN, rendered once.
func headers(ev *decoder.Event, commitLSN string) (h []sarama.RecordHeader, key []byte) {
	n := 20 + len(ev.EventType) + len(ev.AggregateType) + len(ev.AggregateID) + len(commitLSN)
	for _, x := range ev.Headers {
		n += len(x.Key)
	}
	buf := make([]byte, 0, n)
	add := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	start := len(buf)
	buf = strconv.AppendInt(buf, ev.ID, 10)
	id := buf[start:len(buf):len(buf)]
	key = add(ev.AggregateID)
	h = make([]sarama.RecordHeader, 5, 5+len(ev.Headers))
	h[0] = sarama.RecordHeader{Key: hdrEventID, Value: id}
	h[1] = sarama.RecordHeader{Key: hdrEventType, Value: add(ev.EventType)}
	h[2] = sarama.RecordHeader{Key: hdrAggregateType, Value: add(ev.AggregateType)}
	h[3] = sarama.RecordHeader{Key: hdrAggregateID, Value: key}
	h[4] = sarama.RecordHeader{Key: hdrLSN, Value: add(commitLSN)}
	for _, x := range ev.Headers {
		h = append(h, sarama.RecordHeader{Key: add(x.Key), Value: x.Value})
	}
	return h, key
}

// Flushed implements replication.Progress.
func (p *pipeline) Flushed() pglogrepl.LSN { return p.tracker.Flushed() }

// AdvanceIdle implements replication.Progress; called on the loop goroutine, so
// the decoder's state is consistent with everything handled so far.
func (p *pipeline) AdvanceIdle(walEnd pglogrepl.LSN) {
	if !p.dec.InTxn() && p.halted.Load() == nil { // a halt may sit before walEnd with nothing in flight
		p.tracker.AdvanceIdle(walEnd)
	}
}

// Drain implements replication.Progress: wait for acks, then start a fresh
// decoder for the next session (relations are resent by the server).
func (p *pipeline) Drain(ctx context.Context) error {
	if p.halted.Load() != nil {
		// The halted event never acks; wait briefly for the others only.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	done := make(chan error, 1)
	go func() { done <- p.tracker.WaitDrained(ctx) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			p.countDecoder()
			return p.resetDecoder()
		case <-tick.C:
			e, b := p.tracker.InFlight()
			p.log.Warn().Int("events", e).Int64("bytes", b).Msg("waiting for kafka to ack in-flight events")
		}
	}
}
