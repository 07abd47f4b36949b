package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// ackingPublisher acks every record as it is handed over, on the caller's
// goroutine: the benchmark measures the pipeline, not a producer.
type ackingPublisher struct{ n int }

func (a *ackingPublisher) Publish(_ context.Context, m *sink.Message) error {
	a.n++
	m.Partition = 0
	m.Done(nil)
	return nil
}

// batchAckingPublisher acks records in batches of size, through the
// function the pipeline gave OnAcked, as the direct engine acks a record
// batch.
type batchAckingPublisher struct {
	n, size int
	held    []*sink.Message
	acked   func([]*sink.Message, time.Time)
}

func (a *batchAckingPublisher) OnAcked(f func([]*sink.Message, time.Time)) { a.acked = f }

func (a *batchAckingPublisher) Publish(_ context.Context, m *sink.Message) error {
	a.n++
	m.Partition = 0
	if a.held = append(a.held, m); len(a.held) == a.size {
		a.acked(a.held, time.Now())
		a.held = a.held[:0]
	}
	return nil
}

// benchPayload is a ~300-byte jsonb payload as Postgres renders it (the
// decoder's benchmark's).
const benchPayload = `{"order_id": "ord_01HZX4K7Q9V3M2N8P5R6S7T8U9", "customer_id": "cus_7f3a9b2c", ` +
	`"currency": "EUR", "total": 129.95, "items": [{"sku": "SKU-1001", "qty": 2, "price": 39.99}, ` +
	`{"sku": "SKU-2002", "qty": 1, "price": 49.97}], "shipping": {"method": "express", "country": "DE"}, ` +
	`"placed_at": "2026-03-14T15:09:26Z"}`

// BenchmarkHandleTxn100 is the relay's per-transaction path in a backlog
// drain: Handle decodes a transaction of 100 outbox rows (a ~300-byte
// payload and three headers each), registers it with the tracker and
// publishes its records, which the publisher acks at once. One op is one
// transaction.
func BenchmarkHandleTxn100(b *testing.B) {
	a := &ackingPublisher{}
	benchHandleTxn100(b, a, func() int { return a.n })
}

// BenchmarkHandleTxn100BatchAcks is BenchmarkHandleTxn100 with the records
// acked 100 at a time through OnAcked, as the direct engine does.
func BenchmarkHandleTxn100BatchAcks(b *testing.B) {
	a := &batchAckingPublisher{size: 100}
	benchHandleTxn100(b, a, func() int { return a.n })
}

// BenchmarkHandleTxn100Messages is BenchmarkHandleTxn100 for the table-less
// outbox: each transaction holds 100 logical decoding messages
// (messages.prefix), the envelopes outbox.WriteMessage writes for the same
// events. One op is one transaction.
func BenchmarkHandleTxn100Messages(b *testing.B) {
	a := &ackingPublisher{}
	const prefix = "orders-outbox"
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(benchPayload)); err != nil {
		b.Fatal(err)
	}
	events := make([][]byte, 100)
	for i := range events {
		id := strconv.Itoa(1000000 + i)
		events[i] = pg.Message(true, pglogrepl.LSN(0x100*(i+1)), prefix, `{"id":"0190a1b2-c3d4-7e5f-8a6b-00000`+id+
			`","aggregate_type":"order","aggregate_id":"ord_01HZX4K7Q9V3M2N8P5R6S7T`+id+`","event_type":"OrderPlaced","payload":`+
			compact.String()+`,"headers":{"content_type":"application/json","tenant":"acme","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}}`)
	}
	benchHandleTxn(b, a, func() int { return a.n }, prefix, events)
}

func benchHandleTxn100(b *testing.B, pub publisher, published func() int) {
	inserts := make([][]byte, 100)
	for i := range inserts {
		id := strconv.Itoa(1000000 + i)
		inserts[i] = pg.Insert(pg.OutboxID, pg.Row(id, "order", "ord_01HZX4K7Q9V3M2N8P5R6S7T"+id, "OrderPlaced", benchPayload,
			pg.Text(`{"tenant": "acme", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "content_type": "application/json"}`))...)
	}
	benchHandleTxn(b, pub, published, "", inserts)
}

// benchHandleTxn handles transactions of inserts (the pgoutput messages of
// its events) with messages.prefix msgPrefix.
func benchHandleTxn(b *testing.B, pub publisher, published func() int, msgPrefix string, inserts [][]byte) {
	rows := len(inserts)
	tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
	if err != nil {
		b.Fatal(err)
	}
	cfg := PipelineConfig{Table: "public.outbox", Template: tmpl, MaxTopics: 100,
		Policy: record.Policy{Topic: testDLQ, MaxAttempts: 3, Backoff: time.Millisecond},
		Limits: checkpoint.Limits{MaxEvents: 10000, MaxBytes: 64 << 20}, MessagePrefix: msgPrefix}
	p, err := NewPipeline(cfg, atLeastOnce{pub}, &fakeMarker{marked: make(chan string, 10)}, zerolog.Nop(), nil)
	if err != nil {
		b.Fatal(err)
	}
	wireAcks(p, pub)
	ctx := context.Background()
	if err := p.Handle(ctx, 0x100, pg.OutboxRelation()); err != nil {
		b.Fatal(err)
	}
	// Begin and Commit are rewritten in place with each transaction's LSNs:
	// the tracker takes transactions in increasing end LSN only.
	begin, commit := pg.Begin(0, 7), pg.Commit(0, 0)
	const step = 0x10000
	lsn := pglogrepl.LSN(step)
	b.ReportAllocs()
	for b.Loop() {
		lsn += step
		binary.BigEndian.PutUint64(begin[1:], uint64(lsn))
		binary.BigEndian.PutUint64(commit[2:], uint64(lsn))
		binary.BigEndian.PutUint64(commit[10:], uint64(lsn+8))
		if err := p.Handle(ctx, lsn-step+1, begin); err != nil {
			b.Fatal(err)
		}
		for i, m := range inserts {
			if err := p.Handle(ctx, lsn-step+0x100*pglogrepl.LSN(i+1), m); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.Handle(ctx, lsn, commit); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if want := b.N * rows; published() != want {
		b.Fatalf("%d records published, want %d", published(), want)
	}
	if got := p.Flushed(); got != lsn+8 {
		b.Fatalf("watermark %s, want %s", got, lsn+8)
	}
}
