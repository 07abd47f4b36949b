package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Where a session resumes. The server streams from the slot's confirmed
// position, which lags what the relay acked (status updates lost with a
// connection, a PostgreSQL restart taking the slot back to its last save).
// The transactions in between were delivered: the pipeline skips them, but
// only provisionally (history.Filter): nothing skipped is confirmed to the
// slot until the stream hands out the kept transaction itself again, which
// proves the WAL in between is the one delivered. A restore or a failover
// that rewrote those LSNs shows up as a mismatch, and the session restarts
// from the slot publishing everything. Two kept positions compete: the
// pipeline's own (the last transaction it knows acked, in this process) and
// the delivery's (Keeper: exactly-once's checkpoint, across processes).

// points are the transactions registered with the tracker, in log order,
// until the watermark passes them: the newest passed is the pipeline's kept
// position. Loop goroutine only.
type points struct {
	mark history.Mark // the session's history, which every point in q is on
	q    []point
	head int
	last history.Point // the newest the watermark passed; EndLSN 0: none
}

// point is a transaction of q; without the Mark (one per session), so
// registering a transaction copies 48 bytes, not a history.Point.
type point struct {
	commit, end pglogrepl.LSN
	xid         uint32
	at          time.Time
}

func (ps *points) add(t *decoder.Txn) {
	ps.q = append(ps.q, point{commit: t.CommitLSN, end: t.EndLSN, xid: t.Xid, at: t.CommitTime})
}

// passed moves the points at or below the watermark w into last.
func (ps *points) passed(w uint64) {
	for ps.head < len(ps.q) && uint64(ps.q[ps.head].end) <= w {
		q := &ps.q[ps.head]
		ps.last = history.Point{Mark: ps.mark, CommitLSN: q.commit, EndLSN: q.end, Xid: q.xid, CommitTime: q.at}
		ps.head++
	}
	if ps.head == len(ps.q) || ps.head > 1024 && ps.head*2 > len(ps.q) {
		n := copy(ps.q, ps.q[ps.head:])
		ps.q, ps.head = ps.q[:n], 0
	}
}

// drop forgets the points not passed: their transactions come again.
func (ps *points) drop() { ps.q, ps.head = ps.q[:0], 0 }

// Kept is the last transaction the watermark passed, on the history it was
// acked on; for the next term of the process (PipelineConfig.Kept). Call it
// once the replication loop ended.
func (p *Pipeline) Kept() history.Point {
	p.pts.passed(uint64(p.tracker.Flushed()))
	return p.pts.last
}

// Session implements replication.Progress: the session about to stream is
// on now's history. Called on the loop goroutine after Drain and Reset (or
// AdvanceIdle), so nothing is in flight. It picks the kept position to skip
// up to, if any is on this history, and refuses a checkpoint of another
// slot or database.
func (p *Pipeline) Session(ctx context.Context, now history.Now) error {
	p.pts.passed(uint64(p.tracker.Flushed()))
	p.pts.drop()
	p.filter.Clear()
	p.unverified = 0
	p.pts.mark = now.Mark
	type cand struct {
		source string
		point  history.Point
	}
	var cands []cand
	if own := p.pts.last; own.EndLSN != 0 {
		cands = append(cands, cand{"watermark", own})
	}
	if k, ok := p.out.(Keeper); ok {
		kept, ok, err := k.Kept(ctx, now.Mark)
		if err != nil {
			return err
		}
		if ok {
			cands = append(cands, cand{"checkpoint", kept})
		}
	}
	var best *cand
	ownOnHistory := false
	for i := range cands {
		c := &cands[i]
		d := history.Decide(c.point, now)
		if c.point == p.refuted && d.Verdict == history.Apply {
			d = history.Decision{Verdict: history.Republish, Reason: "the stream showed another transaction at its commit LSN in an earlier session"}
		}
		if c.source == "watermark" && (d.Verdict == history.Apply || d.Verdict == history.Behind) {
			ownOnHistory = true
		}
		p.m.history.WithLabelValues(c.source, d.Verdict.String()).Inc()
		ev := p.log.Info()
		switch d.Verdict {
		case history.Refuse:
			if c.source == "checkpoint" {
				return fault.Fatal.Wrap(fmt.Errorf("the exactly-once checkpoint (commit %s, end %s) cannot be used: %s. Two slots or databases must not share exactly_once.transactional_id: give this relay an id of its own and restart",
					c.point.CommitLSN, c.point.EndLSN, d.Reason))
			}
			// The process followed its URL to another server: its own
			// position means nothing there (the stream logged the change).
			continue
		case history.Apply:
			if best == nil || c.point.EndLSN > best.point.EndLSN {
				best = c
			}
		case history.Republish:
			ev = p.log.Warn()
		}
		ev.Str("source", c.source).Str("verdict", d.Verdict.String()).Str("reason", d.Reason).
			Str("commit_lsn", c.point.CommitLSN.String()).Str("end_lsn", c.point.EndLSN.String()).
			Str("kept_history", c.point.Mark.String()).Str("history", now.Mark.String()).
			Msg("kept position against the server's history")
	}
	if best != nil {
		p.filter.Set(best.point)
	}
	p.resend.resumed(ownOnHistory)
	return nil
}

