package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Publisher is what the pipeline needs from the sink. Publish hands m over
// and returns; the broker's verdict comes later through m.Done. It is
// called from the replication loop and from the retry goroutine, and must
// return once the publisher is stopped, whatever ctx.
type Publisher interface {
	Publish(ctx context.Context, m *sink.Message) error
}

// RowMarker records dead letters and halts on the outbox row, so an
// operator finds them with SQL (deadletter.Store).
type RowMarker interface {
	MarkDead(ctx context.Context, id int64, attempts int, lastErr string) (found bool, err error)
	MarkFailed(ctx context.Context, id int64, attempts int, lastErr string) error
}

// PipelineConfig is what a pipeline needs to know.
type PipelineConfig struct {
	Table    string // the outbox table, schema.name, when Outboxes is empty
	Template sink.Template
	Limits   checkpoint.Limits
	Policy   record.Policy
	// Start is the watermark earlier terms of this process got acked (0
	// at first); each replication session sets it to the slot's confirmed
	// position before streaming (raised, or reset when the slot is behind
	// it or the server's history changed: replication.startFrom).
	Start pglogrepl.LSN
	// MaxTopics and Allowlist bound the topics events are routed to
	// (kafka.max_topics, at least 1; kafka.topic_allowlist).
	MaxTopics int
	Allowlist sink.Allowlist
	// HeartbeatPrefix is the prefix of the relay's heartbeat Messages
	// (replication.HeartbeatPrefix); "" when heartbeats are off.
	HeartbeatPrefix string
	// MessagePrefix is messages.prefix: transactional Messages with it are
	// events (decoder.SetMessagePrefix); "" when off.
	MessagePrefix string
	// Outboxes are the outbox tables with their mappings and templates
	// (Config.Outboxes); empty: Table with Template, the relay's own way.
	Outboxes []Outbox
	// Format is the record format: record.FormatOwn or record.FormatDebezium (compat).
	Format string
}

// Pipeline is the data path between the replication stream and the sink:
// it decodes each WAL message, registers each transaction with the tracker
// (in log order, which is where backpressure blocks), publishes, and
// applies the poison policy to what the broker refuses. Acks come back
// through each message's Done into the tracker. It implements
// replication.Progress.
//
// NewPipeline allocates; Run works off retries and row marks until its ctx
// ends; Handle runs on the replication loop goroutine.
type Pipeline struct {
	table     string // the first outbox table, for messages about the whole pipeline
	outboxes  []Outbox
	format    string
	tables    []string     // schema.name of each outbox, for messages and the table label
	router    *sink.Router // owned by the replication loop goroutine
	policy    record.Policy
	tracker   *checkpoint.Tracker
	pub       Publisher
	marker    RowMarker
	log       zerolog.Logger
	dec       *decoder.Decoder // owned by the replication loop goroutine
	prevDec   decoder.Counts
	hbPrefix  string
	msgPrefix string
	beats     *beats // the lag clock: heartbeats emitted and not yet passed by the watermark

	retries *queue[*delivery] // failed dead letters, republished in the order they failed
	marks   *queue[rowMark]   // row marks, written in order, PostgreSQL outages waited out
	rewind  rewind            // failed events: the stream restarts from the watermark
	order   orderWatch
	eos     *exactlyOnce // delivery: exactly_once (the publisher); nil at least once
	mem     txnPool      // transactions' deliveries and headers, reused

	halted    atomic.Pointer[error] // why publishing stopped; nil while it goes on
	otherRows atomic.Uint64
	// Streamed transactions (decoder.Counts), for the metrics.
	prevStream   decoder.Counts
	streamed     atomic.Uint64
	streamAborts atomic.Uint64
	spilledTxns  atomic.Uint64
	streamOpen   atomic.Int64 // bytes held for streamed transactions not committed yet
	decoded      atomic.Uint64
	decodedBy    []atomic.Uint64 // events decoded per outbox table
	resent       atomic.Uint64
	m            pipelineMetrics
}

