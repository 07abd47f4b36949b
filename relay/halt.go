package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/sink"
)

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
	msg := "HALTED: publishing stopped at a poison event and the slot is held before it; fix the cause, then restart the relay (or use on_poison: dlq)"
	if _, kind := sink.Classify(err); kind == fault.Refused {
		// The relay's credentials or rights, not the event: dead-lettering
		// would not help, and the operator must not look for a bad row.
		msg = "HALTED: Kafka refused the relay's credentials or rights, so publishing stopped and the slot is held before this event; fix them as the error says, then restart the relay"
	}
	d.logID(e).Str("lsn", d.lsn.String()).Str("commit_lsn", d.txnLSN.String()).Msg(msg)
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
