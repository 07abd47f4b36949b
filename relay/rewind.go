package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// A rewind keeps per-aggregate order after an error the producer returns
// instead of retrying (an idempotence error, a rejection that heals, any
// error with kafka.retry_max exhausted). Resending just the failed event
// would put it after later events of its partition. Instead the pipeline
// stops handing events over, waits until every event in flight has either
// been acked or has failed, drops what is in flight from the tracker and
// has the stream restart from the ack watermark: the failed event and
// everything after it are published again, in commit order. Events that
// were already inside the producer when the error came back may have been
// written before the failed one; orderWatch counts each such reorder.
type rewind struct {
	active atomic.Bool // the session is ending for a rewind; Handle publishes nothing more

	mu        sync.Mutex
	parked    int                   // events in the tracker that will not be acked this session
	notBefore time.Time             // the failed events' backoff: the restart waits for it
	attempts  map[pglogrepl.LSN]int // failed attempts by event position, kept across rewinds
	failing   atomic.Int32          // len(attempts), read without the lock on every ack
	// dead holds the events above the watermark whose dead letter is acked
	// and row marked: resent after a rewind, they are not dead-lettered twice.
	dead    map[pglogrepl.LSN]struct{}
	anyDead atomic.Int32 // len(dead), read without the lock for every event
	// later holds, under delivery: exactly_once, the events whose dead
	// letter is due (on_poison applied, or the dead letter's own Kafka
	// transaction aborted): resent after the rewind, each becomes its dead
	// letter inside the Kafka transaction of its PostgreSQL transaction.
	later    map[pglogrepl.LSN]deadLetterDue
	anyLater atomic.Int32
}

type deadLetterDue struct {
	reason string
	cause  error
	cut    int // steps the dead letter was cut down after its topic refused it for its size
}

// deadLater records that the event at lsn (its position) is to be
// dead-lettered when resent, its dead letter cut by cut steps
// (deadletter.Letter.CutTo).
func (r *rewind) deadLater(lsn pglogrepl.LSN, reason string, cause error, cut int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.later == nil {
		r.later = map[pglogrepl.LSN]deadLetterDue{}
	}
	r.later[lsn] = deadLetterDue{reason, cause, cut}
	r.anyLater.Store(int32(len(r.later)))
}

