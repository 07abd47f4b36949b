package relay

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

func TestDrainAndIdle(t *testing.T) {
	h := newHarness(t, fastPolicy, nil)
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.p.Drain(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with an unacked event and an ended ctx = %v", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- h.p.Drain(context.Background()) }()
	m.Done(nil)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if h.p.Flushed() != 110 {
		t.Fatalf("watermark %s after drain", h.p.Flushed())
	}
	// A new session resends the relation; a begun transaction blocks idle advance.
	if err := h.p.Handle(h.ctx, 190, pg.OutboxRelation()); err != nil {
		t.Fatal(err)
	}
	if err := h.p.Handle(h.ctx, 195, pg.Begin(300, 8)); err != nil {
		t.Fatal(err)
	}
	h.p.AdvanceIdle(250)
	if h.p.Flushed() != 110 {
		t.Errorf("idle advance inside a transaction: watermark %s", h.p.Flushed())
	}
}

func TestHeartbeatThroughPipeline(t *testing.T) {
	const prefix = "outbox-relay/outbox_relay"
	h := newHarnessWith(t, fastPolicy, nil, &fakeMarker{marked: make(chan string, 10)},
		func(c *PipelineConfig) { c.HeartbeatPrefix = prefix })
	h.pub.answer = nil
	if err := h.txn(100, 110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	m := h.held()
	sent := time.Now().Add(-10 * time.Second)
	h.p.Emitted(0x160, sent) // the record ends at 0x160, starts at 150
	if err := h.p.Handle(h.ctx, 150, pg.Message(false, 150, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatal(err)
	}
	if n := h.p.decoded.Load(); n != 1 {
		t.Errorf("events decoded = %d after a heartbeat, want 1", n)
	}
	if e, _ := h.p.InFlight(); e != 1 {
		t.Errorf("in flight = %d after a heartbeat, want 1", e)
	}
	if lag := h.p.Lag(); lag < 10*time.Second {
		t.Errorf("lag = %s with an event before a 10s old heartbeat unacked, want >= 10s", lag)
	}
	m.Done(nil)
	// The ack of the only event before the heartbeat moves the watermark
	// to the heartbeat, not just to the event's transaction.
	h.waitFlushed(150)
	if lag := h.p.Lag(); lag != 0 {
		t.Errorf("lag = %s once every event before the heartbeat is acked, want 0", lag)
	}
	// The server resends it after a reconnect: ignored.
	if err := h.p.Handle(h.ctx, 150, pg.Message(false, 150, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatalf("a resent heartbeat: %v", err)
	}

	// Idle: the heartbeat moves the watermark to its record by itself.
	sent = time.Now()
	h.p.Emitted(0x260, sent)
	if err := h.p.Handle(h.ctx, 0x200, pg.Message(false, 0x200, prefix, strconv.FormatInt(sent.UnixNano(), 10))); err != nil {
		t.Fatal(err)
	}
	if got := h.p.Flushed(); got != 0x200 {
		t.Errorf("watermark %s after an idle heartbeat at 0/200, want 0/200", got)
	}
	if lag := h.p.Lag(); lag != 0 {
		t.Errorf("lag = %s after an idle heartbeat passed, want 0", lag)
	}
	// Another relay's heartbeat (another slot) is ignored.
	if err := h.p.Handle(h.ctx, 0x300, pg.Message(false, 0x300, "outbox-relay/other", "1")); err != nil {
		t.Fatal(err)
	}
	if got := h.p.Flushed(); got != 0x200 {
		t.Errorf("watermark %s after another slot's heartbeat, want 0/200", got)
	}
}

func TestStreamedTransactionThroughPipeline(t *testing.T) {
	h := newHarness(t, fastPolicy, func(string, int) error { return nil })
	feed := func(lsn pglogrepl.LSN, msg []byte) {
		t.Helper()
		if err := h.p.Handle(h.ctx, lsn, msg); err != nil {
			t.Fatalf("Handle at %s: %v", lsn, err)
		}
	}
	feed(1, pg.StreamStart(100, true))
	feed(2, pg.Streamed(100, pg.OutboxRelation()))
	lsn := pglogrepl.LSN(10)
	for i := 1; i <= 30; i++ {
		xid := uint32(100)
		if i > 25 {
			xid = 101 // a savepoint, rolled back below
		}
		feed(lsn, pg.Streamed(xid, pg.Insert(pg.OutboxID, order(strconv.Itoa(i), "a")...)))
		lsn++
	}
	feed(lsn, pg.StreamStop())
	feed(lsn+1, pg.StreamAbort(100, 101))
	if sent, _ := h.pub.snapshot(); len(sent) != 0 {
		t.Fatalf("%d events published before the Stream Commit", len(sent))
	}
	h.p.AdvanceIdle(lsn + 2) // between blocks, nothing in flight: the server resends the open transaction whole
	feed(lsn+3, pg.StreamCommit(100, 500, 510))
	h.waitFlushed(510)
	sent, _ := h.pub.snapshot()
	if len(sent) != 25 {
		t.Fatalf("%d events published, want 25 (the 5 of the rolled-back savepoint dropped)", len(sent))
	}
	for i, m := range sent {
		var id, lsnHdr string
		for _, hd := range m.Headers {
			switch string(hd.Key) {
			case "event_id":
				id = string(hd.Value)
			case "pg_lsn":
				lsnHdr = string(hd.Value)
			}
		}
		if id != strconv.Itoa(i+1) || lsnHdr != pglogrepl.LSN(500).String() {
			t.Fatalf("event %d: id %s pg_lsn %s, want id %d at the commit LSN 0/1F4", i, id, lsnHdr, i+1)
		}
	}
	if c := h.p.streamed.Load(); c != 1 {
		t.Fatalf("streamed transactions counted %d, want 1", c)
	}
}

// TestEventLSN: the slot saver keeps confirmations only past transactions
// with events; heartbeats and empty transactions move nothing.
func TestEventLSN(t *testing.T) {
	const prefix = "outbox-relay/outbox_relay"
	h := newHarnessWith(t, fastPolicy, func(string, int) error { return nil }, &fakeMarker{marked: make(chan string, 10)},
		func(c *PipelineConfig) { c.HeartbeatPrefix = prefix })
	if got := h.p.EventLSN(); got != 0 {
		t.Fatalf("EventLSN %s before any event, want 0", got)
	}
	if err := h.txn(0x100, 0x110, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	if got := h.p.EventLSN(); got != 0x100 {
		t.Errorf("EventLSN %s after a transaction committed at 0/100, want 0/100", got)
	}
	h.waitFlushed(0x110)
	h.p.Emitted(0x260, time.Now())
	if err := h.p.Handle(h.ctx, 0x200, pg.Message(false, 0x200, prefix, strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
		t.Fatal(err)
	}
	if err := h.txn(0x300, 0x310); err != nil { // a transaction without outbox rows
		t.Fatal(err)
	}
	h.p.AdvanceIdle(0x400)
	if got := h.p.EventLSN(); got != 0x100 {
		t.Errorf("EventLSN %s after a heartbeat, an empty transaction and an idle advance, want 0/100", got)
	}
	if err := h.txn(0x500, 0x510, order("2", "b")); err != nil {
		t.Fatal(err)
	}
	if got := h.p.EventLSN(); got != 0x500 {
		t.Errorf("EventLSN %s after a transaction committed at 0/500, want 0/500", got)
	}
}
