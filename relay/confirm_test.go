package relay

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

// holdingPublisher keeps every record unacked until the test acks it.
type holdingPublisher struct {
	mu   sync.Mutex
	held []*sink.Message
}

func (h *holdingPublisher) Publish(_ context.Context, m *sink.Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	m.Partition = 0
	h.held = append(h.held, m)
	return nil
}

// ackAll acks every record held so far, in publish order.
func (h *holdingPublisher) ackAll() {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, m := range held {
		m.Done(nil)
	}
}

// minUnacked is the lowest commit LSN (pg_lsn) of a record not acked yet.
func (h *holdingPublisher) minUnacked(t *testing.T) (pglogrepl.LSN, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var low pglogrepl.LSN
	for _, m := range h.held {
		for _, hd := range m.Headers {
			if string(hd.Key) != "pg_lsn" {
				continue
			}
			l, err := pglogrepl.ParseLSN(string(hd.Value))
			if err != nil {
				t.Fatalf("pg_lsn %q: %v", hd.Value, err)
			}
			if low == 0 || l < low {
				low = l
			}
		}
	}
	return low, low != 0
}

// The interleavings of WAL messages, idle keepalives (AdvanceIdle with the
// keepalive's WAL end: the walsender's sentPtr, the end of the last record
// it decoded), heartbeats (Mark at the message record's end) and acks that
// could move the watermark past an event Kafka has not acked. After every
// step the watermark must stay at or below the commit LSN of every record
// not acked (the server resends a transaction iff its commit LSN >= the
// confirmed position) and, inside a pgoutput v1 transaction, at or below
// its final LSN from Begin; and it must be exactly what the step says.
func TestWatermarkInterleavings(t *testing.T) {
	const prefix = "outbox-relay/s"
	type step struct {
		wal       []byte        // handed to Handle at lsn, unless nil
		lsn       pglogrepl.LSN // the XLogData's WAL start
		keepalive pglogrepl.LSN // an idle keepalive's WAL end, unless 0
		ack       bool          // ack everything published so far
		openFinal pglogrepl.LSN // a v1 transaction is open with this final LSN
		want      pglogrepl.LSN // the watermark after the step
	}
	ins := func(id string) []byte { return pg.Insert(pg.OutboxID, order(id, "a")...) }
	sins := func(xid uint32, id string) []byte { return pg.Streamed(xid, ins(id)) }
	hb := func(at pglogrepl.LSN) []byte { return pg.Message(false, at, prefix, "1") }
	const start = 0x50
	tests := []struct {
		name  string
		steps []step
	}{
		{"a v1 transaction in chunks: keepalives while it is open, its first chunk acked", []step{
			{wal: pg.OutboxRelation(), lsn: 0x60, want: start},
			{wal: pg.Begin(0x500, 7), lsn: 0x100, openFinal: 0x500, want: start},
			{wal: ins("1"), lsn: 0x110, openFinal: 0x500, want: start},
			{wal: ins("2"), lsn: 0x120, openFinal: 0x500, want: start}, // chunk of 2: published, end 0
			{ack: true, openFinal: 0x500, want: start},                 // the chunk is acked, nothing is in flight
			{keepalive: 0x130, openFinal: 0x500, want: start},          // sentPtr inside the transaction
			{keepalive: 0x600, openFinal: 0x500, want: start},
			{wal: ins("3"), lsn: 0x130, openFinal: 0x500, want: start},
			{wal: pg.Commit(0x500, 0x510), lsn: 0x510, want: start}, // the last chunk, unacked
			{keepalive: 0x600, want: start},
			{wal: hb(0x620), lsn: 0x620, want: start},
			{ack: true, want: 0x620},
			{keepalive: 0x700, want: 0x700},
		}},
		{"a streamed transaction: keepalive and heartbeat between its blocks, then its commit unacked", []step{
			{wal: pg.StreamStart(100, true), lsn: 0x100, want: start},
			{wal: pg.Streamed(100, pg.OutboxRelation()), lsn: 0x100, want: start},
			{wal: sins(100, "1"), lsn: 0x110, want: start},
			{wal: sins(100, "2"), lsn: 0x120, want: start},
			{wal: sins(100, "3"), lsn: 0x130, want: start},
			{wal: pg.StreamStop(), lsn: 0x130, want: start},
			// Between blocks: the server streams the open transaction again
			// from its start to a new session, since it commits later.
			{keepalive: 0x300, want: 0x300},
			{wal: hb(0x320), lsn: 0x320, want: 0x320},
			{wal: pg.StreamCommit(100, 0x400, 0x410), lsn: 0x400, want: 0x320}, // two chunks, unacked
			{keepalive: 0x500, want: 0x320},
			{wal: hb(0x520), lsn: 0x520, want: 0x320},
			{ack: true, want: 0x520},
		}},
		{"two streamed transactions, the later one commits first", []step{
			{wal: pg.StreamStart(100, true), lsn: 0x100, want: start},
			{wal: pg.Streamed(100, pg.OutboxRelation()), lsn: 0x100, want: start},
			{wal: sins(100, "1"), lsn: 0x110, want: start},
			{wal: pg.StreamStop(), lsn: 0x110, want: start},
			{wal: pg.StreamStart(200, true), lsn: 0x200, want: start},
			{wal: sins(200, "2"), lsn: 0x210, want: start},
			{wal: pg.StreamStop(), lsn: 0x210, want: start},
			{wal: pg.StreamCommit(200, 0x400, 0x410), lsn: 0x400, want: start},
			{keepalive: 0x450, want: start},
			{ack: true, want: 0x410},
			{keepalive: 0x450, want: 0x450},
			{wal: pg.StreamStart(100, false), lsn: 0x500, want: 0x450},
			{wal: sins(100, "3"), lsn: 0x510, want: 0x450},
			{wal: pg.StreamStop(), lsn: 0x510, want: 0x450},
			{wal: pg.StreamCommit(100, 0x600, 0x610), lsn: 0x600, want: 0x450}, // above the watermark: published
			{keepalive: 0x700, want: 0x450},
			{ack: true, want: 0x610},
		}},
		{"a heartbeat and keepalives after an unacked v1 transaction", []step{
			{wal: pg.OutboxRelation(), lsn: 0x60, want: start},
			{wal: pg.Begin(0x100, 7), lsn: 0x90, openFinal: 0x100, want: start},
			{wal: ins("1"), lsn: 0x95, openFinal: 0x100, want: start},
			{wal: pg.Commit(0x100, 0x110), lsn: 0x110, want: start},
			{wal: hb(0x150), lsn: 0x150, want: start},
			{keepalive: 0x200, want: start},
			{wal: pg.Begin(0x300, 8), lsn: 0x250, openFinal: 0x300, want: start},
			{wal: ins("2"), lsn: 0x260, openFinal: 0x300, want: start},
			{wal: pg.Commit(0x300, 0x310), lsn: 0x310, want: start},
			{ack: true, want: 0x310},
			{keepalive: 0x400, want: 0x400},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := &holdingPublisher{}
			tmpl, err := sink.ParseTemplate("outbox.event.{aggregate_type}")
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewPipeline(PipelineConfig{Table: "public.outbox", Template: tmpl, MaxTopics: 100, Policy: fastPolicy,
				Limits: checkpoint.Limits{MaxEvents: 4, MaxBytes: 1 << 20}, Start: start, HeartbeatPrefix: prefix},
				atLeastOnce{pub}, &fakeMarker{marked: make(chan string, 10)}, zerolog.Nop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.dec.Close() })
			ctx := context.Background()
			for i, s := range tc.steps {
				switch {
				case s.wal != nil:
					if err := p.Handle(ctx, s.lsn, s.wal); err != nil {
						t.Fatalf("step %d: Handle(%q) at %s: %v", i, s.wal[0], s.lsn, err)
					}
				case s.keepalive != 0:
					p.AdvanceIdle(s.keepalive)
				case s.ack:
					pub.ackAll()
				}
				got := p.Flushed()
				if low, ok := pub.minUnacked(t); ok && got > low {
					t.Fatalf("step %d: watermark %s passed an unacked record committed at %s", i, got, low)
				}
				if s.openFinal != 0 && got > s.openFinal {
					t.Fatalf("step %d: watermark %s passed the open transaction's final LSN %s", i, got, s.openFinal)
				}
				if got != s.want {
					t.Fatalf("step %d: watermark %s, want %s", i, got, s.want)
				}
			}
		})
	}
}