// deadNext returns the due dead letter of the event at lsn, if any.
func (r *rewind) deadNext(lsn pglogrepl.LSN) (due deadLetterDue, ok bool) {
	if r.anyLater.Load() == 0 {
		return deadLetterDue{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.later[lsn]
	return d, ok
}

// maxDead bounds the finished dead letters remembered per term.
const maxDead = 1 << 20

// markDead records a finished dead letter.
func (r *rewind) markDead(lsn pglogrepl.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead == nil {
		r.dead = map[pglogrepl.LSN]struct{}{}
	}
	// Not pruned by the in-memory watermark: a session may restart below
	// it, at the slot's confirmed position. One entry per dead letter of
	// this term; a term that somehow collects maxDead starts over (at worst
	// a duplicate dead letter, never a lost event).
	if len(r.dead) >= maxDead {
		clear(r.dead)
	}
	r.dead[lsn] = struct{}{}
	r.anyDead.Store(int32(len(r.dead)))
	delete(r.later, lsn)
	r.anyLater.Store(int32(len(r.later)))
}

// deadLettered reports whether the event at lsn already has its finished
// dead letter. Called for every event: one atomic load when there is none.
func (r *rewind) deadLettered(lsn pglogrepl.LSN) bool {
	if r.anyDead.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.dead[lsn]
	return ok
}

// park records a failed event that the next session publishes again after
// delay. It reports whether this starts the rewind.
func (r *rewind) park(lsn pglogrepl.LSN, attempts int, delay time.Duration) (first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempts == nil {
		r.attempts = map[pglogrepl.LSN]int{}
	}
	r.attempts[lsn] = attempts
	r.failing.Store(int32(len(r.attempts)))
	r.parked++
	if due := time.Now().Add(delay); due.After(r.notBefore) {
		r.notBefore = due
	}
	return !r.active.Swap(true)
}

// parkUnsent records events of a registered transaction that Handle did
// not hand over because a rewind began.
func (r *rewind) parkUnsent(n int) {
	r.mu.Lock()
	r.parked += n
	r.mu.Unlock()
}

// attemptsOf returns the failed attempts of the event at lsn in earlier
// sessions (0 for an event that never failed).
func (r *rewind) attemptsOf(lsn pglogrepl.LSN) int {
	if r.failing.Load() == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[lsn]
}

// settled forgets the event at lsn: it was acked or dead-lettered.
func (r *rewind) settled(lsn pglogrepl.LSN) {
	if r.failing.Load() == 0 {
		return
	}
	r.mu.Lock()
	delete(r.attempts, lsn)
	r.failing.Store(int32(len(r.attempts)))
	r.mu.Unlock()
}

// wait blocks until every event in flight except the parked ones has
// settled (inFlight reports the tracker's count) and the backoff passed,
// or ctx ends. The caller then drops what is in flight and restarts.
func (r *rewind) wait(ctx context.Context, inFlight func() int) error {
	tick := time.NewTicker(10 * time.Millisecond) // a rare path: polling is simpler than a signal per ack
	defer tick.Stop()
	for {
		r.mu.Lock()
		ready := inFlight() <= r.parked && !time.Now().Before(r.notBefore)
		r.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// reset ends the rewind once the tracker dropped what was in flight.
func (r *rewind) reset() {
	r.mu.Lock()
	r.parked, r.notBefore = 0, time.Time{}
	r.mu.Unlock()
	r.active.Store(false)
}

// orderWatch detects reorders: an event of a partition written after a
// later event of the same partition. Per partition it keeps the highest
// event position acked this session and the positions of events that
// failed; a failure below an ack, or an ack above a failure, is a reorder,
// counted once per failed event.
type orderWatch struct {
	mu       sync.RWMutex
	acked    map[partitionKey]*atomic.Uint64
	failed   map[partitionKey][]failedAt
	anyFail  atomic.Bool
	reorders atomic.Uint64
}

type partitionKey struct {
	topic     string
	partition int32
}

type failedAt struct {
	lsn     pglogrepl.LSN
	counted bool
}

// ack records an acked event. It runs on the producer's ack goroutine for
// every event: one read-locked map lookup and an atomic max.
func (o *orderWatch) ack(topic string, partition int32, lsn pglogrepl.LSN) {
	if partition < 0 {
		return
	}
	k := partitionKey{topic, partition}
	o.mu.RLock()
	a := o.acked[k]
	o.mu.RUnlock()
	if a == nil {
		o.mu.Lock()
		if o.acked == nil {
			o.acked = map[partitionKey]*atomic.Uint64{}
		}
		if a = o.acked[k]; a == nil {
			a = new(atomic.Uint64)
			o.acked[k] = a
		}
		o.mu.Unlock()
	}
	for cur := a.Load(); uint64(lsn) > cur && !a.CompareAndSwap(cur, uint64(lsn)); cur = a.Load() {
	}
	if !o.anyFail.Load() {
		return
	}
	o.mu.Lock()
	for i := range o.failed[k] {
		if f := &o.failed[k][i]; !f.counted && f.lsn < lsn {
			f.counted = true
			o.reorders.Add(1)
		}
	}
	o.mu.Unlock()
}

// fail records a failed event of a known partition.
func (o *orderWatch) fail(topic string, partition int32, lsn pglogrepl.LSN) {
	if partition < 0 {
		return
	}
	k := partitionKey{topic, partition}
	o.mu.Lock()
	defer o.mu.Unlock()
	f := failedAt{lsn: lsn}
	if a := o.acked[k]; a != nil && a.Load() > uint64(lsn) {
		f.counted = true
		o.reorders.Add(1)
	}
	if o.failed == nil {
		o.failed = map[partitionKey][]failedAt{}
	}
	o.failed[k] = append(o.failed[k], f)
	o.anyFail.Store(true)
}

// reset starts a new session: what was acked or failed is resent anyway.
func (o *orderWatch) reset() {
	o.mu.Lock()
	clear(o.acked)
	clear(o.failed)
	o.anyFail.Store(false)
	o.mu.Unlock()
}