// NewPipeline validates and allocates; it starts nothing. reg may be nil.
func NewPipeline(cfg PipelineConfig, pub Publisher, marker RowMarker, log zerolog.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	if cfg.Policy.MaxAttempts < 1 || cfg.Policy.Topic == "" {
		return nil, errors.New("relay: poison policy needs a dead-letter topic and at least one attempt")
	}
	router, err := sink.NewRouter(cfg.Template, cfg.MaxTopics, cfg.Allowlist, cfg.Policy.Topic)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if len(cfg.Outboxes) == 0 {
		t, err := outboxschema.ParseTable(cfg.Table)
		if err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		cfg.Outboxes = []Outbox{{Mapping: outboxschema.DefaultMapping(t), Template: cfg.Template, Own: true}}
	}
	cfg.Policy.Format = cfg.Format
	p := &Pipeline{table: cfg.Outboxes[0].Mapping.Table.String(), outboxes: cfg.Outboxes, format: cfg.Format,
		router: router, policy: cfg.Policy, pub: pub, marker: marker,
		tracker: checkpoint.New(cfg.Start, cfg.Limits),
		log:     log.With().Str("component", "pipeline").Logger(),
		retries: newQueue[*delivery](), marks: newQueue[rowMark](),
		hbPrefix: cfg.HeartbeatPrefix, msgPrefix: cfg.MessagePrefix, beats: newBeats(0, time.Now)}
	for _, o := range p.outboxes {
		p.tables = append(p.tables, o.Mapping.Table.String())
	}
	p.decodedBy = make([]atomic.Uint64, len(p.outboxes))
	if err := p.resetDecoder(); err != nil {
		return nil, err
	}
	if e, ok := pub.(*exactlyOnce); ok {
		p.eos = e
	}
	if a, ok := pub.(batchAcker); ok {
		a.OnAcked(p.acked)
	}
	p.m = newPipelineMetrics(p, reg)
	return p, nil
}

// Run republishes failed events and writes row marks until ctx ends; it
// returns nil then, or the error that stopped it. A retry or mark still
// queued at that point leaves its event unacked: the slot keeps it.
func (p *Pipeline) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.retries.run(ctx, p.republish) })
	g.Go(func() error { return p.marks.run(ctx, p.mark) })
	err := g.Wait()
	if errors.Is(err, sink.ErrClosed) || errors.Is(err, context.Canceled) {
		return nil // the term is ending: what is still queued stays unacked, the slot keeps it
	}
	return err
}

// Handle is the replication.Handler. It runs on the replication loop
// goroutine and blocks while the in-flight limits are reached, and for good
// once the pipeline halted (the slot stays where it is; keepalives go on).
func (p *Pipeline) Handle(ctx context.Context, walStart pglogrepl.LSN, walData []byte) error {
	if err := p.waitIfHalted(ctx); err != nil {
		return err
	}
	if p.rewind.active.Load() {
		return replication.ErrRestart
	}
	if p.eos != nil {
		p.eos.handled() // activity: a Kafka transaction is committed when the stream goes quiet
	}
	txn, err := p.dec.Decode(walStart, walData)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if len(walData) > 0 && strings.IndexByte("SEcA", walData[0]) >= 0 {
		p.countStream()
	}
	if txn == nil {
		if hb, ok := p.dec.Heartbeat(); ok {
			p.heartbeat(hb)
		}
		return nil
	}
	// A Stream Commit hands out its transaction in chunks: the first from
	// Decode, the others from Next.
	for txn != nil {
		err := p.handleTxn(ctx, txn)
		// Nothing keeps the Events slice: each delivery copied what it
		// needs (its payload and headers are not in the slice).
		p.dec.Recycle(txn.Events)
		if err != nil {
			return err
		}
		if txn, err = p.dec.Next(); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
	}
	return nil
}

