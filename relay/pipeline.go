package relay

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

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
	// Kept is the last transaction earlier terms of this process got acked
	// (Pipeline.Kept; zero at first): a session on its history skips up to
	// it, verified (resume.go).
	Kept history.Point
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
	// Publication is postgres.publication, named in errors.
	Publication string
	// Encoder writes each record in its topic's format (*encode.Stage:
	// serialization, envelope); nil: the payload as it is.
	Encoder Encoder
}

// Encoder writes a routed record in its topic's format (*encode.Stage). A
// refused event comes back with its dead-letter reason; an error without
// one is ctx's. It may block (a Schema Registry that does not answer).
type Encoder interface {
	Encode(ctx context.Context, m *sink.Message, ev *decoder.Event) (reason string, err error)
}

// Pipeline is the data path between the replication stream and the sink:
// it decodes each WAL message, registers each transaction with the tracker
// (in log order, which is where backpressure blocks), publishes, and
// applies the poison policy to what the broker refuses. It hands each
// transaction to one Delivery; acks come back through Acked (the one ack
// path: batches from the delivery, single records through their Done) into
// the tracker, failures through each record's Done. It implements
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
	out       Delivery
	marker    RowMarker
	log       zerolog.Logger
	dec       *decoder.Decoder // owned by the replication loop goroutine
	prevDec   decoder.Counts
	hbPrefix  string
	msgPrefix string
	// publication names the stream's publication in the decoder's errors;
	// expect is what the last session's check found (Prepared): the
	// columns of each outbox table and the WAL position then.
	publication string
	enc         Encoder // nil: records go out as built
	expect      struct {
		cols [][]string
		at   pglogrepl.LSN
	}
	beats *beats // the lag clock: heartbeats emitted and not yet passed by the watermark

	retries *queue[*delivery] // failed dead letters, republished in the order they failed
	marks   *queue[rowMark]   // row marks, written in order, PostgreSQL outages waited out
	rewind  rewind            // failed events: the stream restarts from the watermark
	resend  resendLog         // what a rewind need not publish again (at-least-once)
	order   orderWatch
	mem     txnPool // transactions' deliveries and headers, reused
	// Where sessions resume (resume.go); loop goroutine.
	pts     points
	filter  history.Filter
	refuted history.Point // a kept position the stream disproved: never applied again
	// unverified counts the events skipped before the filter's point was
	// verified, counted as skipped once it is.
	unverified int
	refuting   atomic.Bool // a keepalive refuted the session's resume: restart (Restarting)

	halted    atomic.Pointer[error] // why publishing stopped; nil while it goes on
	handled   atomic.Uint64         // WAL messages handled (Handled)
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

	// eventLSN: the commit LSN of the newest transaction with events
	// (EventLSN); chunked: a chunk of the open transaction had events.
	eventLSN atomic.Uint64
	chunked  bool

	standby standbyGate // nil unless postgres.standby_slots (standby.go)
}

// NewPipeline validates and allocates; it starts nothing. reg may be nil.
func NewPipeline(cfg PipelineConfig, out Delivery, marker RowMarker, log zerolog.Logger, reg prometheus.Registerer) (*Pipeline, error) {
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
		router: router, policy: cfg.Policy, out: out, marker: marker,
		tracker: checkpoint.New(cfg.Start, cfg.Limits),
		log:     log.With().Str("component", "pipeline").Logger(),
		retries: newQueue[*delivery](), marks: newQueue[rowMark](),
		hbPrefix: cfg.HeartbeatPrefix, msgPrefix: cfg.MessagePrefix, publication: cfg.Publication, enc: cfg.Encoder, beats: newBeats(0, time.Now)}
	for _, o := range p.outboxes {
		p.tables = append(p.tables, o.Mapping.Table.String())
	}
	p.pts.last = cfg.Kept
	_, alo := out.(atLeastOnce)
	p.resend = resendLog{on: alo, seed: maphash.MakeSeed(), flushed: p.tracker.Flushed, limit: resendLimit(cfg.Limits)}
	p.decodedBy = make([]atomic.Uint64, len(p.outboxes))
	if err := p.resetDecoder(); err != nil {
		return nil, err
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
	if p.rewind.active.Load() || p.refuting.Load() {
		return replication.ErrRestart
	}
	p.handled.Add(1)
	txn, err := p.dec.Decode(walStart, walData)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if p.dec.StreamMessage() {
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
	p.noteEvents(txn)
	if p.filter.Active() {
		if done, err := p.resumeTxn(txn); done || err != nil {
			return err
		}
	}
	if p.standby != nil { // before Begin: a wait must not hold a Kafka transaction open
		if err := p.standby.WaitTxn(ctx, txn); err != nil {
			return err
		}
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
		d.gen = p.resend.gen
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
		if p.resend.skips(pos, txn.CommitLSN, d.msg.Topic, d.msg.Key) {
			// Resent after a rewind, but acked before it with nothing
			// before it on its partition (or with its key) published again.
			d.finished, d.skipped = true, true
			continue
		}
		if due, ok := p.rewind.deadNext(pos); ok {
			// Its Kafka transaction was aborted after on_poison applied
			// (lostBatch): its dead letter goes out in its place now, cut
			// as far as the dead-letter topic made it.
			p.toDeadLetter(d, due.reason, due.cause)
			if due.cut > 0 {
				d.letter.CutTo(due.cut)
				d.msg.Key, d.msg.Value, d.msg.Headers = d.letter.Record(d.letter.At)
			}
			continue
		}
		if p.enc != nil {
			// Before Begin: a wait for the Schema Registry holds no Kafka
			// transaction open, and nothing of this transaction is registered.
			if reason, err := p.enc.Encode(ctx, &d.msg, ev); err != nil {
				if reason == "" {
					return fmt.Errorf("encode %s at LSN %s for topic %s: %w", d.name(), d.lsn, d.msg.Topic, err)
				}
				if err := p.poisonRow(ctx, d, reason, err); err != nil {
					return err
				}
			}
		}
	}
	// Begin after building the records: nothing above touches the delivery,
	// and a wait above (the Schema Registry, a halt) holds no Kafka
	// transaction open.
	if err := p.out.Begin(ctx, txn); err != nil {
		return err
	}
	// A Partial chunk is added with end 0: it cannot move the watermark.
	pend, err := p.tracker.Add(ctx, txn.EndLSN, len(ds), bytes)
	if err != nil {
		return err
	}
	if !txn.Partial {
		p.pts.passed(uint64(p.tracker.Flushed()))
		p.pts.add(txn)
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
			if d.skipped {
				p.resend.skipped.Add(1)
			}
			d.settle()
			continue
		}
		if p.log.Debug().Enabled() {
			d.logID(p.log.Debug()).Str("lsn", d.lsn.String()).Str("topic", d.msg.Topic).Msg("publish")
		}
		again := p.resend.on && p.resend.handed(d.txnLSN, d.pos)
		if err := p.out.Publish(pubCtx, &d.msg); err != nil {
			return fmt.Errorf("publish %s at LSN %s: %w", d.name(), d.lsn, err)
		}
		if again {
			p.resend.republished.Add(1)
		}
	}
	p.out.End(txn)
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
