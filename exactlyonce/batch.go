package exactlyonce

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// batcher decides where Kafka transactions begin and end under delivery:
// exactly_once. A Kafka transaction holds whole PostgreSQL transactions
// only: it closes before the next PostgreSQL transaction would take it past
// maxEvents (or the in-flight bytes), once interval has passed since it
// opened, or when the session ends, always at a PostgreSQL transaction
// boundary. A PostgreSQL transaction larger than maxEvents, or handed over
// in chunks, gets a Kafka transaction of its own; one larger than the
// in-flight limits is refused (never split). Pure: the caller locks,
// commits and publishes.
type batcher struct {
	maxEvents      int   // exactly_once.max_batch_events
	inflightEvents int   // inflight.max_events
	inflightBytes  int64 // inflight.max_bytes
	interval       time.Duration

	open   bool      // a Kafka transaction is open
	opened time.Time // when it opened
	events int       // events in it
	bytes  int64

	inPG     bool // between the first chunk of a PostgreSQL transaction and its last
	pgEvents int  // events of that PostgreSQL transaction so far
	pgBytes  int64

	commitLSN pglogrepl.LSN // the last whole PostgreSQL transaction in the batch: its commit
	endLSN    pglogrepl.LSN // and end LSN (0: none yet)
}

// before is check and begin in one: the batcher tests' way.
func (bt *batcher) before(commitLSN pglogrepl.LSN, n int, b int64, partial bool) (commitFirst bool, err error) {
	if commitFirst, err = bt.check(commitLSN, n, b, partial); err == nil {
		bt.begin(n, b)
	}
	return commitFirst, err
}

// check is called before (a chunk of) a PostgreSQL transaction enters the
// tracker: n events, b payload bytes, partial when more chunks follow. It
// reports whether the open Kafka transaction must be committed first, or
// why the PostgreSQL transaction cannot be delivered. It changes nothing.
func (bt *batcher) check(commitLSN pglogrepl.LSN, n int, b int64, partial bool) (commitFirst bool, err error) {
	if bt.inPG {
		if bt.pgEvents+n > bt.inflightEvents || bt.pgBytes+b > bt.inflightBytes {
			return false, bt.tooLarge(commitLSN, bt.pgEvents+n, bt.pgBytes+b)
		}
		return false, nil
	}
	if n > bt.inflightEvents || b > bt.inflightBytes {
		return false, bt.tooLarge(commitLSN, n, b)
	}
	return bt.open && bt.events > 0 && (partial || bt.events+n > bt.maxEvents || bt.bytes+b > bt.inflightBytes), nil
}

// begin records that (a chunk of) a PostgreSQL transaction of n events and
// b bytes is being handed over: until after, the Kafka transaction may not
// be committed, since it would split the PostgreSQL one.
func (bt *batcher) begin(n int, b int64) {
	if !bt.inPG {
		bt.inPG, bt.pgEvents, bt.pgBytes = true, 0, 0
	}
	bt.pgEvents += n
	bt.pgBytes += b
}

func (bt *batcher) tooLarge(commitLSN pglogrepl.LSN, n int, b int64) error {
	return fmt.Errorf("the PostgreSQL transaction committed at LSN %s has more than %d events or %d payload bytes (%d events, %d bytes so far): "+
		"under delivery: exactly_once it must be one Kafka transaction, never split, and it does not fit the in-flight limits; "+
		"raise inflight.max_events and inflight.max_bytes above its size and restart the relay",
		commitLSN, bt.inflightEvents, bt.inflightBytes, n, b)
}

// opening records that a Kafka transaction opened at now (the first record
// published into it).
func (bt *batcher) opening(now time.Time) {
	if !bt.open {
		bt.open, bt.opened = true, now
	}
}

// added counts n events of b bytes handed to the open Kafka transaction.
func (bt *batcher) added(n int, b int64) {
	bt.events += n
	bt.bytes += b
}

// after is called once the last chunk of a PostgreSQL transaction was
// handed over. It reports whether the Kafka transaction is full and should
// be committed now.
func (bt *batcher) after(commitLSN, endLSN pglogrepl.LSN) (commitNow bool) {
	bt.inPG, bt.pgEvents, bt.pgBytes = false, 0, 0
	bt.commitLSN, bt.endLSN = commitLSN, endLSN
	return bt.open && bt.events >= bt.maxEvents
}

// due reports whether the open Kafka transaction should be committed at
// now for its age: only between PostgreSQL transactions.
func (bt *batcher) due(now time.Time) bool {
	return bt.open && !bt.inPG && now.Sub(bt.opened) >= bt.interval
}

// closed starts the next Kafka transaction after a commit or an abort;
// abort also forgets a PostgreSQL transaction in progress (the stream
// sends it again after the rewind).
func (bt *batcher) closed(abort bool) {
	bt.open, bt.events, bt.bytes = false, 0, 0
	bt.commitLSN, bt.endLSN = 0, 0
	if abort {
		bt.inPG, bt.pgEvents, bt.pgBytes = false, 0, 0
	}
}