// handleTxn registers one transaction (or chunk of one) with the tracker
// and publishes its events, on the replication loop goroutine.
func (p *Pipeline) handleTxn(ctx context.Context, txn *decoder.Txn) error {
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
	if p.eos != nil && txn.CommitLSN <= p.eos.skipThrough() {
		// Exactly once: committed to Kafka in an earlier session or term
		// (the checkpoint), not yet confirmed to the slot. The watermark
		// passes it like a heartbeat, so the slot is confirmed past it.
		if !txn.Partial {
			p.tracker.Mark(txn.EndLSN)
		}
		p.eos.skipped(len(txn.Events))
		return nil
	}
	var bytes int64
	commitLSN := record.LSNText(txn.CommitLSN)
	at := txn.CommitTime
	if at.IsZero() { // a refused non-transactional message has no commit
		at = time.Now()
	}
	var nh, nb int // Debezium's records build their own headers
	if p.format != record.FormatDebezium {
		nh, nb = record.SlabSize(txn.Events, commitLSN)
	}
	mem := p.mem.get(len(txn.Events), nh, nb)
	ds, sl := mem.ds, mem.slab()
	// The last topic routed: the events of a transaction mostly share
	// their table, aggregate_type and event_type, and the router answers
	// the same for the same inputs (a topic once admitted stays admitted).
	var last struct {
		ok                        bool
		fromTable                 bool
		table                     int
		aggType, eventType, topic string
	}
	for i := range txn.Events {
		ev := &txn.Events[i]
		d := &ds[i]
		// An event from no table (Table "": a message) is routed with the
		// plain kafka.topic_template, where {schema} and {table} render empty.
		pos, message := position(ev), ev.Source == decoder.SourceMessage
		ob, tmpl, fromTable := &p.outboxes[ev.TableIndex], p.router.Template(), ev.Table != ""
		if fromTable {
			tmpl = ob.Template
			p.decodedBy[ev.TableIndex].Add(1)
		}
		// Field by field into the zeroed d (ds is new or cleared): a composite literal
		// would copy the whole delivery, its sink.Message included, with
		// write barriers.
		d.p, d.mem, d.id, d.idText, d.table = p, mem, ev.ID, ev.IDText, ev.TableIndex
		d.mark = ob.Own && fromTable && !message
		d.lsn, d.txnLSN, d.pos, d.commit = ev.LSN, txn.CommitLSN, pos, at
		d.size, d.attempts = int64(len(ev.Payload)), p.rewind.attemptsOf(pos)
		d.message, d.msgID = message, ev.MessageID
		if p.format == record.FormatDebezium {
			d.msg = record.Debezium(ev, at)
		} else {
			record.To(&d.msg, sl, ev, commitLSN, at)
		}
		d.msg.Done, d.msg.Ref = d.done, d
		bytes += d.size
		if p.rewind.deadLettered(pos) {
			d.finished = true // resent after a rewind, but its dead letter is in Kafka and its row marked
			continue
		}
		if last.ok && ev.Err == nil && last.fromTable == fromTable && last.table == ev.TableIndex &&
			last.aggType == ev.AggregateType && last.eventType == ev.EventType {
			d.msg.Topic = last.topic
		} else {
			topic, reason, err := record.RouteWith(p.router, tmpl, p.tables[ev.TableIndex], ev)
			d.msg.Topic = topic // refused by the limit or the allowlist: the dead letter names it
			if err != nil {
				if err := p.poisonRow(ctx, d, reason, err); err != nil {
					return err
				}
				continue
			}
			last.ok, last.fromTable, last.table = true, fromTable, ev.TableIndex
			last.aggType, last.eventType, last.topic = ev.AggregateType, ev.EventType, topic
		}
		if p.eos != nil {
			if reason, cause, ok := p.rewind.deadNext(pos); ok {
				// Exactly once: the broker refused it until on_poison applied;
				// its dead letter goes into this Kafka transaction instead.
				p.toDeadLetter(d, reason, cause)
			}
		}
	}
	if p.eos != nil {
		// Closes the Kafka transaction first when this PostgreSQL
		// transaction would not fit in it (never splits one).
		if err := p.eos.before(&eosTxn{commit: txn.CommitLSN, events: len(ds), bytes: bytes, partial: txn.Partial}); err != nil {
			return err
		}
	}
	// A Partial chunk is added with end 0: it cannot move the watermark.
	pend, err := p.tracker.Add(ctx, txn.EndLSN, len(ds), bytes)
	if err != nil {
		return err
	}
	// Once a transaction is registered every event of it must reach the
	// publisher, or the drain waits for acks that cannot come: a shutdown
	// does not interrupt this loop (the publisher returns once stopped).
	pubCtx := context.WithoutCancel(ctx)
	for i := range ds {
		if p.rewind.active.Load() {
			// Nothing more goes out before the failed event is resent.
			p.rewind.parkUnsent(len(ds) - i)
			return replication.ErrRestart
		}
		d := &ds[i]
		d.pend = pend
		if d.finished {
			d.settle()
			continue
		}
		if p.log.Debug().Enabled() {
			d.logID(p.log.Debug()).Str("lsn", d.lsn.String()).Str("topic", d.msg.Topic).Msg("publish")
		}
		if err := p.pub.Publish(pubCtx, &d.msg); err != nil {
			return fmt.Errorf("publish %s at LSN %s: %w", d.name(), d.lsn, err)
		}
	}
	if p.eos != nil && !txn.Partial {
		p.eos.after(txn.CommitLSN, txn.EndLSN)
	}
	return nil
}

