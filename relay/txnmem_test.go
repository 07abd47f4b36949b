package relay

import (
	"math/bits"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

// eventID is the event_id header of m.
func eventID(m *sink.Message) string {
	for _, h := range m.Headers {
		if string(h.Key) == "event_id" {
			return string(h.Value)
		}
	}
	return ""
}

// heldN takes the next n records the publisher holds.
func (h *harness) heldN(n int) []*sink.Message {
	h.t.Helper()
	ms := make([]*sink.Message, n)
	for i := range ms {
		ms[i] = h.held()
	}
	return ms
}

// A transaction's memory (its deliveries, Messages and headers) is reused
// only once every event of it is acked: while one event waits, later
// transactions get memory of their own and the waiting record keeps its
// key and headers; after its ack a later transaction of the same size
// takes the memory.
func TestTransactionMemoryReusedOnlyWhenSettled(t *testing.T) {
	h := newHarness(t, fastPolicy, nil) // every record held until the test answers
	take := h.heldN
	lsn := pglogrepl.LSN(0x100)
	txn := func(ids ...int) []*sink.Message {
		t.Helper()
		rows := make([][]pg.Col, len(ids))
		for i, id := range ids {
			rows[i] = order(strconv.Itoa(id), "agg-"+strconv.Itoa(id))
		}
		lsn += 0x100
		if err := h.txn(lsn, lsn+0x10, rows...); err != nil {
			t.Fatal(err)
		}
		return take(len(ids))
	}
	first := txn(1, 2, 3)
	first[0].Done(nil)
	first[1].Done(nil)
	waiting := first[2]
	of := map[*sink.Message]bool{first[0]: true, first[1]: true, first[2]: true}
	for n := 10; n < 200; n += 3 {
		for _, m := range txn(n, n+1, n+2) {
			if of[m] {
				t.Fatalf("event %s got the memory of a transaction with an event not acked", eventID(m))
			}
			m.Done(nil)
		}
		if id, key := eventID(waiting), string(waiting.Key); id != "3" || key != "agg-3" {
			t.Fatalf("the unacked record of the first transaction now has event_id %q key %q, want 3 and agg-3", id, key)
		}
	}
	waiting.Done(nil)
	// The free list hands out the memory put last first; two transactions
	// are held at a time, so the second takes what the first does not.
	for n := 1000; n < 1300; n += 6 {
		round := append(txn(n, n+1, n+2), txn(n+3, n+4, n+5)...)
		for i, m := range round {
			if of[m] {
				if id, want := eventID(m), strconv.Itoa(n+i); id != want {
					t.Fatalf("reused record has event_id %q, want %s", id, want)
				}
				return
			}
		}
		for _, m := range round {
			m.Done(nil)
		}
	}
	t.Error("the first transaction's memory was never reused after its last ack")
}

// The free list keeps at most keepEvents deliveries per size class, and no
// header slab larger than its per-delivery bound.
func TestTransactionMemoryKeptIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name            string
		events, nh, nb  int
		wantKept        int
		wantHs, wantBuf bool // the slab is kept with the txnMem
	}{
		{"one-event transactions", 1, 6, 100, keepEvents, true, true},
		{"100-event transactions", 100, 600, 10000, keepEvents / 128, true, true},
		{"huge header bytes are let go", 1, 6, keepHeaderBytes + 1, keepEvents, true, false},
		{"many headers are let go", 2, 2*keepHeaders + 1, 100, keepEvents / 2, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tp txnPool
			var ms []*txnMem
			for range 2*keepEvents/tc.events + 10 {
				ms = append(ms, tp.get(tc.events, tc.nh, tc.nb))
			}
			for _, m := range ms {
				tp.put(m)
			}
			c := bits.Len(uint(tc.events - 1))
			if got := len(tp.free[c]); got != tc.wantKept {
				t.Fatalf("kept %d, want %d", got, tc.wantKept)
			}
			for _, m := range tp.free[c] {
				if (m.hs != nil) != tc.wantHs || (m.buf != nil) != tc.wantBuf {
					t.Fatalf("kept a slab of %d headers and %d bytes", cap(m.hs), cap(m.buf))
				}
			}
		})
	}
}

