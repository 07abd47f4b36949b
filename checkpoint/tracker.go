// Package checkpoint decides which WAL position may be confirmed to PostgreSQL.
//
// Transactions enter in log order (Add); broker acks for their events arrive in
// any order and from any goroutine (Pending.Ack). The watermark is the end LSN
// of the longest prefix of transactions whose events are all acked, so it never
// passes an event the broker has not acknowledged. The slot's
// confirmed_flush_lsn, fed from this watermark, is the only durable checkpoint.
//
// The shape follows hashicorp/raft's commitment: a mutex, an ordered pending
// list, a monotonic watermark and a non-blocking notify. The one exception to
// monotonic is Reset, between replication sessions, when the server's
// history may not hold what the watermark covers.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// Limits bound the work in flight between the decoder and broker acks.
type Limits struct {
	// MaxEvents is the most events added but not yet acked; 0 is no limit.
	// A single transaction larger than this is still admitted when no event
	// or byte is in flight, or it could never make progress.
	MaxEvents int
	// MaxBytes is the most payload bytes added but not yet acked (0 is no
	// limit), with the same single-transaction exception.
	MaxBytes int64
}

// ErrOutOfOrder is returned by Add when a transaction ends at or before the
// last position added (by Add or Mark; Abandon lowers that to the
// watermark, Reset forgets it): the caller broke the log-order contract.
var ErrOutOfOrder = errors.New("transaction added out of log order")

// ErrInFlight is returned by Reset while transactions are in flight.
var ErrInFlight = errors.New("transactions still in flight")

// Tracker computes the confirmable watermark. All methods are safe for
// concurrent use, but Add and Mark carry log order: call them from one
// goroutine (the replication loop's).
type Tracker struct {
	limits Limits
	now    func() time.Time // time.Now; tests swap it

	mu        sync.Mutex
	pending   []*Pending // log order; pending[head:] are live
	head      int
	lastAdded pglogrepl.LSN
	watermark pglogrepl.LSN
	events    int           // events in flight
	bytes     int64         // payload bytes in flight
	space     chan struct{} // closed and replaced when in-flight work shrinks and someone waits
	waiting   bool          // a goroutine waits on space: only then does an ack pay for a new channel
	advanced  chan struct{} // cap 1: a non-blocking "watermark moved" signal
}

// Pending is one transaction's (or chunk's) share of the tracker. Ack it
// once per event, from any goroutine; after Abandon its acks are ignored.
type Pending struct {
	t         *Tracker
	end       pglogrepl.LSN
	remaining int
	bytes     int64
	abandoned bool      // dropped by Abandon: its acks are ignored
	added     time.Time // when Add registered it: the age of its unacked events
}

// New returns a tracker whose watermark starts at start (the slot's
// confirmed_flush_lsn): everything before it is already durable downstream.
func New(start pglogrepl.LSN, limits Limits) *Tracker {
	return &Tracker{
		limits:    limits,
		now:       time.Now,
		watermark: start,
		space:     make(chan struct{}),
		advanced:  make(chan struct{}, 1),
	}
}

// Add registers a transaction that ends at end with n events carrying bytes
// payload bytes. A large transaction may be added in chunks: every chunk but
// the last has end 0, and the watermark cannot pass a chunk until the
// transaction's last chunk (with its end LSN) is acked too. It must be
// called in log order from one goroutine (the replication handler, the
// goroutine that calls Mark). It blocks while adding n events and bytes
// would pass a limit and something is in flight, until acks (or Abandon)
// make room, and returns ctx.Err() if ctx ends first. It returns an error
// wrapping ErrOutOfOrder for a non-zero end at or before the last position
// added, and an error for a negative n or bytes. A transaction with n == 0
// is complete at once but still keeps its place, so the watermark reaches
// it only after every earlier transaction is acked.
func (t *Tracker) Add(ctx context.Context, end pglogrepl.LSN, n int, bytes int64) (*Pending, error) {
	if n < 0 || bytes < 0 {
		return nil, fmt.Errorf("add transaction ending at %s: negative size (%d events, %d bytes)", end, n, bytes)
	}
	t.mu.Lock()
	if end != 0 && end <= t.lastAdded {
		last := t.lastAdded
		t.mu.Unlock()
		// Postgres may resend transactions below the start position after a
		// restart; the caller filters those, so reaching here is a bug.
		return nil, fmt.Errorf("add transaction ending at %s after %s: %w", end, last, ErrOutOfOrder)
	}
	for !t.fits(n, bytes) {
		wait := t.spaceLocked()
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wait:
		}
		t.mu.Lock()
	}
	p := &Pending{t: t, end: end, remaining: n, bytes: bytes, added: t.now()}
	if end != 0 {
		t.lastAdded = end
	}
	t.events += n
	t.bytes += bytes
	t.pending = append(t.pending, p)
	t.advanceLocked()
	t.mu.Unlock()
	return p, nil
}