// poisonRow handles an event that cannot even be built (a bad row, an
// invalid topic), before its transaction enters the tracker: under halt it
// stops here, so nothing of the transaction is published or confirmed;
// under dlq the event becomes its dead letter at once.
func (p *Pipeline) poisonRow(ctx context.Context, d *delivery, reason string, err error) error {
	d.attempts = 1
	if record.Decide(record.Failure{Kind: fault.Poison, Attempts: 1, Permanent: true}, p.policy) == record.Halt {
		p.halt(d, err)
		return p.waitIfHalted(ctx)
	}
	p.toDeadLetter(d, reason, err)
	return nil
}

// delivery is one event on its way to Kafka, through retries and maybe the
// dead-letter topic. Its Done runs on the producer's goroutines.
type delivery struct {
	p        *Pipeline
	mem      *txnMem // its transaction's memory, reused once every delivery of it settled (settle)
	pend     *checkpoint.Pending
	msg      sink.Message
	id       int64
	idText   string        // the id of a table whose id is not an integer
	table    int           // index of the outbox table in Pipeline.outboxes
	mark     bool          // dead letters and halts are recorded on the row (Outbox.Own)
	lsn      pglogrepl.LSN // of the Insert or Message, for errors and the dead letter
	txnLSN   pglogrepl.LSN // its transaction's commit LSN: the slot may be confirmed up to it (the server resends from it), never past
	pos      pglogrepl.LSN // the event's place in the WAL, unique: rewind and order keys (position)
	commit   time.Time
	size     int64
	attempts int                // failed publish attempts so far
	letter   *deadletter.Letter // set once the event is being dead-lettered
	finished bool               // dead-lettered before a rewind: acked without a record
	message  bool               // a message event (decoder.SourceMessage): no outbox row to mark
	msgID    string             // its envelope id
}

// position is ev's place in the WAL as the rewind and the order watch key
// events: unique per event, in WAL order. A row's is its LSN, the start of
// its Insert's record. A Message's LSN is the END of its record (what
// pg_logical_emit_message returns), which is where the next record starts,
// so a row written right after a message has the message's LSN: the
// message's position is one less, inside its own record, where no record
// starts (records start 8-aligned), and still after every earlier event.
func position(ev *decoder.Event) pglogrepl.LSN {
	if ev.Source == decoder.SourceMessage {
		return ev.LSN - 1
	}
	return ev.LSN
}

// name names d's event in errors and logs: its outbox row (schema.table and
// id), or its message.
func (d *delivery) name() string {
	switch {
	case d.message:
		return fmt.Sprintf("outbox message id=%q", d.msgID)
	case d.idText != "":
		return fmt.Sprintf("outbox row %s id=%q", d.p.tables[d.table], d.idText)
	}
	return fmt.Sprintf("outbox row %s id=%d", d.p.tables[d.table], d.id)
}

// logID adds d's identity to a log line: the row's id (an integer, or the
// text of a uuid or text id), or the message's id (message_id).
func (d *delivery) logID(e *zerolog.Event) *zerolog.Event {
	switch {
	case d.message:
		return e.Str("message_id", d.msgID)
	case d.idText != "":
		return e.Str("id", d.idText)
	}
	return e.Int64("id", d.id)
}

// tableLabel is the table label of d's metrics: its outbox table, or
// "message:<prefix>" for a message event.
func (d *delivery) tableLabel() string {
	if d.message {
		return "message:" + d.p.msgPrefix
	}
	return d.p.tables[d.table]
}

// deadLettered acks d's dead letter, in Kafka now: the slot may pass it.
func (d *delivery) deadLettered() {
	d.p.rewind.settled(d.pos)
	d.p.rewind.markDead(d.pos)
	d.settle()
}

// batchAcker is a Publisher that hands over the acks of a record batch
// in one call (sink.Producer, direct engine).
type batchAcker interface {
	OnAcked(f func(msgs []*sink.Message, at time.Time))
}

