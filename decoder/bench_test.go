package decoder_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// benchPayload is a ~300-byte jsonb payload as Postgres renders it.
var benchPayload = `{"order_id": "ord_01HZX4K7Q9V3M2N8P5R6S7T8U9", "customer_id": "cus_7f3a9b2c", ` +
	`"currency": "EUR", "total": 129.95, "items": [{"sku": "SKU-1001", "qty": 2, "price": 39.99}, ` +
	`{"sku": "SKU-2002", "qty": 1, "price": 49.97}], "shipping": {"method": "express", "country": "DE"}, ` +
	`"placed_at": "2026-03-14T15:09:26Z"}`

func benchmarkTxn(b *testing.B, headers tv) { benchmarkTxnRows(b, 1, headers, false) }

// benchmarkTxnRows decodes transactions of rows outbox rows, each with
// benchPayload and headers, and its own id and aggregate id; with identity
// the table has migration 0006's columns and each row its own event_id.
func benchmarkTxnRows(b *testing.B, rows int, headers tv, identity bool) {
	d, err := decoder.New("public.outbox")
	if err != nil {
		b.Fatal(err)
	}
	rel := outboxRelation()
	if identity {
		rel = pt.IdentityRelation()
	}
	if _, err := d.Decode(lsnAt(0), rel); err != nil {
		b.Fatal(err)
	}
	msgs := [][]byte{begin(0x2000, 1)}
	for i := range rows {
		id := strconv.Itoa(1234567 + i)
		aggID := "ord_01HZX4K7Q9V3M2N8P5R6S7T8U9"
		if rows > 1 {
			aggID = "ord_01HZX4K7Q9V3M2N8P5R6S" + id
		}
		cols := row(id, "order", aggID, "OrderPlaced", benchPayload, headers)
		if identity {
			cols = append(cols, text(fmt.Sprintf("0190a1b2-c3d4-7e5f-8a6b-%012d", i)), null)
		}
		msgs = append(msgs, insert(outboxID, cols...))
	}
	msgs = append(msgs, commit(0x2000, 0x2030))
	decodeLoop(b, d, msgs, func(txn *decoder.Txn) {
		if len(txn.Events) != rows {
			b.Fatalf("%d events", len(txn.Events))
		}
	})
}

// decodeLoop decodes msgs, one transaction, once per op, and checks the
// transaction the last message hands out.
func decodeLoop(b *testing.B, d *decoder.Decoder, msgs [][]byte, check func(*decoder.Txn)) {
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		for i, m := range msgs {
			txn, err := d.Decode(lsnAt(i), m)
			if err != nil {
				b.Fatal(err)
			}
			if i == len(msgs)-1 {
				check(txn)
			}
		}
	}
}

// BenchmarkDecodeTxn decodes one transaction (Begin, Insert, Commit) with one
// event: a ~300-byte payload and three headers.
func BenchmarkDecodeTxn(b *testing.B) {
	if len(benchPayload) < 280 || len(benchPayload) > 320 {
		b.Fatalf("payload is %d bytes", len(benchPayload))
	}
	// jsonb's key order: shorter keys first.
	benchmarkTxn(b, text(`{"tenant": "acme", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "content_type": "application/json"}`))
}

// BenchmarkDecodeTxnNoHeaders is the same with a NULL headers column, to show
// what the JSON parsing of headers costs.
func BenchmarkDecodeTxnNoHeaders(b *testing.B) {
	benchmarkTxn(b, null)
}

// BenchmarkDecodeTxn100 decodes one transaction of 100 such events (each
// with its own id and aggregate id), as in a backlog drain of 100-row
// transactions. One op is one transaction.
func BenchmarkDecodeTxn100(b *testing.B) {
	benchmarkTxnRows(b, 100, text(`{"tenant": "acme", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "content_type": "application/json"}`), false)
}

// BenchmarkDecodeTxnEventID is BenchmarkDecodeTxn on a table with the
// identity columns (migration 0006): event_id a UUID, dlq_replay_of NULL.
func BenchmarkDecodeTxnEventID(b *testing.B) {
	benchmarkTxnRows(b, 1, text(`{"tenant": "acme", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "content_type": "application/json"}`), true)
}

// BenchmarkDecodeTxn100EventID is BenchmarkDecodeTxn100 with the identity
// columns.
func BenchmarkDecodeTxn100EventID(b *testing.B) {
	benchmarkTxnRows(b, 100, text(`{"tenant": "acme", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "content_type": "application/json"}`), true)
}

// benchEnvelope is the envelope outbox.WriteMessage writes for an event
// with benchPayload and three headers: encoding/json's compact text.
func benchEnvelope(id, aggID string) string {
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(benchPayload)); err != nil {
		panic(err)
	}
	return `{"id":"` + id + `","aggregate_type":"order","aggregate_id":"` + aggID + `","event_type":"OrderPlaced","payload":` +
		compact.String() + `,"headers":{"content_type":"application/json","tenant":"acme","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}}`
}

// BenchmarkDecodeMessages100 is BenchmarkDecodeTxn100 for the table-less
// outbox: one transaction of 100 logical decoding messages (messages.prefix),
// each the envelope of the same event. One op is one transaction.
func BenchmarkDecodeMessages100(b *testing.B) {
	const events = 100
	d, err := decoder.New("public.outbox")
	if err != nil {
		b.Fatal(err)
	}
	d.SetMessagePrefix(msgPrefix, 1<<20)
	msgs := [][]byte{begin(0x2000, 1)}
	for i := range events {
		id := fmt.Sprintf("0190a1b2-c3d4-7e5f-8a6b-%012d", i)
		msgs = append(msgs, pt.Message(true, lsnAt(i+1), msgPrefix, benchEnvelope(id, "ord_01HZX4K7Q9V3M2N8P5R6S"+strconv.Itoa(1234567+i))))
	}
	msgs = append(msgs, commit(0x2000, 0x2030))
	decodeLoop(b, d, msgs, func(txn *decoder.Txn) {
		if len(txn.Events) != events {
			b.Fatalf("%d events", len(txn.Events))
		}
		if ev := txn.Events[0]; ev.Err != nil || len(ev.Headers) != 3 {
			b.Fatalf("event %+v", ev)
		}
	})
}
