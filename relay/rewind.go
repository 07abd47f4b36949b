package relay

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/sink"
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

// resendLog decides which events a rewind publishes again, under delivery:
// at_least_once. The session that ends in a rewind settled every event it
// handed over (acked, dead-lettered or failed; rewind.wait); the next one
// starts from the watermark, below the failed event. An event that was
// acked, and that nothing before it in commit order on its partition
// failed, is in Kafka after everything before it on that partition: the
// consumer already has it in order, so the next session settles it
// without publishing it (a duplicate saved). Everything else is published
// again: a failed event, one never handed over, and every event after a
// failure on its partition, so a consumer sees the late event and then the
// later ones again. The same holds for a key: a partition count change
// between two events of one aggregate puts them on different partitions,
// so an event after a failure with its key (on any partition) is published
// again too, and a failure whose partition is unknown (refused before a
// partition was chosen) counts for every partition of its topic.
//
// The rule must stay closed downwards: an event is skipped only if nothing
// before it in its class (partition or key) is published again, or the
// consumer would see the skipped event before a copy of an earlier one.
// rewound enforces it with one sweep in commit order over the session's
// acks and failures and the events skipped in this session on the strength
// of an earlier one. Whatever the log cannot vouch for (entries dropped at
// the cap, a position holding another event) makes the next session
// publish everything again: republishing is always safe, skipping an event
// not acked never is.
//
// Exactly-once has its own way back (its delivery skips the Kafka
// transactions committed; an aborted one was never visible to
// read_committed consumers): on is false there and nothing here runs.
type resendLog struct {
	on      bool                 // delivery: at_least_once; fixed at NewPipeline
	seed    maphash.Seed         // for key hashes
	flushed func() pglogrepl.LSN // the tracker's watermark, for pruning
	limit   int                  // most entries a session keeps; more: lost

	mu sync.Mutex
	// gen is the session: a delivery carries the gen it was handed over
	// in, and an ack or failure of another session is not logged. Written
	// under mu on the loop goroutine, which also reads it without mu.
	gen     uint32
	cur     []resent // this session's acks and failures, in arrival order
	pruneAt int      // len(cur) at which entries the watermark passed are dropped
	lost    bool     // cur overflowed or the log proved wrong: no skips after this session
	// skip holds the events the current session settles without
	// publishing, by position; each came from an ack of an earlier
	// session and stays until the watermark passes it.
	skip    map[pglogrepl.LSN]resent
	anySkip atomic.Int32 // len(skip), read without the lock for every event

	// reset: Pipeline.Reset moved the watermark to the slot's position
	// since the last session started (resumed). Loop goroutine only.
	reset bool
	// Loop goroutine only: the furthest event (commit order) handed to the
	// producer since the log was last forgotten: a later session's handover
	// at or before it is a republish.
	high    resent
	hasHigh bool

	republished atomic.Uint64 // outbox_relay_republished_events_total
	skipped     atomic.Uint64 // outbox_relay_rewind_skipped_events_total
}

// resent is what the log keeps of one event's verdict in a session.
type resent struct {
	commit, pos pglogrepl.LSN // commit order: (commit, pos); pos is the identity
	key         uint64        // hash of the record key
	topic       string
	partition   int32 // -1: refused before a partition was chosen
	failed      bool
}

// before orders by commit order: the order events are handed over in.
func (e *resent) before(o *resent) bool {
	return e.commit < o.commit || e.commit == o.commit && e.pos < o.pos
}

// resendLimit bounds the entries one session keeps (acked above the
// watermark, or failed): 16 times inflight.max_events, within [1<<16, 1<<20]
// (48 bytes each: 3 to 48 MiB). A session that acks more above its
// watermark (an event stuck at the bottom while the rest flows) loses the
// skips of its rewind, not an event.
func resendLimit(limits checkpoint.Limits) int {
	if limits.MaxEvents <= 0 {
		return 1 << 20
	}
	return min(max(16*limits.MaxEvents, 1<<16), 1<<20)
}

// acked logs the acks of msgs; the producer's goroutines, under Acked,
// before the deliveries settle (their Key is read).
func (l *resendLog) acked(msgs []*sink.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost {
		return
	}
	for _, m := range msgs {
		d, ok := m.Ref.(*delivery)
		if !ok || d.letter != nil || d.gen != l.gen {
			continue
		}
		l.cur = append(l.cur, resent{commit: d.txnLSN, pos: d.pos, key: maphash.Bytes(l.seed, m.Key),
			topic: m.Topic, partition: m.Partition})
	}
	l.pruneLocked()
}

// failed logs d's failure, which starts or joins a rewind; the producer's
// goroutines.
func (l *resendLog) failed(d *delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost || d.gen != l.gen {
		return
	}
	l.cur = append(l.cur, resent{commit: d.txnLSN, pos: d.pos, key: maphash.Bytes(l.seed, d.msg.Key),
		topic: d.msg.Topic, partition: d.msg.Partition, failed: true})
	l.pruneLocked()
}