// acked is done(nil) for the records of one acked batch (one partition, in
// publish order), with the per-batch work done once: the order watch sees
// the batch's last position, and the deliveries of one transaction that
// follow each other settle with one tracker call. In a drain of 100-row
// transactions these were a lock, a map lookup and a compare-and-swap per
// event. Records that are not plain deliveries (dead letters, the
// exactly-once checkpoint) go through their Done.
func (p *Pipeline) acked(msgs []*sink.Message, at time.Time) {
	var (
		topic string
		part  int32 = -1
		high  pglogrepl.LSN
	)
	for _, m := range msgs {
		m.Acked = at
		d, ok := m.Ref.(*delivery)
		if !ok || d.letter != nil {
			continue
		}
		p.m.commitToAck.Observe(at.Sub(d.commit).Seconds())
		p.rewind.settled(d.pos)
		if part >= 0 && (m.Partition != part || m.Topic != topic) {
			p.order.ack(topic, part, high) // not one partition after all
			high = 0
		}
		topic, part, high = m.Topic, m.Partition, max(high, d.pos)
	}
	if part >= 0 {
		p.order.ack(topic, part, high)
	}
	// Settle (settleRun). A delivery is not read after its group settled
	// (its memory may be reused at once); an unsettled one keeps its
	// transaction's memory.
	var (
		pend  *checkpoint.Pending
		mem   *txnMem
		n     int
		bytes int64
	)
	flush := func() {
		if n > 0 {
			settleRun(pend, mem, n, bytes)
		}
		n, bytes = 0, 0
	}
	for _, m := range msgs {
		d, ok := m.Ref.(*delivery)
		if !ok || d.letter != nil {
			m.Done(nil)
			continue
		}
		if d.pend != pend || d.mem != mem {
			flush()
			pend, mem = d.pend, d.mem
		}
		n++
		bytes += d.size
	}
	flush()
}

// done is the broker's verdict on d.msg. It runs on the producer's
// goroutines and must not block: everything slow goes through a queue.
func (d *delivery) done(err error) {
	p := d.p
	if err == nil {
		if d.letter == nil {
			acked := d.msg.Acked
			if acked.IsZero() {
				acked = time.Now()
			}
			p.m.commitToAck.Observe(acked.Sub(d.commit).Seconds())
			p.order.ack(d.msg.Topic, d.msg.Partition, d.pos)
			p.rewind.settled(d.pos)
			d.settle()
			return
		}
		p.m.deadLettered.WithLabelValues(d.letter.Reason, d.tableLabel()).Inc()
		if d.message {
			// No row to mark: the dead letter is the only copy (the slot
			// was the other), so it is acked once Kafka has it.
			d.deadLettered()
			return
		}
		p.marks.push(rowMark{d: d, dead: true}, 0) // acks once the row says so
		return
	}
	if p.eos == nil || !errors.Is(err, errAborted) {
		d.attempts++ // not for an abort another record caused
	}
	reason, kind := sink.Classify(err)
	action := record.Decide(record.Failure{Kind: kind, Attempts: d.attempts, DeadLetter: d.letter != nil}, p.policy)
	lc := p.log.With()
	switch {
	case d.message:
		lc = lc.Str("message_id", d.msgID)
	case d.idText != "":
		lc = lc.Str("id", d.idText)
	default:
		lc = lc.Int64("id", d.id)
	}
	ev := lc.Str("lsn", d.lsn.String()).Str("topic", d.msg.Topic).
		Str("reason", reason).Int("attempt", d.attempts).Logger()
	if p.eos != nil && action != record.Halt {
		// Exactly once: the Kafka transaction is aborted; the event (or its
		// dead letter, now due) goes into a later one after the rewind.
		switch {
		case action == record.DeadLetter:
			p.rewind.deadLater(d.pos, reason, fmt.Errorf("publish to topic %s: %w", d.msg.Topic, err))
		case d.letter != nil:
			p.rewind.deadLater(d.pos, d.letter.Reason, errors.New(d.letter.Err))
		}
		p.order.fail(d.msg.Topic, d.msg.Partition, d.pos)
		if p.rewind.park(d.pos, d.attempts, p.policy.Delay(action, d.attempts)) {
			p.m.rewinds.Inc()
			ev.Warn().Err(err).Msg("kafka transaction failed: rewinding to the ack watermark; committed transactions are skipped on the way back")
		}
		return
	}
	switch action {
	case record.RetryTransient, record.RetryPoison:
		if action == record.RetryPoison {
			ev.Warn().Err(err).Msg("publish rejected; retrying before on_poison applies")
		} else if d.attempts&(d.attempts-1) == 0 { // 1, 2, 4, 8...: a steady trickle, not a flood
			ev.Warn().Err(err).Msg("transient publish error; retrying until the broker takes it")
		}
		if d.letter != nil {
			// A dead letter has no order to keep: resend just it. The
			// tracker holds the slot before the event meanwhile.
			p.retries.push(d, p.policy.Delay(action, d.attempts))
			return
		}
		p.order.fail(d.msg.Topic, d.msg.Partition, d.pos)
		if p.rewind.park(d.pos, d.attempts, p.policy.Delay(action, d.attempts)) {
			p.m.rewinds.Inc()
			ev.Warn().Err(err).Msg("publish failed: rewinding to the ack watermark, so the event and every later one are published again in order")
		}
	case record.DeadLetter:
		p.toDeadLetter(d, reason, fmt.Errorf("publish to topic %s: %w", d.msg.Topic, err))
		p.retries.push(d, 0) // never publish from the producer's goroutine: its input may be full
	case record.Halt:
		switch {
		case d.letter != nil:
			err = fmt.Errorf("write dead letter of %s to topic %s: %w", d.name(), d.msg.Topic, err)
		case kind == fault.Refused:
			err = fmt.Errorf("publish %s at LSN %s: %w; grant the relay's Kafka user write access to the topic", d.name(), d.lsn, err)
		default:
			err = fmt.Errorf("publish %s at LSN %s: %w", d.name(), d.lsn, err)
		}
		p.halt(d, err)
	}
}