// Mark registers a position without events (a heartbeat's WAL record) in
// log order, from the goroutine that calls Add: the watermark reaches it
// once every transaction added before it is acked, at once when nothing is
// in flight. A position at or before the last one added, or the watermark,
// is ignored (a resend after a reconnect). It never blocks and counts as
// no event.
func (t *Tracker) Mark(at pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at <= t.lastAdded || at <= t.watermark {
		return
	}
	t.pending = append(t.pending, &Pending{t: t, end: at, added: t.now()})
	t.lastAdded = at
	t.advanceLocked()
}

// fits reports whether a transaction of n events and b bytes may enter now.
// Caller holds t.mu.
func (t *Tracker) fits(n int, b int64) bool {
	if t.events == 0 && t.bytes == 0 {
		return true // never starve a transaction larger than the limits
	}
	if t.limits.MaxEvents > 0 && t.events+n > t.limits.MaxEvents {
		return false
	}
	if t.limits.MaxBytes > 0 && t.bytes+b > t.limits.MaxBytes {
		return false
	}
	return true
}

// Ack records the broker's acknowledgement of one event of size bytes. It may
// be called from any goroutine; it takes the tracker's mutex but never
// waits on I/O. Acking more events than were added is a bug and panics,
// because silently absorbing it could move the watermark past an unacked
// event. After Abandon dropped the transaction, an ack is ignored.
func (p *Pending) Ack(bytes int64) { p.AckN(1, bytes) }

// AckN is n calls of Ack whose sizes sum to bytes, under one lock: the
// acks of a record batch's events of one transaction. Same rules as Ack;
// n < 1 panics too.
func (p *Pending) AckN(n int, bytes int64) {
	t := p.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.abandoned {
		return
	}
	if n < 1 || p.remaining < n {
		panic(fmt.Sprintf("checkpoint: %d acks for transaction ending at %s with %d events unacked", n, p.end, p.remaining))
	}
	p.remaining -= n
	if bytes > p.bytes {
		bytes = p.bytes
	}
	p.bytes -= bytes
	t.events -= n
	t.bytes -= bytes
	if p.remaining == 0 {
		// Release whatever the per-event byte counts did not cover.
		t.bytes -= p.bytes
		p.bytes = 0
	}
	if t.waiting {
		close(t.space)
		t.space = make(chan struct{})
		t.waiting = false
	}
	t.advanceLocked()
}

// spaceLocked returns the channel closed by the next ack and marks that
// someone waits on it. Caller holds t.mu.
func (t *Tracker) spaceLocked() <-chan struct{} {
	t.waiting = true
	return t.space
}

// End is the LSN the transaction ends at.
func (p *Pending) End() pglogrepl.LSN { return p.end }

// advanceLocked pops fully acked transactions off the front. O(1) amortised
// per transaction. Caller holds t.mu.
func (t *Tracker) advanceLocked() {
	moved := false
	for t.head < len(t.pending) && t.pending[t.head].remaining == 0 {
		// A chunk (end 0) is not a transaction boundary: it is popped when
		// acked but only the transaction's last chunk moves the watermark.
		if end := t.pending[t.head].end; end > t.watermark {
			t.watermark = end // stays monotonic after an idle advance
		}
		t.pending[t.head] = nil
		t.head++
		moved = true
	}
	if t.head == len(t.pending) {
		t.pending = t.pending[:0]
		t.head = 0
	} else if t.head > 1024 && t.head*2 > len(t.pending) {
		n := copy(t.pending, t.pending[t.head:])
		clear(t.pending[n:])
		t.pending = t.pending[:n]
		t.head = 0
	}
	if moved {
		select {
		case t.advanced <- struct{}{}:
		default:
		}
	}
}