// pruneLocked drops, once cur doubled since the last time, the entries of
// transactions the watermark passed: they never come again in a rewind
// (handleTxn drops a transaction that commits below the watermark). Past
// the limit the session's log is lost. Caller holds mu.
func (l *resendLog) pruneLocked() {
	if len(l.cur) < l.pruneAt {
		return
	}
	w, n := l.flushed(), 0
	for _, e := range l.cur {
		if e.commit >= w {
			l.cur[n] = e
			n++
		}
	}
	clear(l.cur[n:])
	l.cur = l.cur[:n]
	if n >= l.limit {
		l.cur, l.lost = nil, true
	}
	l.pruneAt = max(2*n, 1024)
}

// skips reports whether the event at pos, of the transaction committed at
// commit, routed to topic with the record key key, is settled without
// publishing: it was acked in an earlier session of the term and nothing
// before it in its class comes again. A position that holds another event
// than the one logged (another commit, topic or key) makes the log
// worthless: it is dropped. Loop goroutine; one atomic load when nothing
// is to be skipped.
func (l *resendLog) skips(pos, commit pglogrepl.LSN, topic string, key []byte) bool {
	if l.anySkip.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.skip[pos]
	if !ok {
		return false
	}
	if e.commit != commit || e.topic != topic || e.key != maphash.Bytes(l.seed, key) {
		l.dropLocked()
		l.lost = true
		return false
	}
	return true
}

// handed records that the event at (commit, pos) goes to the producer and
// reports whether it went before, in an earlier session since the log was
// last forgotten: every session hands over a run in commit order from its
// watermark, and the watermark does not go down between those sessions, so
// an event at or before the furthest one handed over went then. Loop
// goroutine.
func (l *resendLog) handed(commit, pos pglogrepl.LSN) (again bool) {
	e := resent{commit: commit, pos: pos}
	if l.hasHigh && !l.high.before(&e) {
		return true
	}
	l.high, l.hasHigh = e, true
	return false
}

// rewound is called once every event of the session ending in a rewind has
// settled, before the next session: it decides what that one skips, and
// starts a new generation. Loop goroutine.
func (l *resendLog) rewound() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	if !l.on {
		return
	}
	w := l.flushed()
	all := l.cur[:0]
	if !l.lost {
		for _, e := range l.cur {
			if e.commit >= w {
				all = append(all, e)
			}
		}
		for _, e := range l.skip { // skipped this session, or not reached: still clean so far
			if e.commit >= w {
				all = append(all, e)
			}
		}
	}
	slices.SortFunc(all, func(a, b resent) int {
		if a.before(&b) {
			return -1
		}
		if b.before(&a) {
			return 1
		}
		return 0
	})
	skip := make(map[pglogrepl.LSN]resent)
	dirtyPart := map[partitionKey]bool{}
	dirtyTopic := map[string]bool{}
	dirtyKey := map[uint64]bool{}
	for _, e := range all {
		part := partitionKey{e.topic, e.partition}
		if !e.failed && e.partition >= 0 && !dirtyPart[part] && !dirtyTopic[e.topic] && !dirtyKey[e.key] {
			skip[e.pos] = e
			continue
		}
		// Published again: so is everything after it in its class.
		if e.partition < 0 {
			dirtyTopic[e.topic] = true
		} else {
			dirtyPart[part] = true
		}
		dirtyKey[e.key] = true
	}
	if len(skip) > l.limit {
		// Sessions that kept failing below events acked further and
		// further on: the skips stay bounded, the events go again.
		clear(skip)
	}
	l.skip = skip
	l.anySkip.Store(int32(len(skip)))
	clear(l.cur)
	l.cur, l.lost, l.pruneAt = l.cur[:0], false, 0
}

// resumed is told, as a session starts, whether the pipeline's own kept
// position (the last transaction the watermark passed) is on the session's
// history (history.Decide: apply or behind). After a Reset to the slot's
// position the skips hold only then: the session resumes past that
// transaction once the stream shows it again (or restarts, and Drain
// forgets the log), and the positions after it are the same events.
// Otherwise (a failover, a restore, a slot created again) they may be
// other events: the log is forgotten. Loop goroutine.
func (l *resendLog) resumed(onHistory bool) {
	if l.reset && !onHistory {
		l.forget()
	}
	l.reset = false
}

// forget drops the log: the next session is not a rewind's (a reconnect,
// a history that may differ), so nothing is skipped and nothing counts as
// republished. Loop goroutine.
func (l *resendLog) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.dropLocked()
	clear(l.cur)
	l.cur, l.lost, l.pruneAt = l.cur[:0], false, 0
	l.high, l.hasHigh = resent{}, false
}

// dropLocked empties skip. Caller holds mu.
func (l *resendLog) dropLocked() {
	l.skip = nil
	l.anySkip.Store(0)
}
