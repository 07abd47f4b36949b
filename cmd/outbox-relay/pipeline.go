package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// publisher is what the pipeline needs from the sink.
type publisher interface {
	Publish(ctx context.Context, m *sink.Message) error
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
	log     zerolog.Logger
	fail    func(error) // stops the relay; called at most once matters
	// pubCtx outlives the run context by the shutdown timeout: once a
	// transaction is registered with the tracker, all its events must reach
	// the producer, or the final drain waits for acks that cannot come.
	pubCtx context.Context

	failed    atomic.Bool
	otherRows atomic.Uint64
	decoded   atomic.Uint64
	resent    atomic.Uint64
	prevDec   decoder.Counts

	commitToAck prometheus.Histogram
}

func newPipeline(table string, tracker *checkpoint.Tracker, pub publisher, tmpl sink.Template, pubCtx context.Context,
	log zerolog.Logger, reg prometheus.Registerer, fail func(error)) (*pipeline, error) {
	p := &pipeline{table: table, tracker: tracker, pub: pub, tmpl: tmpl, fail: fail, pubCtx: pubCtx,
		log: log.With().Str("component", "pipeline").Logger()}
	if err := p.resetDecoder(); err != nil {
		return nil, err
	}
	p.commitToAck = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "outbox_relay_commit_to_ack_seconds",
		Help:    "Time from the PostgreSQL commit of an event's transaction to the Kafka ack (acks=all).",
		Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5, 10, 30, 60},
	})
	if reg != nil {
		reg.MustRegister(p.commitToAck,
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
// goroutine and blocks while the in-flight limits are reached.
func (p *pipeline) Handle(ctx context.Context, walStart pglogrepl.LSN, walData []byte) error {
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
	msgs := make([]sink.Message, len(txn.Events))
	var bytes int64
	for i := range txn.Events {
		ev := &txn.Events[i]
		topic, err := p.tmpl.Render(ev.AggregateType, ev.EventType)
		if err != nil {
			return fmt.Errorf("route outbox row %s id=%d at LSN %s (aggregate_type %q): %w; fix the row or kafka.topic_template",
				p.table, ev.ID, ev.LSN, ev.AggregateType, err)
		}
		msgs[i] = sink.Message{
			Topic:     topic,
			Key:       []byte(ev.AggregateID),
			Value:     ev.Payload,
			Headers:   headers(ev, txn.CommitLSN),
			Timestamp: txn.CommitTime,
		}
		bytes += int64(len(ev.Payload))
	}
	// A Partial chunk is added with end 0: it cannot move the watermark.
	pend, err := p.tracker.Add(ctx, txn.EndLSN, len(msgs), bytes)
	if err != nil {
		return err
	}
	commit := txn.CommitTime
	for i := range msgs {
		m := &msgs[i]
		id, lsn, size := txn.Events[i].ID, txn.Events[i].LSN, int64(len(m.Value))
		m.Done = func(err error) {
			if err != nil {
				// The tracker never passes this event, so the slot keeps it.
				p.stop(fmt.Errorf("publish outbox row %s id=%d at LSN %s: %w", p.table, id, lsn, err))
				return
			}
			p.commitToAck.Observe(time.Since(commit).Seconds())
			pend.Ack(size)
		}
		if p.log.Debug().Enabled() {
			p.log.Debug().Int64("id", id).Str("lsn", lsn.String()).Str("topic", m.Topic).Msg("publish")
		}
		if err := p.pub.Publish(p.pubCtx, m); err != nil {
			return err
		}
	}
	return nil
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

func (p *pipeline) stop(err error) {
	if p.failed.CompareAndSwap(false, true) {
		p.fail(err)
	}
}

func (p *pipeline) countDecoder() {
	c := p.dec.Counts()
	p.otherRows.Add(c.OtherTableRows - p.prevDec.OtherTableRows)
	p.decoded.Add(c.Events - p.prevDec.Events)
	p.prevDec = c
}

// headers builds the Kafka headers of one event: the relay's own, then each
// top-level key of the row's headers column.
func headers(ev *decoder.Event, commitLSN pglogrepl.LSN) []sarama.RecordHeader {
	h := make([]sarama.RecordHeader, 0, 5+len(ev.Headers))
	h = append(h,
		sarama.RecordHeader{Key: []byte("event_id"), Value: strconv.AppendInt(nil, ev.ID, 10)},
		sarama.RecordHeader{Key: []byte("event_type"), Value: []byte(ev.EventType)},
		sarama.RecordHeader{Key: []byte("aggregate_type"), Value: []byte(ev.AggregateType)},
		sarama.RecordHeader{Key: []byte("aggregate_id"), Value: []byte(ev.AggregateID)},
		sarama.RecordHeader{Key: []byte("pg_lsn"), Value: []byte(commitLSN.String())},
	)
	for _, x := range ev.Headers {
		h = append(h, sarama.RecordHeader{Key: []byte(x.Key), Value: x.Value})
	}
	return h
}

// Flushed implements replication.Progress.
func (p *pipeline) Flushed() pglogrepl.LSN { return p.tracker.Flushed() }

// Idle implements replication.Progress; called on the loop goroutine, so
// the decoder's state is consistent with everything handled so far.
func (p *pipeline) Idle(walEnd pglogrepl.LSN) {
	if !p.dec.InTxn() {
		p.tracker.AdvanceIdle(walEnd)
	}
}

// Drain implements replication.Progress: wait for acks, then start a fresh
// decoder for the next session (relations are resent by the server).
func (p *pipeline) Drain(ctx context.Context) error {
	if p.failed.Load() {
		// A failed event never acks; wait briefly for the others only.
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