// AdvanceIdle moves the watermark up to walEnd when nothing is pending (no
// transaction, chunk or Mark not yet passed); otherwise, or when walEnd is
// not above the watermark, it does nothing. The caller (the replication
// loop, via the pipeline, at a keepalive and at the start of a session)
// must only call it while the decoder is between transactions; then no
// event below walEnd can still arrive, and confirming it stops an
// insert-only slot from pinning WAL while other tables are written. It
// never blocks.
func (t *Tracker) AdvanceIdle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head < len(t.pending) || walEnd <= t.watermark {
		return
	}
	t.watermark = walEnd
	select {
	case t.advanced <- struct{}{}:
	default:
	}
}

// Abandon drops every transaction in flight: the caller delivers their
// events again from the watermark (a rewind after a publish error). The
// watermark stays; acks of a dropped transaction are ignored; transactions
// after the watermark may be added again. It wakes an Add blocked on the
// limits and a WaitDrained. Any goroutine; it never blocks.
func (t *Tracker) Abandon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pending[t.head:] {
		p.abandoned = true
	}
	clear(t.pending)
	t.pending, t.head = t.pending[:0], 0
	t.events, t.bytes = 0, 0
	t.lastAdded = t.watermark
	if t.waiting {
		close(t.space)
		t.space = make(chan struct{})
		t.waiting = false
	}
}

// Reset moves the watermark to lsn, down as well as up, and forgets the
// last position added (Add's order check starts over), so the
// transactions after lsn can be added again. It is for a replication session that starts at the server's
// confirmed position when the watermark may not be on the server's WAL
// history (a failover, a slot put back by an operator): the watermark must
// then not hide anything the server will send. It refuses with ErrInFlight
// while anything is in flight (call it after WaitDrained), because acks for
// those transactions would move the watermark on the old history; a
// pending Mark counts as in flight. Any goroutine; it never blocks.
func (t *Tracker) Reset(lsn pglogrepl.LSN) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head < len(t.pending) {
		return fmt.Errorf("reset the watermark from %s to %s: %d events: %w", t.watermark, lsn, t.events, ErrInFlight)
	}
	t.watermark = lsn
	t.lastAdded = 0
	select {
	case t.advanced <- struct{}{}:
	default:
	}
	return nil
}

// Flushed returns the watermark: every transaction ending at or before it is
// fully acked. Safe from any goroutine.
func (t *Tracker) Flushed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark
}

// Oldest returns when the oldest transaction with an unacked event was
// added, and false when nothing is in flight. Fully acked transactions leave
// the front of the list at once, so this is the front's Add time. Safe from
// any goroutine; O(1).
func (t *Tracker) Oldest() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head == len(t.pending) {
		return time.Time{}, false
	}
	return t.pending[t.head].added, true
}

// Limits returns the configured in-flight limits (0: none). Any goroutine.
func (t *Tracker) Limits() (events int, bytes int64) { return t.limits.MaxEvents, t.limits.MaxBytes }

// InFlight returns the events and payload bytes added but not yet acked (nor
// dropped by Abandon). Any goroutine.
func (t *Tracker) InFlight() (events int, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events, t.bytes
}

// Advanced returns a channel that receives (without blocking the sender)
// after the watermark may have moved: when acked transactions, chunks or
// marks leave the front (a chunk, end 0, moves nothing), on AdvanceIdle and
// on Reset. One receive may stand for several moves, or for none. It has
// one buffered slot: give it to one receiver (the replication loop, for
// status updates).
func (t *Tracker) Advanced() <-chan struct{} { return t.advanced }

// WaitDrained blocks until nothing is pending (every transaction acked or
// dropped by Abandon, every Mark passed) and returns nil, or returns
// ctx.Err() once ctx ends. The pipeline's Drain uses it at shutdown and
// before each replication session starts, so the session starts at a
// watermark that covers everything already sent. Any goroutine.
func (t *Tracker) WaitDrained(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.head == len(t.pending) {
			t.mu.Unlock()
			return nil
		}
		wait := t.spaceLocked()
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait:
		}
	}
}