// republish is the retry goroutine's job. An error ends Run: the publisher
// is stopped, so the event stays unacked and the slot keeps it.
func (p *Pipeline) republish(ctx context.Context, d *delivery) error {
	if err := p.pub.Publish(ctx, &d.msg); err != nil {
		return fmt.Errorf("resend %s at LSN %s: %w", d.name(), d.lsn, err)
	}
	return nil
}

// toDeadLetter turns d into its dead letter: the dead-letter topic, the same
// key (bounded), the payload and the row's headers unless the event was too
// large or they would not fit kafka.max_message_bytes, and the dlq.*
// headers (deadletter.Letter.Record). The caller publishes it.
func (p *Pipeline) toDeadLetter(d *delivery, reason string, cause error) {
	l := &deadletter.Letter{Table: p.tables[d.table], ID: d.id, IDText: d.idText}
	if d.message {
		l = &deadletter.Letter{EventID: d.msgID, Prefix: p.msgPrefix}
	}
	d.msg, d.letter = record.Letter(l, p.policy, d.lsn, d.msg, reason, d.attempts, cause, time.Now())
	d.msg.Done = d.done
	d.logID(p.log.Error().Err(cause)).Str("lsn", d.lsn.String()).Str("reason", reason).
		Str("dlq_topic", p.policy.Topic).Int("attempts", d.attempts).
		Msg("poison event: dead-lettering it; later events of its aggregate go on")
}

// markBackoff paces the retries of a row mark while PostgreSQL is away.
var markBackoff = backoff.Policy{Initial: time.Second, Max: 30 * time.Second}

// rowMark is a dead letter or a halt to record on the outbox row.
type rowMark struct {
	d      *delivery
	dead   bool   // MarkDead (then ack), else MarkFailed
	reason string // the halt's error, for MarkFailed
}

// mark records m on the row, waiting out PostgreSQL outages. A dead letter
// is acked only once it is both in Kafka and findable with SQL, so the
// slot never moves past an event nobody can find.
func (p *Pipeline) mark(ctx context.Context, m rowMark) error {
	d := m.d
	// A table other than the relay's own has no bookkeeping columns (and
	// maybe no integer id), and a message has no row at all: its dead
	// letter is in the topic only, and a halt is in the log and /readyz.
	for attempt := 1; d.mark && d.id != 0; attempt++ {
		var err error
		if m.dead {
			var found bool
			found, err = p.marker.MarkDead(ctx, d.id, d.letter.Attempts, d.letter.Err)
			if err == nil && !found {
				p.log.Warn().Int64("id", d.id).Msg("dead-lettered outbox row no longer exists; the dead letter holds the event")
			}
		} else {
			err = p.marker.MarkFailed(ctx, d.id, d.attempts, m.reason)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil // shutting down: unacked, so the event comes back after restart
		}
		if fault.KindOf(err) != fault.Transient {
			// A missing privilege, a row-level security policy, a trigger
			// or a constraint rejects the update the same way every time:
			// retrying would hold the slot before the event for ever,
			// silently. Halt instead, with the reason; the event stays
			// unacked and comes back (to the dead-letter topic) after the
			// fix and a restart.
			if !m.dead {
				p.log.Error().Err(err).Str("table", p.table).Int64("id", d.id).Msg("cannot record the halt on the outbox row")
				return nil
			}
			herr := fmt.Errorf("the dead letter of outbox row %s id=%d at LSN %s is in topic %s, but the row cannot be marked: %w; fix that (grant, policy or trigger), then restart the relay",
				p.table, d.id, d.lsn, p.policy.Topic, err)
			if p.Halted() != nil {
				p.log.Error().Err(herr).Str("table", p.table).Int64("id", d.id).Msg("cannot mark the dead-lettered outbox row")
			}
			p.halt(d, herr)
			return nil
		}
		p.log.Warn().Err(err).Int64("id", d.id).Bool("dead_letter", m.dead).Msg("cannot mark the outbox row yet; retrying")
		if backoff.Sleep(ctx, markBackoff.Delay(attempt)) != nil {
			return nil
		}
	}
	if m.dead {
		d.deadLettered()
	}
	return nil
}