// resumeTxn applies the session's filter to txn before anything of it is
// built; done true: txn is handled (skipped, or the point verified).
func (p *Pipeline) resumeTxn(txn *decoder.Txn) (done bool, err error) {
	pt := p.filter.Point()
	switch p.filter.Check(history.Txn{CommitLSN: txn.CommitLSN, EndLSN: txn.EndLSN, Xid: txn.Xid, CommitTime: txn.CommitTime, Partial: txn.Partial}) {
	case history.Pass:
		return false, nil
	case history.Skip:
		p.unverified += len(txn.Events)
		return true, nil
	case history.Verified:
		// Everything up to here was delivered before: the watermark
		// passes it like a heartbeat, so the slot is confirmed past it.
		p.skipped(p.unverified + len(txn.Events))
		p.unverified = 0
		pt.Mark = p.pts.mark // on this history now
		p.pts.last = pt
		p.tracker.Mark(pt.EndLSN)
		p.log.Info().Str("commit_lsn", pt.CommitLSN.String()).Str("end_lsn", pt.EndLSN.String()).
			Msg("resumed at the kept position: the stream showed its transaction again; transactions up to it were delivered and are not published again")
		return true, nil
	}
	p.refute(pt)
	p.log.Warn().Str("kept_commit_lsn", pt.CommitLSN.String()).Str("kept_end_lsn", pt.EndLSN.String()).Uint32("kept_xid", pt.Xid).
		Str("commit_lsn", txn.CommitLSN.String()).Str("end_lsn", txn.EndLSN.String()).Uint32("xid", txn.Xid).
		Msg("the WAL at the kept position holds another transaction (the database was restored or failed over): restarting from the slot and publishing everything after it")
	return true, replication.ErrRestart
}

// resumeIdle is a keepalive while the session's resume is not verified: the
// watermark stays (nothing skipped may be confirmed yet), and a keepalive
// past the kept transaction's end, with no transaction open, means the
// server sent everything up to there without it (the WAL there holds only
// other tables' changes): the session restarts without the point.
func (p *Pipeline) resumeIdle(walEnd pglogrepl.LSN) {
	pt := p.filter.Point()
	if p.dec.InTxn() || walEnd < pt.EndLSN {
		return
	}
	p.filter.Clear()
	p.refute(pt)
	p.refuting.Store(true)
	p.log.Warn().Str("kept_commit_lsn", pt.CommitLSN.String()).Str("kept_end_lsn", pt.EndLSN.String()).Uint32("kept_xid", pt.Xid).
		Str("wal_end", walEnd.String()).
		Msg("the server streamed past the kept position without its transaction (the database was restored or failed over): restarting from the slot and publishing everything after it")
}

// refute records that the stream disproved pt. Nothing was registered since
// the session started (every transaction so far was skipped), and neither
// keepalives nor heartbeats moved the watermark while the filter was active
// (AdvanceIdle, heartbeat): the session restarts from the slot's position,
// and everything skipped comes again.
func (p *Pipeline) refute(pt history.Point) {
	p.unverified = 0
	p.refuted = pt
	if p.pts.last == pt {
		p.pts.last = history.Point{}
	}
	p.m.history.WithLabelValues("stream", "mismatch").Inc()
}

// endResume ends the session's resume (Drain: the session is over); a
// point not verified by now is applied again only by the next Session.
func (p *Pipeline) endResume() {
	p.filter.Clear()
	p.unverified = 0
	p.refuting.Store(false)
}

// skipCounter is a Delivery that counts the events a resume skipped
// (exactly-once: outbox_relay_exactly_once_skipped_events_total).
type skipCounter interface{ Skipped(events int) }

func (p *Pipeline) skipped(events int) {
	p.m.resumeSkipped.Add(float64(events))
	if c, ok := p.out.(skipCounter); ok {
		c.Skipped(events)
	}
}
