package relay

import (
	"math/bits"
	"strconv"
	"testing"

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

// A transaction's memory (its deliveries, Messages and headers) is reused
// only once every event of it is acked: while one event waits, later
// transactions get memory of their own and the waiting record keeps its
// key and headers; after its ack a later transaction of the same size
// takes the memory.
func TestTransactionMemoryReusedOnlyWhenSettled(t *testing.T) {
	h := newHarness(t, fastPolicy, nil) // every record held until the test answers
	take := func(n int) []*sink.Message {
		t.Helper()
		ms := make([]*sink.Message, n)
		for i := range ms {
			ms[i] = <-h.pub.held
		}
		return ms
	}
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