// The acks of a record batch handed over whole (the direct engine's
// OnAcked) settle as each record's Done(nil) would: a batch that mixes
// transactions and leaves one event of each unacked moves nothing and
// frees no memory; the batch with the rest moves the watermark past both,
// records the batch's last position for the order watch, and frees both
// transactions' memory. A record that is no plain delivery (a dead letter,
// the exactly-once checkpoint) goes through its Done.
func TestBatchAcksSettleAsDone(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	take := h.heldN
	if h.pub.acked == nil {
		t.Fatal("NewPipeline did not register with OnAcked")
	}
	start := h.p.tracker.Flushed()
	rows := func(ids ...int) [][]pg.Col {
		var r [][]pg.Col
		for _, id := range ids {
			r = append(r, order(strconv.Itoa(id), "agg-"+strconv.Itoa(id)))
		}
		return r
	}
	if err := h.txn(0x200, 0x210, rows(1, 2, 3)...); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(0x300, 0x310, rows(4, 5)...); err != nil {
		t.Fatal(err)
	}
	ms := take(5)
	of := map[*sink.Message]bool{}
	for _, m := range ms {
		of[m] = true
	}
	foreign := 0
	other := &sink.Message{Topic: "elsewhere", Done: func(err error) {
		if err == nil {
			foreign++
		}
	}}
	h.pub.acked([]*sink.Message{ms[0], other, ms[1], ms[3]}, time.Now())
	if foreign != 1 {
		t.Fatalf("a record that is no delivery was acked %d times, want once through its Done", foreign)
	}
	if got := h.p.tracker.Flushed(); got != start {
		t.Fatalf("watermark %s after a batch that left an event of each transaction unacked, want %s", got, start)
	}
	if ev, _ := h.p.tracker.InFlight(); ev != 2 {
		t.Fatalf("%d events in flight, want 2", ev)
	}
	if err := h.txn(0x400, 0x410, rows(6)...); err != nil { // another size class
		t.Fatal(err)
	}
	later := take(1)
	for _, m := range later {
		if of[m] {
			t.Fatalf("event %s got the memory of a transaction with an event not acked", eventID(m))
		}
	}
	if id, key := eventID(ms[2]), string(ms[2].Key); id != "3" || key != "agg-3" {
		t.Fatalf("the unacked record now has event_id %q key %q, want 3 and agg-3", id, key)
	}
	k, lastPos := partitionKey{ms[4].Topic, ms[4].Partition}, ms[4].Ref.(*delivery).pos // cleared once its memory is free
	h.pub.acked([]*sink.Message{ms[2], ms[4]}, time.Now())
	if got, want := h.p.tracker.Flushed(), pglogrepl.LSN(0x310); got != want {
		t.Fatalf("watermark %s after every event of the first two transactions was acked, want %s", got, want)
	}
	h.p.order.mu.RLock()
	high := h.p.order.acked[k]
	h.p.order.mu.RUnlock()
	if high == nil || pglogrepl.LSN(high.Load()) != lastPos {
		t.Fatalf("order watch has no acked position %s for %v", lastPos, k)
	}
	for _, m := range later {
		m.Done(nil)
	}
	if got, want := h.p.tracker.Flushed(), pglogrepl.LSN(0x410); got != want {
		t.Fatalf("watermark %s, want %s", got, want)
	}
	// Both settled transactions' memory is free again: the next two
	// transactions of their size classes take it.
	if err := h.txn(0x500, 0x510, rows(9, 10, 11)...); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(0x600, 0x610, rows(12, 13)...); err != nil {
		t.Fatal(err)
	}
	reused := 0
	for _, m := range take(5) {
		if of[m] {
			reused++
		}
	}
	if reused != 5 {
		t.Fatalf("%d of 5 records reuse the memory of the transactions acked in batches, want 5", reused)
	}
}
