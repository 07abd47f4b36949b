package relay

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

const testPrefix = "orders-outbox"

// downMarker is PostgreSQL away for good: every row mark fails with a
// connection error, which the mark queue would retry for ever.
type downMarker struct{ calls atomic.Int32 }

func (m *downMarker) MarkDead(context.Context, int64, int, string) (bool, error) {
	m.calls.Add(1)
	return false, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

func (m *downMarker) MarkFailed(context.Context, int64, int, string) error {
	m.calls.Add(1)
	return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// msgTxn hands one transaction of raw pgoutput messages (Inserts and
// Messages) to Handle, between its Begin and Commit.
func (h *harness) msgTxn(commit, end pglogrepl.LSN, msgs ...[]byte) error {
	t := walTxn{commit: commit, end: end, msgs: [][]byte{pg.Begin(commit, 7)}}
	t.msgs = append(append(t.msgs, msgs...), pg.Commit(commit, end))
	done := make(chan error, 1)
	h.in <- walReq{ctx: h.ctx, txn: t, done: done}
	return <-done
}

func envelope(id, aggID string) string {
	return `{"id": "` + id + `", "aggregate_type": "order", "aggregate_id": "` + aggID + `", "event_type": "order.paid", "payload": {"id": "` + id + `"}, "headers": {"trace": "t-` + id + `"}}`
}

func headerMap(m sink.Message) map[string]string {
	hd := map[string]string{}
	for _, x := range m.Headers {
		hd[string(x.Key)] = string(x.Value)
	}
	return hd
}

// Message events are published like rows (event_id = the envelope's id);
// a refused one (bad envelope, non-transactional, too large for Kafka) is
// dead-lettered with the whole message and acked once the dead letter is
// in Kafka, without touching the outbox table: there is no row to mark,
// and a PostgreSQL outage must not hold the slot.
func TestMessageEventDeadLetters(t *testing.T) {
	policy := fastPolicy
	policy.MaxMessageBytes = 4096
	marker := &downMarker{}
	h := newHarnessWith(t, policy, func(string, int) error { return nil }, marker, func(c *PipelineConfig) { c.MessagePrefix = testPrefix })
	h.pub.maxBytes = 2048 // the broker's limit, below kafka.max_message_bytes
	bad := `{"id": "m-bad", "aggregate_type": "order", "event_type": "order.paid"}`
	big := `{"id": "m-big", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "E", "payload": "` + strings.Repeat("x", 3000) + `"}`
	err := h.msgTxn(100, 110,
		pg.Message(true, 90, testPrefix, envelope("m-1", "o-1")),
		pg.Insert(pg.OutboxID, order("5", "o-1")...),
		pg.Message(true, 92, testPrefix, bad),
		pg.Message(true, 93, testPrefix, big),
		pg.Message(true, 94, testPrefix, envelope("m-2", "o-1")),
	)
	if err != nil {
		t.Fatal(err)
	}
	// A non-transactional one arrives alone, outside any transaction.
	done := make(chan error, 1)
	h.in <- walReq{ctx: h.ctx, txn: walTxn{commit: 120, end: 120, msgs: [][]byte{pg.Message(false, 120, testPrefix, envelope("m-nt", "o-1"))}}, done: done}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(120)
	if n := marker.calls.Load(); n != 0 {
		t.Errorf("%d row marks tried for message events: there is no row", n)
	}
	sent, _ := h.pub.snapshot()
	var events, letters []string
	seen := map[string]bool{}
	for _, m := range sent {
		hd := headerMap(m)
		switch m.Topic {
		case testTopic:
			if !seen[hd["event_id"]] { // rewinds (the too large one) publish the others again
				events = append(events, hd["event_id"])
			}
			seen[hd["event_id"]] = true
			if strings.HasPrefix(hd["event_id"], "m-") && (string(m.Key) != "o-1" || hd["trace"] != "t-"+hd["event_id"] || string(m.Value) != `{"id": "`+hd["event_id"]+`"}`) {
				t.Errorf("message event record: key %q value %q headers %v", m.Key, m.Value, hd)
			}
		case testDLQ:
			letters = append(letters, hd["dlq.event_id"]+":"+hd["dlq.reason"])
			if hd["dlq.message_prefix"] != testPrefix || hd["dlq.table"] != "" {
				t.Errorf("dead letter %s: dlq.message_prefix %q dlq.table %q", hd["dlq.event_id"], hd["dlq.message_prefix"], hd["dlq.table"])
			}
			if hd["dlq.event_id"] == "m-bad" && (string(m.Value) != bad || !strings.Contains(hd["dlq.error"], `field "aggregate_id": is missing`)) {
				t.Errorf("dead letter of the bad envelope: value %q error %q; want the whole message and the field", m.Value, hd["dlq.error"])
			}
			if hd["dlq.event_id"] == "m-nt" && !strings.Contains(hd["dlq.error"], "transactional") {
				t.Errorf("dead letter of the non-transactional message: error %q", hd["dlq.error"])
			}
		}
	}
	if strings.Join(events, " ") != "m-1 5 m-2" {
		t.Errorf("events published %q, want m-1 5 m-2 in WAL order", events)
	}
	want := map[string]bool{"m-bad:bad_message": true, "m-big:message_too_large": true, "m-nt:bad_message": true}
	if len(letters) != len(want) {
		t.Errorf("dead letters %q, want %v", letters, want)
	}
	for _, l := range letters {
		if !want[l] {
			t.Errorf("dead letter %q not expected (want %v)", l, want)
		}
	}
}

// Under on_poison: halt a refused message halts publishing before it, the
// watermark stays before its transaction, and nothing is written to the
// outbox table (there is no row to record the halt on).
func TestMessageEventHalts(t *testing.T) {
	policy := fastPolicy
	policy.Halt = true
	marker := &downMarker{}
	h := newHarnessWith(t, policy, func(string, int) error { return nil }, marker, func(c *PipelineConfig) { c.MessagePrefix = testPrefix })
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	h.ctx = ctx
	errc := make(chan error, 1)
	go func() {
		errc <- h.msgTxn(100, 110, pg.Message(true, 90, testPrefix, envelope("m-1", "o-1")), pg.Message(true, 91, testPrefix, `[]`))
	}()
	h.waitHalted("a bad message did not halt")
	if err := h.p.Halted(); !strings.Contains(err.Error(), `outbox message (prefix "orders-outbox")`) || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("halt reason %v", err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Handle = %v, want context.Canceled", err)
	}
	if n := marker.calls.Load(); n != 0 {
		t.Errorf("%d row marks tried for a message", n)
	}
	if sent, _ := h.pub.snapshot(); len(sent) != 0 {
		t.Errorf("published %d records of a halted transaction", len(sent))
	}
	if h.p.Flushed() >= 100 {
		t.Errorf("watermark %s passed the halted transaction", h.p.Flushed())
	}
}

// A message's dead letter is acked once Kafka has it, never queued behind
// the row marks: while PostgreSQL is away, a dead-lettered row waits for
// its mark, but the message events after it do not.
func TestMessageDeadLetterDoesNotWaitForRowMarks(t *testing.T) {
	marker := &downMarker{}
	h := newHarnessWith(t, fastPolicy, func(string, int) error { return nil }, marker, func(c *PipelineConfig) { c.MessagePrefix = testPrefix })
	bad := pg.Row("43", "order", "o-2", "order.paid", `{}`, pg.Null)
	bad[2] = pg.Null // aggregate_id IS NULL: a bad row, dead-lettered, then marked
	if err := h.txn(100, 110, bad); err != nil {
		t.Fatal(err)
	}
	if err := h.msgTxn(200, 210, pg.Message(true, 190, testPrefix, `{}`), pg.Message(true, 191, testPrefix, envelope("m-1", "o-1"))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := h.p.InFlight(); n == 1 {
			break // only the row, waiting for its mark
		}
		if time.Now().After(deadline) {
			n, _ := h.p.InFlight()
			t.Fatalf("%d events in flight, want 1: the message's dead letter waits behind the row's mark", n)
		}
		select {
		case <-h.p.Advanced():
		case <-time.After(time.Millisecond):
		}
	}
	if h.p.Flushed() >= 110 {
		t.Errorf("watermark %s passed a row whose mark never succeeded", h.p.Flushed())
	}
}

// messages.prefix: off by default; never the relays' heartbeat namespace.
func TestMessagesConfigValidate(t *testing.T) {
	tests := []struct {
		prefix, err string
	}{
		{"", ""},
		{"orders-outbox", ""},
		{"outbox-relay-orders", ""}, // not the namespace: no '/'
		{"outbox-relay/outbox_relay", `messages.prefix: "outbox-relay/outbox_relay" clashes with the relays' heartbeat messages (outbox-relay/outbox_relay, outbox-relay/<slot> for any other relay): choose another prefix`},
		{"outbox-relay/other", "clashes with the relays' heartbeat messages"},
		{"outbox-relay", "clashes with the relays' heartbeat messages"},
		{"a\x00b", "must be printable UTF-8 text"},
		{"\xff", "must be printable UTF-8 text"},
		{strings.Repeat("p", 256), "is 256 bytes: use at most 255"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.Postgres.URL = "postgres://u@h/db"
		c.Kafka.Brokers = []string{"k:9092"}
		c.Messages.Prefix = tt.prefix
		err := c.Validate()
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.prefix, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: %v, want %q", tt.prefix, err, tt.err)
		}
	}
}

// A Message's walStart is the end of its WAL record (PostgreSQL gives a
// message the LSN pg_logical_emit_message returns), which is where the next
// record starts: a row inserted right after a message has the message's LSN.
// The two events must not be taken for one: a dead-lettered message does not
// make the row after it count as dead-lettered when a rewind resends them
// (the row would be acked unpublished: lost).
func TestMessageAndNextRowShareAnLSN(t *testing.T) {
	failed := atomic.Bool{}
	answer := func(topic string, _ int) error {
		if topic == testTopic && failed.CompareAndSwap(false, true) {
			return sarama.ErrNotEnoughReplicas // once: a rewind resends the transaction
		}
		return nil
	}
	h := newHarnessWith(t, fastPolicy, answer, &downMarker{}, func(c *PipelineConfig) { c.MessagePrefix = testPrefix })
	done := make(chan error, 1)
	h.in <- walReq{ctx: h.ctx, done: done, txn: walTxn{commit: 100, end: 110, at: []pglogrepl.LSN{80, 90, 90, 100}, msgs: [][]byte{
		pg.Begin(100, 7),
		pg.Message(true, 90, testPrefix, `{"not": "an envelope"}`), // dead-lettered at once
		pg.Insert(pg.OutboxID, order("5", "o-1")...),               // the same LSN, fails once
		pg.Commit(100, 110),
	}}}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	sent, _ := h.pub.snapshot()
	var got []string
	for _, m := range sent {
		got = append(got, m.Topic+":"+headerMap(m)["event_id"]+headerMap(m)["dlq.reason"])
	}
	if n := strings.Count(strings.Join(got, " "), testTopic+":5"); n != 2 {
		t.Fatalf("records %q: want row 5 sent twice (failed, then resent after the rewind)", got)
	}
}
