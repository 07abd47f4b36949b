package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

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
	finished bool               // dead-lettered before a rewind, or skipped: acked without a record
	resized  bool               // its dead letter went again as it was after a batch was refused for its size
	message  bool               // a message event (decoder.SourceMessage): no outbox row to mark
	skipped  bool               // acked before a rewind with nothing before it to resend (resendLog.skips)
	gen      uint32             // the session it was handed over in (resendLog.gen)
	msgID    string             // its envelope id
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

// Acked is the one ack path: every record in msgs (acked together, at) is
// in Kafka. The delivery calls it with a record batch (the direct engine:
// one partition, in publish order; a transactional delivery: a committed
// Kafka transaction), a record's Done(nil) with that record alone. The per-batch
// work is done once: the order watch sees each partition run's last
// position, and the deliveries of one transaction that follow each other
// settle with one tracker call (in a drain of 100-row transactions these
// were a lock, a map lookup and a compare-and-swap per event). A dead
// letter goes on through letterAcked; a record that is no delivery of this
// pipeline through its Done. Any goroutine; it does not block.
func (p *Pipeline) Acked(msgs []*sink.Message, at time.Time) {
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
	if p.resend.on {
		p.resend.acked(msgs)
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
		switch {
		case !ok:
			m.Done(nil)
			continue
		case d.letter != nil:
			d.letterAcked()
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

// letterAcked: d's dead letter is in Kafka. A message's is acked now; a
// row's once the row is marked too.
func (d *delivery) letterAcked() {
	p := d.p
	p.m.deadLettered.WithLabelValues(d.letter.Reason, d.tableLabel()).Inc()
	if d.message {
		// No row to mark: the dead letter is the only copy (the slot
		// was the other), so it is acked once Kafka has it.
		d.deadLettered()
		return
	}
	p.marks.push(rowMark{d: d, dead: true}, 0) // acks once the row says so
}

// done is the broker's verdict on d.msg, for a delivery that does not hand
// over its acks in batches: an ack goes on to Acked, a failure is handled
// here. It runs on the producer's goroutines and must not block:
// everything slow goes through a queue.
func (d *delivery) done(err error) {
	p := d.p
	if err == nil {
		at := d.msg.Acked
		if at.IsZero() {
			at = time.Now()
		}
		one := [1]*sink.Message{&d.msg}
		p.Acked(one[:], at)
		return
	}
	// lost: the record's Kafka transaction was aborted, so
	// nothing of it reached consumers and everything in it comes again
	// after a rewind: the event, or its dead letter once on_poison applies.
	var abort *sink.AbortError
	lost := errors.As(err, &abort)
	if !lost || abort.Own {
		d.attempts++ // not for an abort another record caused
	}
	reason, kind := sink.Classify(err)
	certain := sink.Certain(err)
	action := record.Decide(record.Failure{Kind: kind, Attempts: d.attempts, DeadLetter: d.letter != nil, Certain: certain}, p.policy)
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
	if d.letter != nil && lost && certain && reason == "message_too_large" {
		// Exactly-once: the dead letter, alone in its Kafka transaction,
		// was refused for its size. It is made again after the rewind,
		// one step smaller each time.
		if _, ok := record.Shrink(d.letter, d.msg); ok {
			p.rewind.deadLater(d.pos, d.letter.Reason, errors.New(d.letter.Err), d.letter.Cuts())
			p.order.fail(d.msg.Topic, d.msg.Partition, d.pos)
			ev.Warn().Err(err).Int("max_bytes", d.letter.MaxBytes).
				Msg("the dead-letter topic refused the dead letter for its size; it is cut down further and written again after the rewind")
			if p.rewind.park(d.pos, d.attempts, 0) {
				p.m.rewinds.Inc()
			}
			return
		}
		err = fmt.Errorf("%w; even the least dead letter (no payload, no row headers, no error text) is too large: raise max.message.bytes of topic %s", err, d.msg.Topic)
	}
	if d.letter != nil && !lost && reason == "message_too_large" && kind == fault.Poison {
		// The dead-letter topic's max.message.bytes is below
		// kafka.max_message_bytes: cut the letter down further and send it
		// again. A letter refused in a batch with others may not be the
		// one too large: it goes again as it is, once.
		if !certain && !d.resized {
			d.resized = true
			ev.Warn().Err(err).Msg("dead letter refused for its size in a batch; sending it again alone")
			p.retries.push(d, p.policy.Delay(record.RetryPoison, 1))
			return
		}
		if msg, ok := record.Shrink(d.letter, d.msg); ok {
			d.msg = msg
			ev.Warn().Err(err).Int("max_bytes", d.letter.MaxBytes).
				Msg("the dead-letter topic refused the dead letter for its size; cutting it down further (row headers, payload, error text) and sending it again")
			p.retries.push(d, 0)
			return
		}
		err = fmt.Errorf("%w; even the least dead letter (no payload, no row headers, no error text) is too large: raise max.message.bytes of topic %s", err, d.msg.Topic)
	}
	if lost && action != record.Halt {
		// The event (or its dead letter, now due) goes into a later Kafka
		// transaction after the rewind (deadNext).
		switch {
		case action == record.DeadLetter:
			p.rewind.deadLater(d.pos, reason, fmt.Errorf("publish to topic %s: %w", d.msg.Topic, err), 0)
		case d.letter != nil:
			p.rewind.deadLater(d.pos, d.letter.Reason, errors.New(d.letter.Err), d.letter.Cuts())
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
		if p.resend.on {
			p.resend.failed(d)
		}
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
			err = fmt.Errorf("publish %s at LSN %s: %w; %s", d.name(), d.lsn, err, sink.RefusedFix(err))
		case reason == "authorization":
			err = fmt.Errorf("publish %s at LSN %s: %w; grant the relay's Kafka user Write on topic %s (or use on_poison: dlq)", d.name(), d.lsn, err, d.msg.Topic)
		default:
			err = fmt.Errorf("publish %s at LSN %s: %w", d.name(), d.lsn, err)
		}
		p.halt(d, err)
	}
}

// republish is the retry goroutine's job. An error ends Run: the delivery
// is stopped, so the event stays unacked and the slot keeps it.
func (p *Pipeline) republish(ctx context.Context, d *delivery) error {
	if err := p.out.Publish(ctx, &d.msg); err != nil {
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
	d.msg.Done, d.msg.Ref = d.done, d
	d.logID(p.log.Error().Err(cause)).Str("lsn", d.lsn.String()).Str("reason", reason).
		Str("dlq_topic", p.policy.Topic).Int("attempts", d.attempts).
		Msg("poison event: dead-lettering it; later events of its aggregate go on")
}
