package relay

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// txnMem is the memory of one transaction's deliveries and of its records'
// headers (the slab). In a drain it was half of what the relay allocated
// per event (about 770 of 1,500 bytes), all of it garbage a few
// milliseconds later: fresh pages to fault in and zero, and collections.
// Instead the last of the transaction's deliveries to settle (acked, or
// its dead letter acked) hands it back to the pool, and the next
// transaction of its size class takes it.
//
// A delivery settles exactly once, as the last thing anything does with
// it (settle: done, deadLettered and the handover of a delivery finished
// before a rewind end with it). Until every delivery of the transaction has
// settled, nothing of txnMem is reused, so a delivery held by a queue
// (retries, row marks), the producer or a halt keeps the whole of it. A
// transaction abandoned by a rewind (parked, unsent) never reaches zero and
// is left to the garbage collector.
type txnMem struct {
	ds   []delivery
	hs   []sink.Header
	buf  []byte
	sl   record.Slab  // over hs and buf, for the transaction's records (slab)
	left atomic.Int32 // deliveries not yet settled
	pool *txnPool
}

// txnPool keeps settled txnMems by size class: class c holds 1<<c
// deliveries. A free list, not a sync.Pool: what it keeps is bounded, and
// it hands back what it was given, which the tests rely on. Per class at
// most keepEvents deliveries (328 bytes each) with up to keepHeaders
// headers (48 bytes) and keepHeaderBytes bytes each: 1.6 MiB, 18 MiB if
// transactions of every size class came and settled in bursts.
// Transactions above the largest class allocate and are not kept.
type txnPool struct {
	mu   sync.Mutex
	free [txnClasses][]*txnMem
}

const (
	// txnClasses bounds the kept transactions at 1<<(txnClasses-1) events
	// (about 320 KiB of deliveries): a larger one is rare, and keeping it
	// would hold that much for the next rare one.
	txnClasses = 11
	// keepEvents bounds the deliveries kept per class: acks settle
	// transactions about as fast as new ones come, so a short list serves
	// (one response settles a few hundred events).
	keepEvents = 1024
	// keepHeaders and keepHeaderBytes bound, per delivery, the header slab
	// a kept txnMem holds on to; a larger one (many or long headers) is
	// let go.
	keepHeaders     = 16
	keepHeaderBytes = 512
)

// get returns a txnMem for n deliveries with its slab sized for nh headers
// and nb bytes; its deliveries are zero, as a fresh allocation's.
func (tp *txnPool) get(n, nh, nb int) *txnMem {
	c := bits.Len(uint(max(n, 1) - 1)) // smallest c with 1<<c >= n
	var m *txnMem
	switch {
	case n == 0:
		m = &txnMem{} // nothing will settle: not kept
	case c < txnClasses:
		tp.mu.Lock()
		if f := tp.free[c]; len(f) > 0 {
			m = f[len(f)-1]
			f[len(f)-1] = nil
			tp.free[c] = f[:len(f)-1]
		}
		tp.mu.Unlock()
		if m == nil {
			m = &txnMem{ds: make([]delivery, 0, 1<<c), pool: tp}
		}
	default:
		m = &txnMem{ds: make([]delivery, 0, n)} // not kept: no pool
	}
	m.ds = m.ds[:n]
	if cap(m.hs) < nh {
		m.hs = make([]sink.Header, nh)
	}
	if cap(m.buf) < nb {
		m.buf = make([]byte, nb)
	}
	m.hs, m.buf = m.hs[:nh], m.buf[:nb]
	m.left.Store(int32(n))
	return m
}

// put keeps m for a later transaction of its class, unless the class has
// enough. m is cleared: what its records referred to (payloads, topics,
// dead letters) is not kept alive by the pool.
func (tp *txnPool) put(m *txnMem) {
	clear(m.ds)
	clear(m.hs)
	m.sl = record.Slab{}
	c := bits.Len(uint(cap(m.ds) - 1))
	if cap(m.buf) > keepHeaderBytes<<c {
		m.buf = nil
	}
	if cap(m.hs) > keepHeaders<<c {
		m.hs = nil
	}
	tp.mu.Lock()
	if len(tp.free[c])<<c < keepEvents {
		tp.free[c] = append(tp.free[c], m)
	}
	tp.mu.Unlock()
}

// slab is the headers slab over m's memory (no allocation of its own).
func (m *txnMem) slab() *record.Slab {
	m.sl = record.NewSlab(m.hs, m.buf)
	return &m.sl
}

// settle acks d to the tracker (its event is in Kafka: acked, or its dead
// letter acked) and ends its use of its transaction's memory: the last
// delivery to settle returns the memory to the pool. Every path that acks a
// delivery goes through here, exactly once, and nothing may touch d after.
func (d *delivery) settle() { settleRun(d.pend, d.mem, 1, d.size) }

// settleRun settles n deliveries of one transaction (pend, mem) carrying
// bytes payload bytes: the tracker's acks first, then the memory, which the
// last of the transaction's deliveries hands back. Pipeline.acked settles
// the consecutive deliveries of an acked batch with one call.
func settleRun(pend *checkpoint.Pending, mem *txnMem, n int, bytes int64) {
	pend.AckN(n, bytes)
	if mem != nil && mem.left.Add(-int32(n)) == 0 && mem.pool != nil {
		mem.pool.put(mem)
	}
}
