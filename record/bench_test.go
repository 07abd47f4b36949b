package record

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// benchEvents are n events as the decoder hands out a drained transaction:
// a ~100-byte payload, three headers, ids of their own.
func benchEvents(n int) []decoder.Event {
	evs := make([]decoder.Event, n)
	for i := range evs {
		id := strconv.Itoa(1234567 + i)
		evs[i] = decoder.Event{ID: int64(1234567 + i), AggregateType: "order", AggregateID: "ord_01HZX4K7Q9V3M2N8P5R6S" + id,
			EventType: "OrderPlaced", Payload: []byte(`{"order_id": "ord_` + id + `", "currency": "EUR", "total": 129.95, "placed_at": "2026-03-14T15:09:26Z"}`),
			Headers: []decoder.Header{{Key: "tenant", Value: []byte("acme")}, {Key: "trace_id", Value: []byte("4bf92f3577b34da6a3ce929d0e0e4736")},
				{Key: "content_type", Value: []byte("application/json")}},
			LSN: pglogrepl.LSN(0x1000 + 0x40*i)}
	}
	return evs
}

// benchmarkTxnRecords builds the records of a transaction of evs from one
// slab, as the pipeline does. One op is one transaction.
func benchmarkTxnRecords(b *testing.B, evs []decoder.Event) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	const commit = "0/16B3F48"
	ms := make([]sink.Message, len(evs))
	b.ReportAllocs()
	for b.Loop() {
		sl := newSlab(evs, commit)
		for i := range evs {
			To(&ms[i], sl, &evs[i], commit, at)
		}
	}
}

// benchEventIDs are benchEvents with an event_id each (migration 0006).
func benchEventIDs(n int) []decoder.Event {
	evs := benchEvents(n)
	for i := range evs {
		evs[i].EventID = fmt.Sprintf("0190a1b2-c3d4-7e5f-8a6b-%012d", i)
	}
	return evs
}

// BenchmarkRecordTxn builds the record of a one-event transaction.
func BenchmarkRecordTxn(b *testing.B) { benchmarkTxnRecords(b, benchEvents(1)) }

// BenchmarkRecordTxn100 builds the records of a 100-event transaction.
func BenchmarkRecordTxn100(b *testing.B) { benchmarkTxnRecords(b, benchEvents(100)) }

// BenchmarkRecordTxnEventID and BenchmarkRecordTxn100EventID are the same
// with event_ids.
func BenchmarkRecordTxnEventID(b *testing.B)    { benchmarkTxnRecords(b, benchEventIDs(1)) }
func BenchmarkRecordTxn100EventID(b *testing.B) { benchmarkTxnRecords(b, benchEventIDs(100)) }