// halt stops publishing for good: nothing after this is read, the slot
// stays before the event, /readyz fails. The row records why.
func (p *Pipeline) halt(d *delivery, err error) {
	if !p.halted.CompareAndSwap(nil, &err) {
		return
	}
	p.m.halted.Set(1)
	e := p.log.Error().Err(err)
	if !d.message {
		e = e.Str("table", p.tables[d.table])
	}
	d.logID(e).Str("lsn", d.lsn.String()).Str("commit_lsn", d.txnLSN.String()).
		Msg("HALTED: publishing stopped at a poison event and the slot is held before it; fix the cause, then restart the relay (or use on_poison: dlq)")
	if !d.message { // a message has no row to record it on
		p.marks.push(rowMark{d: d, reason: err.Error()}, 0)
	}
}

// Halted returns why publishing stopped, or nil. Any goroutine.
func (p *Pipeline) Halted() error {
	if e := p.halted.Load(); e != nil {
		return *e
	}
	return nil
}

// waitIfHalted blocks until ctx ends once the pipeline halted.
func (p *Pipeline) waitIfHalted(ctx context.Context) error {
	if p.halted.Load() == nil {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// heartbeat handles one of the relay's heartbeats read from the slot: no
// event, nothing to publish. Every transaction that committed before its
// record was handed over before it, so the watermark may move to it once
// they are acked (at once when nothing is in flight, like an idle
// keepalive): a heartbeat never holds the slot back. The lag clock learns
// where it sits.
func (p *Pipeline) heartbeat(hb decoder.Heartbeat) {
	p.tracker.Mark(hb.LSN)
	p.beats.decoded(hb)
}

// Emitted records a heartbeat written into the WAL (replication.Heartbeater):
// its record ends at end and carries the local time sent. Any goroutine;
// does not block.
func (p *Pipeline) Emitted(end pglogrepl.LSN, sent time.Time) {
	p.beats.emitted(end, sent, p.tracker.Flushed())
}

// Lag is outbox_relay_lag_seconds: the age of the oldest event committed
// and not yet acked or dead-lettered, read or not. It is the age of the
// oldest heartbeat emitted and not yet passed by the ack watermark, or of
// the oldest event in flight if that is older; an event committed after
// the newest passed heartbeat and not yet read is not seen, so it is under
// by at most one heartbeat.interval (plus the write of a heartbeat). With
// heartbeats off or failing, it is the in-flight part only. Any goroutine.
func (p *Pipeline) Lag() time.Duration {
	oldest, ok := p.tracker.Oldest()
	return p.beats.lag(p.tracker.Flushed(), oldest, ok)
}

// resetDecoder starts a fresh decoder (a new session resends relations) whose
// chunks keep one transaction's buffered events well inside the in-flight
// limits, so a transaction of any size streams in bounded memory.
//
// Streamed transactions not committed yet are dropped with the old decoder
// (and their spill files): the server streams them again from their start
// to the next session. Their events stay in memory up to spoolMemory (or
// half inflight.max_bytes if less) altogether, then go to unlinked files in
// TMPDIR.
func (p *Pipeline) resetDecoder() error {
	ms := make([]outboxschema.Mapping, len(p.outboxes))
	for i, o := range p.outboxes {
		ms[i] = o.Mapping
	}
	dec, err := decoder.NewMapped(ms, record.ReservedExtra(p.format))
	if err != nil {
		return err
	}
	events, bytes := p.tracker.Limits()
	dec.SetChunk(min(1000, max(1, events/2)), int(max(1, bytes/2)))
	dec.SetSpill("", int(min(max(1, bytes/2), spoolMemory)))
	dec.SetHeartbeatPrefix(p.hbPrefix)
	dec.SetMessagePrefix(p.msgPrefix, p.policy.MaxMessageBytes)
	if p.dec != nil {
		p.dec.Close()
	}
	p.dec, p.prevDec, p.prevStream = dec, decoder.Counts{}, decoder.Counts{}
	p.countStream()
	return nil
}

// spoolMemory bounds the memory of streamed, uncommitted transactions. With
// the server's default logical_decoding_work_mem (64MB) only transactions
// larger than that are streamed, so they go to disk anyway: more memory
// would only raise the peak RSS (measured: 145 MiB with 32 MiB, see README).
const spoolMemory = 4 << 20

// countStream publishes the decoder's streaming state to the metrics.
func (p *Pipeline) countStream() {
	c, st := p.dec.Counts(), p.dec.Spilled()
	p.streamed.Add(c.StreamedTxns - p.prevStream.StreamedTxns)
	p.streamAborts.Add(c.StreamAborts - p.prevStream.StreamAborts)
	p.spilledTxns.Add(c.SpilledTxns - p.prevStream.SpilledTxns)
	p.prevStream = c
	p.streamOpen.Store(st.Bytes)
}

func (p *Pipeline) countDecoder() {
	c := p.dec.Counts()
	p.otherRows.Add(c.OtherTableRows - p.prevDec.OtherTableRows)
	p.decoded.Add(c.Events - p.prevDec.Events)
	p.prevDec = c
}

// Flushed implements replication.Progress: every event before it is acked
// or dead-lettered. Any goroutine.
func (p *Pipeline) Flushed() pglogrepl.LSN { return p.tracker.Flushed() }

// OldestUnacked returns how long the oldest transaction with an event not
// yet acked (nor dead-lettered and marked) has been in flight; 0 when
// nothing is. Any goroutine.
func (p *Pipeline) OldestUnacked() time.Duration {
	at, ok := p.tracker.Oldest()
	if !ok {
		return 0
	}
	return time.Since(at)
}

// InFlight returns the events and payload bytes published and not yet
// acked. Any goroutine.
func (p *Pipeline) InFlight() (events int, bytes int64) { return p.tracker.InFlight() }

// Restarting implements replication.Progress: a rewind has begun. Any
// goroutine.
func (p *Pipeline) Restarting() bool { return p.rewind.active.Load() }

// AdvanceIdle implements replication.Progress; called on the loop goroutine,
// so the decoder's state is consistent with everything handled so far.
func (p *Pipeline) AdvanceIdle(walEnd pglogrepl.LSN) {
	if !p.dec.InTxn() && p.halted.Load() == nil { // a halt may sit before walEnd with nothing in flight
		p.tracker.AdvanceIdle(walEnd)
	}
}

// Reset implements replication.Progress: the watermark goes to lsn, down as
// well as up, when nothing is in flight (checkpoint.Tracker.Reset). Called
// on the loop goroutine after Drain, so the decoder is fresh.
func (p *Pipeline) Reset(lsn pglogrepl.LSN) error { return p.tracker.Reset(lsn) }

// Drain implements replication.Progress: wait for acks (until ctx ends),
// then start a fresh decoder for the next session (relations are resent by
// the server). During a rewind, or when one begins while it waits, it waits
// for every event to settle instead and drops the failed ones from the
// tracker: the next session publishes them again. Called on the loop
// goroutine.
func (p *Pipeline) Drain(ctx context.Context) error {
	if p.eos != nil {
		p.eos.flush() // the acks come with the commit
	}
	if p.halted.Load() != nil {
		// The halted event never acks; wait briefly for the others only.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	warn := time.NewTicker(10 * time.Second)
	defer warn.Stop()
	poll := time.NewTicker(50 * time.Millisecond) // a failure during the wait turns it into a rewind
	defer poll.Stop()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- p.tracker.WaitDrained(wctx) }()
	for {
		if p.rewind.active.Load() && p.halted.Load() == nil {
			return p.finishRewind(ctx)
		}
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			p.countDecoder()
			if p.eos != nil {
				p.eos.rewound()
			}
			return p.resetDecoder()
		case <-poll.C:
		case <-warn.C:
			e, b := p.tracker.InFlight()
			p.log.Warn().Int("events", e).Int64("bytes", b).Msg("waiting for kafka to ack in-flight events")
		}
	}
}

// finishRewind waits for every event in flight to settle and the failed
// events' backoff, then drops what is in flight: the next session starts
// from the watermark.
func (p *Pipeline) finishRewind(ctx context.Context) error {
	inFlight := func() int { e, _ := p.tracker.InFlight(); return e }
	if err := p.rewind.wait(ctx, inFlight); err != nil {
		return err
	}
	p.tracker.Abandon()
	p.order.reset()
	p.rewind.reset()
	if p.eos != nil {
		p.eos.rewound()
	}
	p.countDecoder()
	return p.resetDecoder()
}

// Advanced receives (without blocking the sender) after the watermark
// moved; one receive may stand for several moves. Any goroutine.
func (p *Pipeline) Advanced() <-chan struct{} { return p.tracker.Advanced() }
