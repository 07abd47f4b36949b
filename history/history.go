// Package history decides whether a position the relay kept (its own ack
// watermark across a reconnect, or an exactly-once checkpoint in Kafka) may
// be used on the server it now streams from.
//
// A position is an LSN, and an LSN means something only on the history it
// was taken on: after a failover to a standby that lagged, or a restore
// from a snapshot, the same LSNs hold other transactions. Skipping "what is
// already delivered" by LSN then skips events that never were. So every
// kept position carries the history it belongs to (Mark: system id,
// timeline, slot and the slot's creation, and a generation counter kept in
// PostgreSQL that a restore winds back with the data) and the transaction
// at it (Point: commit LSN, end LSN, xid and commit time). Decide compares
// the mark with the server's; a position that passes is applied only
// provisionally: Filter skips the transactions up to it and confirms the
// history when the stream hands out that very transaction again. Anything
// else republishes: duplicates are allowed, loss is not.
//
// The package is pure: no I/O, no clocks.
package history

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Mark is the history a position belongs to. A zero field is unknown (a
// record written before the field existed, a registry without the column)
// and is not compared.
type Mark struct {
	SystemID string
	Timeline int32
	Slot     string
	// SlotLSN and SlotXid are the slot's creation as the slot registry
	// recorded it (created_lsn, created_xid): a slot dropped and created
	// again under the same name has other values.
	SlotLSN pglogrepl.LSN
	SlotXid uint64
	// Generation is the registry's generation counter as this relay last
	// saw it: the relay raises it at every session start, a restore winds
	// it back with the data. 0: unknown.
	Generation int64
}

func (m Mark) String() string {
	return fmt.Sprintf("system %s timeline %d slot %s created at %s (xid %d) generation %d",
		m.SystemID, m.Timeline, m.Slot, m.SlotLSN, m.SlotXid, m.Generation)
}

// Point is one transaction on a history: the last one a position covers.
// A zero Xid and CommitTime (an exactly-once checkpoint written before they
// were recorded) make Filter compare the LSNs only.
type Point struct {
	Mark       Mark
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN
	Xid        uint32
	CommitTime time.Time
}

// Now is the server a session is about to stream from.
type Now struct {
	Mark Mark
	// Raised is the generation the registry held before this session
	// raised it (Mark.Generation is after); 0 unknown.
	Raised int64
	// Confirmed is the slot's confirmed_flush_lsn; ServerEnd the server's
	// WAL end (IDENTIFY_SYSTEM's xlogpos) when the session started.
	Confirmed, ServerEnd pglogrepl.LSN
}

// Verdict is what Decide says of a kept position.
type Verdict uint8

const (
	// Apply: skip the transactions up to the point, provisionally (Filter).
	Apply Verdict = iota
	// Behind: the slot's confirmed position is at or past the point; there
	// is nothing to skip.
	Behind
	// Republish: the point is not known to be on this history; everything
	// from the slot's position is published (duplicates, never loss).
	Republish
	// Refuse: the position is another slot's or another database's;
	// neither applying nor ignoring it is safe to decide alone (a shared
	// exactly_once.transactional_id fences the other relay's producer).
	Refuse
)

func (v Verdict) String() string {
	return [...]string{"apply", "behind", "republish", "refuse"}[v]
}

// Decision is Decide's answer, with the reason in words for the log.
type Decision struct {
	Verdict Verdict
	Reason  string
}

// Decide says whether p may be applied on now's server. It never answers
// with a skip that is not verified later: Apply is provisional (Filter).
func Decide(p Point, now Now) Decision {
	was, is := p.Mark, now.Mark
	switch {
	case was.SystemID != "" && is.SystemID != "" && was.SystemID != is.SystemID:
		return Decision{Refuse, fmt.Sprintf("written on PostgreSQL system_id %s, this server is system_id %s", was.SystemID, is.SystemID)}
	case was.Slot != "" && is.Slot != "" && was.Slot != is.Slot:
		return Decision{Refuse, fmt.Sprintf("written for slot %s, this relay reads slot %s", was.Slot, is.Slot)}
	case p.EndLSN == 0:
		return Decision{Republish, "the position has no end LSN"}
	case differs(uint64(was.SlotLSN), uint64(is.SlotLSN)) || differs(was.SlotXid, is.SlotXid):
		return Decision{Republish, fmt.Sprintf("slot %s was created again since (created at %s xid %d then, at %s xid %d now)",
			is.Slot, was.SlotLSN, was.SlotXid, is.SlotLSN, is.SlotXid)}
	case was.Timeline != 0 && is.Timeline != 0 && was.Timeline != is.Timeline:
		return Decision{Republish, fmt.Sprintf("written on timeline %d, this server is on timeline %d (a failover or a point-in-time recovery)", was.Timeline, is.Timeline)}
	case was.Generation != 0 && now.Raised != 0 && now.Raised < was.Generation:
		return Decision{Republish, fmt.Sprintf("the database's generation went back from %d to %d: it was restored from a backup or snapshot", was.Generation, now.Raised)}
	case p.EndLSN <= now.Confirmed:
		return Decision{Behind, fmt.Sprintf("the slot is confirmed at %s, at or past the position %s", now.Confirmed, p.EndLSN)}
	case now.ServerEnd != 0 && now.ServerEnd < p.EndLSN:
		return Decision{Republish, fmt.Sprintf("the server's WAL ends at %s, before the position %s: the server went back (a restore)", now.ServerEnd, p.EndLSN)}
	}
	return Decision{Apply, fmt.Sprintf("the same history; transactions up to %s are skipped once the stream shows the one at %s (xid %d) again", p.EndLSN, p.CommitLSN, p.Xid)}
}

// differs compares two values of which 0 is unknown.
func differs(a, b uint64) bool { return a != 0 && b != 0 && a != b }

// Step is Filter's answer for one transaction.
type Step uint8

const (
	// Pass: publish it (no point, or the point was verified).
	Pass Step = iota
	// Skip: at or before the point; not published, and not confirmed to
	// the slot before the point is verified.
	Skip
	// Verified: this is the point's own transaction; it and everything
	// skipped before it are delivered. Not published.
	Verified
	// Mismatch: the stream passed the point without its transaction, or
	// the transaction at its commit LSN is another one: the history is not
	// the one the point was taken on. Everything skipped must be published
	// after all (the session restarts from the slot without the point).
	Mismatch
)

func (s Step) String() string {
	return [...]string{"pass", "skip", "verified", "mismatch"}[s]
}

// Txn is what Filter needs of a decoded transaction (or a chunk of one:
// Partial, whose CommitLSN is already the final one).
type Txn struct {
	CommitLSN, EndLSN pglogrepl.LSN
	Xid               uint32
	CommitTime        time.Time
	Partial           bool
}

// Filter applies a point the stream has yet to confirm. The zero Filter
// passes everything. Not safe for concurrent use.
type Filter struct {
	p      Point
	active bool
}

// Set makes f skip up to p until it is verified.
func (f *Filter) Set(p Point) { f.p, f.active = p, true }

// Clear makes f pass everything.
func (f *Filter) Clear() { f.active = false }

// Active reports whether f still waits for its point.
func (f *Filter) Active() bool { return f.active }

// Point is the point f waits for (valid while Active).
func (f *Filter) Point() Point { return f.p }

// Check says what to do with t. After Verified or Mismatch f is cleared.
func (f *Filter) Check(t Txn) Step {
	if !f.active {
		return Pass
	}
	switch {
	case t.CommitLSN < f.p.CommitLSN:
		return Skip
	case t.CommitLSN > f.p.CommitLSN:
		f.active = false
		return Mismatch
	case t.Partial:
		if f.p.Xid != 0 && t.Xid != 0 && t.Xid != f.p.Xid {
			f.active = false
			return Mismatch
		}
		return Skip // the last chunk verifies
	}
	f.active = false
	if t.EndLSN != f.p.EndLSN || (f.p.Xid != 0 && t.Xid != f.p.Xid) ||
		(!f.p.CommitTime.IsZero() && !t.CommitTime.Equal(f.p.CommitTime)) {
		return Mismatch
	}
	return Verified
}
