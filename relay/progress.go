package relay

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/record"
)

// heartbeat handles one of the relay's heartbeats read from the slot: no
// event, nothing to publish. Every transaction that committed before its
// record was handed over before it, so the watermark may move to it once
// they are acked (at once when nothing is in flight, like an idle
// keepalive): a heartbeat never holds the slot back. The lag clock learns
// where it sits.
func (p *Pipeline) heartbeat(hb decoder.Heartbeat) {
	if !p.filter.Active() { // a resume not verified yet: nothing skipped may be confirmed
		p.tracker.Mark(hb.LSN)
	}
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
	dec.SetPublication(p.publication)
	for i, cols := range p.expect.cols {
		dec.Expect(i, cols, p.expect.at)
	}
	dec.SetMessagePrefix(p.msgPrefix, p.policy.MaxMessageBytes)
	if p.dec != nil {
		p.dec.Close()
	}
	p.dec, p.prevDec, p.prevStream = dec, decoder.Counts{}, decoder.Counts{}
	p.countStream()
	return nil
}

// Prepared implements the stream's OnPrepared: the decoder refuses, from
// the session's check on, a Relation message of an outbox table without a
// column the relay reads that the table had then (decoder.Decoder.Expect):
// the publication changed to strip it. Called on the loop goroutine.
func (p *Pipeline) Prepared(info pgsetup.SlotInfo) {
	if len(info.Columns) != len(p.outboxes) {
		return // a stream tested without a server
	}
	p.expect.cols, p.expect.at = info.Columns, info.CheckedAt
	for i, cols := range info.Columns {
		p.dec.Expect(i, cols, info.CheckedAt)
	}
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
func (p *Pipeline) Restarting() bool { return p.rewind.active.Load() || p.refuting.Load() }

// AdvanceIdle implements replication.Progress; called on the loop goroutine,
// so the decoder's state is consistent with everything handled so far.
func (p *Pipeline) AdvanceIdle(walEnd pglogrepl.LSN) {
	if p.filter.Active() {
		p.resumeIdle(walEnd)
		return
	}
	// A halt may sit before walEnd with nothing in flight.
	if !p.dec.InTxn() && p.halted.Load() == nil {
		p.tracker.AdvanceIdle(walEnd)
	}
}

// Reset implements replication.Progress: the watermark goes to lsn, down as
// well as up, when nothing is in flight (checkpoint.Tracker.Reset). Called
// on the loop goroutine after Drain, so the decoder is fresh.
func (p *Pipeline) Reset(lsn pglogrepl.LSN) error {
	// The kept position is read off the watermark before it moves down.
	p.pts.passed(uint64(p.tracker.Flushed()))
	p.pts.drop()
	p.resend.reset = true // Session decides whether the skips still hold
	return p.tracker.Reset(lsn)
}

// Drain implements replication.Progress: wait for acks (until ctx ends),
// then start a fresh decoder for the next session (relations are resent by
// the server). During a rewind, or when one begins while it waits, it waits
// for every event to settle instead and drops the failed ones from the
// tracker: the next session publishes them again. Called on the loop
// goroutine.
func (p *Pipeline) Drain(ctx context.Context) error {
	p.endResume()
	p.out.Flush() // a delivery may hold acks back until it commits
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
			p.out.Restart()
			p.resend.forget() // not a rewind: nothing is skipped, nothing counts as republished
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
	p.resend.rewound() // before Abandon: what it decides is read off this session's acks
	p.tracker.Abandon()
	p.order.reset()
	p.rewind.reset()
	p.out.Restart()
	p.countDecoder()
	return p.resetDecoder()
}

// Handled counts the WAL messages Handle took: a delivery may watch it to
// tell a quiet stream. Any goroutine.
func (p *Pipeline) Handled() uint64 { return p.handled.Load() }

// Advanced receives (without blocking the sender) after the watermark
// moved; one receive may stand for several moves. Any goroutine.
func (p *Pipeline) Advanced() <-chan struct{} { return p.tracker.Advanced() }

// noteEvents keeps the commit LSN of the newest transaction with events, its
// earlier chunks' events included (a chunk's CommitLSN is its BeginLSN: only
// the last chunk has the commit). Loop goroutine.
func (p *Pipeline) noteEvents(txn *decoder.Txn) {
	if txn.Partial {
		p.chunked = p.chunked || len(txn.Events) > 0
		return
	}
	if (len(txn.Events) > 0 || p.chunked) && uint64(txn.CommitLSN) > p.eventLSN.Load() {
		p.eventLSN.Store(uint64(txn.CommitLSN)) // the newest: a rewind reads older ones again
	}
	p.chunked = false
}

// EventLSN is the commit LSN of the newest transaction with events handed
// to the pipeline (0: none yet): a confirmed position at or below it may
// still have to be kept (replication.SlotSaver); one above it covers only
// transactions without events. Any goroutine.
func (p *Pipeline) EventLSN() pglogrepl.LSN { return pglogrepl.LSN(p.eventLSN.Load()) }
