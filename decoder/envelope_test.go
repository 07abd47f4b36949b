package decoder_test

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

const msgPrefix = "orders-outbox"

// env is an envelope with the four required fields and payload/headers
// given as raw JSON ("" leaves the key out).
func env(id, aggID, payload, headers string) string {
	s := `{"id": "` + id + `", "aggregate_type": "order", "aggregate_id": "` + aggID + `", "event_type": "E"`
	if payload != "" {
		s += `, "payload": ` + payload
	}
	if headers != "" {
		s += `, "headers": ` + headers
	}
	return s + "}"
}

// msgEv is the expected event of a message at message index i.
func msgEv(i int, id, aggID, payload string, headers []decoder.Header) decoder.Event {
	return decoder.Event{Source: decoder.SourceMessage, MessageID: id, AggregateType: "order", AggregateID: aggID,
		EventType: "E", Payload: []byte(payload), Headers: headers, LSN: lsnAt(i)}
}

// decodeMsgs decodes msgs with the message prefix set and returns every Txn.
func decodeMsgs(t *testing.T, prefix string, limit int, msgs [][]byte) ([]*decoder.Txn, decoder.Counts) {
	t.Helper()
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	d.SetHeartbeatPrefix("outbox-relay/outbox_relay")
	d.SetMessagePrefix(prefix, limit)
	var txns []*decoder.Txn
	buf := make([]byte, 0, 256)
	for i, m := range msgs {
		buf = append(buf[:0], m...)
		txn, err := d.Decode(lsnAt(i), buf)
		for j := range buf[:cap(buf)] { // the decoder must have copied what it keeps
			buf[:cap(buf)][j] = 0xA5
		}
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		for txn != nil {
			txns = append(txns, txn)
			if txn, err = d.Next(); err != nil {
				t.Fatalf("message %d: Next: %v", i, err)
			}
		}
	}
	if d.InTxn() {
		t.Error("a transaction is left open")
	}
	return txns, d.Counts()
}

// Transactional messages with the prefix are events of their transaction,
// in WAL order with its rows; everything else about Messages is unchanged.
func TestMessageEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prefix string
		msgs   [][]byte
		want   []*decoder.Txn
		counts decoder.Counts
	}{
		{
			name: "rows and messages interleave in WAL order", prefix: msgPrefix,
			msgs: [][]byte{
				begin(0x2000, 700), outboxRelation(),
				insert(outboxID, row("1", "order", "o-1", "E", `{"n": 1}`, null)...),
				message(true, 0x2010, msgPrefix, env("m-2", "o-1", `{"n":2, "nested": [1, {"x": "y"}]}`, `{"trace": "t-1", "n": 5}`)),
				insert(outboxID, row("3", "order", "o-1", "E", `{"n": 3}`, null)...),
				message(true, 0x2020, msgPrefix, env("m-4", "o-2", `"just a string"`, "")),
				message(true, 0x2028, msgPrefix, env("m-5", "o-2", "", "null")), // no payload: the text null
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(700, 0x2000, 0x2000, 0x2030,
				event(2, 1, "order", "o-1", "E", `{"n": 1}`, nil),
				msgEv(3, "m-2", "o-1", `{"n":2, "nested": [1, {"x": "y"}]}`, hdrs("trace", "t-1", "n", "5")),
				event(4, 3, "order", "o-1", "E", `{"n": 3}`, nil),
				msgEv(5, "m-4", "o-2", `"just a string"`, nil),
				msgEv(6, "m-5", "o-2", `null`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 5, MessageEvents: 3},
		},
		{
			name: "a transaction of messages only", prefix: msgPrefix,
			msgs: [][]byte{
				begin(0x2000, 701),
				message(true, 0x2010, msgPrefix, `{"payload":{},"event_type":"E","aggregate_id":"a","aggregate_type":"order","id":"x","extra":[1,2]}`),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(701, 0x2000, 0x2000, 0x2030, decoder.Event{Source: decoder.SourceMessage, MessageID: "x",
				AggregateType: "order", AggregateID: "a", EventType: "E", Payload: []byte(`{}`), LSN: lsnAt(1)})},
			counts: decoder.Counts{Txns: 1, Events: 1, MessageEvents: 1},
		},
		{
			name: "other prefixes and heartbeats are not ours", prefix: msgPrefix,
			msgs: [][]byte{
				message(false, 0x1000, "outbox-relay/outbox_relay", "5"),
				message(false, 0x1008, "app", env("a", "b", "1", "")),
				begin(0x2000, 702),
				message(true, 0x2010, msgPrefix+"x", env("a", "b", "1", "")),
				message(true, 0x2018, "orders", env("a", "b", "1", "")),
				message(true, 0x2020, "", env("a", "b", "1", "")),
				commit(0x2000, 0x2030),
			},
			want:   []*decoder.Txn{txn(702, 0x2000, 0x2000, 0x2030)},
			counts: decoder.Counts{Txns: 1, OtherMessages: 4, Heartbeats: 1},
		},
		{
			name: "message events off: the prefix is not special",
			msgs: [][]byte{
				begin(0x2000, 703),
				message(true, 0x2010, msgPrefix, env("a", "b", "1", "")),
				commit(0x2000, 0x2030),
				message(false, 0x2040, msgPrefix, env("a", "b", "1", "")),
			},
			want:   []*decoder.Txn{txn(703, 0x2000, 0x2000, 0x2030)},
			counts: decoder.Counts{Txns: 1, OtherMessages: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, counts := decodeMsgs(t, tt.prefix, 0, tt.msgs)
			assertTxns(t, got, tt.want)
			if counts != tt.counts {
				t.Errorf("counts %+v, want %+v", counts, tt.counts)
			}
		})
	}
}

// A non-transactional message with the prefix is decoded even when its
// writer rolls back: it is refused, alone, as a transaction ending at the
// message's LSN, so that on_poison decides and the slot may pass it.
func TestNonTransactionalMessageIsRefused(t *testing.T) {
	t.Parallel()
	content := env("m-1", "o-1", `{"n": 1}`, "")
	txns, counts := decodeMsgs(t, msgPrefix, 0, [][]byte{message(false, 0x5000, msgPrefix, content)})
	if len(txns) != 1 || len(txns[0].Events) != 1 {
		t.Fatalf("got %d txns, want one with one event", len(txns))
	}
	x := txns[0]
	if x.CommitLSN != 0x5000 || x.EndLSN != 0x5000 || x.Partial {
		t.Errorf("txn commit %s end %s partial %v, want 0/5000 twice, not partial", x.CommitLSN, x.EndLSN, x.Partial)
	}
	ev := x.Events[0]
	if ev.Err == nil || ev.Source != decoder.SourceMessage {
		t.Fatalf("event %+v: want a refused message", ev)
	}
	msg := ev.Err.Error()
	for _, want := range []string{`outbox message (prefix "orders-outbox")`, "at LSN " + lsnAt(0).String(), `field "transactional"`, "pg_logical_emit_message(true"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if string(ev.Payload) != content {
		t.Errorf("payload %q, want the whole message %q", ev.Payload, content)
	}
	if ev.MessageID != "m-1" || ev.Err.MessageID != "m-1" || ev.AggregateID != "o-1" || ev.Headers != nil {
		t.Errorf("event %+v: want what the envelope says read (for the dead letter), no headers", ev)
	}
	if counts.Events != 1 || counts.MessageEvents != 1 {
		t.Errorf("counts %+v", counts)
	}
}

// Hostile content: every message that cannot become an event is an event
// with Err naming the LSN and the field; the stream goes on.
func TestMessageErrors(t *testing.T) {
	t.Parallel()
	big := env("m", "o", `"`+strings.Repeat("x", 2000)+`"`, "")
	tests := []struct {
		name      string
		content   string
		field     string
		reason    string // substring of Err.Reason
		reserved  string
		noPayload bool // the dead letter cannot carry it
	}{
		{name: "invalid JSON", content: `{"id": "m", `, field: "content", reason: "is not valid JSON"},
		{name: "not JSON at all", content: `hello`, field: "content", reason: "is not valid JSON"},
		{name: "empty", content: ``, field: "content", reason: "is not valid JSON"},
		{name: "an array", content: `[1, 2]`, field: "content", reason: "is a JSON array, not a JSON object"},
		{name: "a string", content: `"x"`, field: "content", reason: "is a JSON string, not a JSON object"},
		{name: "null", content: `null`, field: "content", reason: "is JSON null, not a JSON object"},
		{name: "two documents", content: env("m", "o", "1", "") + ` {}`, field: "content", reason: "has data after the JSON object"},
		{name: "invalid UTF-8", content: env("m", "o\xff", "1", ""), field: "content", reason: "is not valid UTF-8"},
		{name: "missing id", content: `{"aggregate_type": "order", "aggregate_id": "o", "event_type": "E", "payload": 1}`, field: "id", reason: "is missing"},
		{name: "missing aggregate_type", content: `{"id": "m", "aggregate_id": "o", "event_type": "E"}`, field: "aggregate_type", reason: "is missing"},
		{name: "missing aggregate_id", content: `{"id": "m", "aggregate_type": "order", "event_type": "E"}`, field: "aggregate_id", reason: "is missing"},
		{name: "missing event_type", content: `{"id": "m", "aggregate_type": "order", "aggregate_id": "o"}`, field: "event_type", reason: "is missing"},
		{name: "id a number", content: `{"id": 42, "aggregate_type": "order", "aggregate_id": "o", "event_type": "E"}`, field: "id", reason: "is a JSON number, not a JSON string"},
		{name: "aggregate_id an object", content: `{"id": "m", "aggregate_type": "order", "aggregate_id": {"a": 1}, "event_type": "E"}`, field: "aggregate_id", reason: "is a JSON object, not a JSON string"},
		{name: "event_type null", content: `{"id": "m", "aggregate_type": "order", "aggregate_id": "o", "event_type": null}`, field: "event_type", reason: "is JSON null"},
		{name: "empty id", content: env("", "o", "1", ""), field: "id", reason: "is empty"},
		{name: "empty aggregate_id", content: env("m", "", "1", ""), field: "aggregate_id", reason: "is empty"},
		{name: "duplicate key", content: `{"id": "m", "aggregate_type": "order", "aggregate_id": "o", "aggregate_id": "p", "event_type": "E"}`, field: "aggregate_id", reason: "appears twice"},
		{name: "headers an array", content: env("m", "o", "1", `["a"]`), field: "headers", reason: "is a JSON array, not a JSON object"},
		{name: "headers a string", content: env("m", "o", "1", `"k=v"`), field: "headers", reason: "is a JSON string, not a JSON object"},
		{name: "forged event_id", content: env("m", "o", "1", `{"event_id": "1"}`), field: "headers", reason: `reserved key "event_id"`, reserved: "event_id"},
		{name: "forged pg_lsn, other case", content: env("m", "o", "1", `{"ok": "1", "PG_LSN": "0/0"}`), field: "headers", reason: `reserved key "PG_LSN"`, reserved: "PG_LSN"},
		{name: "forged aggregate_id", content: env("m", "o", "1", `{"aggregate_id": "other"}`), field: "headers", reason: "reserved key", reserved: "aggregate_id"},
		{name: "forged dlq header", content: env("m", "o", "1", `{"dlq.reason": "x"}`), field: "headers", reason: "reserved key", reserved: "dlq.reason"},
		{name: "huge content", content: big, field: "content", reason: "bytes, over the limit of 1024 (kafka.max_message_bytes)", noPayload: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			txns, _ := decodeMsgs(t, msgPrefix, 1024, [][]byte{
				begin(0x2000, 9),
				message(true, 0x2010, msgPrefix, tt.content),
				message(true, 0x2018, msgPrefix, env("ok", "o", "1", "")), // the stream goes on
				commit(0x2000, 0x2030),
			})
			if len(txns) != 1 || len(txns[0].Events) != 2 {
				t.Fatalf("got %d txns, want 1 with 2 events", len(txns))
			}
			ev, next := txns[0].Events[0], txns[0].Events[1]
			if next.Err != nil || next.MessageID != "ok" {
				t.Errorf("the next message: %+v", next)
			}
			if ev.Err == nil {
				t.Fatalf("event %+v: no Err", ev)
			}
			e := ev.Err
			if e.Column != tt.field || !strings.Contains(e.Reason, tt.reason) || e.ReservedHeader != tt.reserved || e.LSN != lsnAt(1) {
				t.Errorf("Err %+v: want field %q, reason containing %q, reserved %q, LSN %s", *e, tt.field, tt.reason, tt.reserved, lsnAt(1))
			}
			msg := e.Error()
			for _, want := range []string{`outbox message (prefix "orders-outbox")`, "at LSN " + lsnAt(1).String(), `field "` + tt.field + `"`, "; "} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if ev.Source != decoder.SourceMessage || ev.Headers != nil {
				t.Errorf("event source %v headers %v", ev.Source, ev.Headers)
			}
			switch {
			case tt.noPayload && ev.Payload != nil:
				t.Errorf("payload of %d bytes kept, want none", len(ev.Payload))
			case !tt.noPayload && string(ev.Payload) != tt.content:
				t.Errorf("payload %q, want the whole message %q", ev.Payload, tt.content)
			}
		})
	}
}

// Inside a streamed transaction, messages are spooled with its rows (also
// to disk), truncated with an aborted subtransaction, dropped with an
// aborted transaction, and handed out in WAL order at Stream Commit.
func TestStreamedMessageEvents(t *testing.T) {
	t.Parallel()
	for _, spill := range []int{1 << 20, 1} {
		d, err := decoder.New("public.outbox")
		if err != nil {
			t.Fatal(err)
		}
		d.SetMessagePrefix(msgPrefix, 0)
		d.SetSpill(t.TempDir(), spill)
		d.SetChunk(2, 0)
		m := func(xid uint32, id string) []byte {
			return streamed(xid, message(true, 0x3000, msgPrefix, env(id, "o-1", `{"id": "`+id+`"}`, `{"k": "`+id+`"}`)))
		}
		bad := streamed(100, message(true, 0x3000, msgPrefix, `[]`))
		msgs := [][]byte{
			streamStart(100, true), streamed(100, outboxRelation()), ev(100, 1), m(100, "m-2"), bad, streamStop(),
			streamStart(200, true), m(200, "gone"), streamStop(),
			streamStart(100, false), m(101, "sub-aborted"), ev(101, 99), streamStop(),
			streamAbort(100, 101), streamAbort(200, 200),
			streamStart(100, false), m(100, "m-4"), streamStop(),
			streamCommit(100, 0x4000, 0x4030),
		}
		var evs []decoder.Event
		for i, msg := range msgs {
			txn, err := d.Decode(pglogrepl.LSN(0x1000+i), msg)
			if err != nil {
				t.Fatalf("spill %d: message %d: %v", spill, i, err)
			}
			for txn != nil {
				evs = append(evs, txn.Events...)
				if txn, err = d.Next(); err != nil {
					t.Fatal(err)
				}
			}
		}
		var ids []string
		for _, e := range evs {
			switch {
			case e.Err != nil:
				ids = append(ids, "err:"+e.Err.Column+":"+e.Err.Prefix)
			case e.Source == decoder.SourceMessage:
				ids = append(ids, e.MessageID+":"+string(e.Payload)+":"+e.Headers[0].Key+"="+string(e.Headers[0].Value))
			default:
				ids = append(ids, "row")
			}
		}
		want := []string{"row", `m-2:{"id": "m-2"}:k=m-2`, "err:content:" + msgPrefix, `m-4:{"id": "m-4"}:k=m-4`}
		if strings.Join(ids, " ") != strings.Join(want, " ") {
			t.Errorf("spill %d: events %q, want %q", spill, ids, want)
		}
		if len(evs) == 4 && evs[2].Err.Error() != "" && !strings.Contains(evs[2].Err.Error(), "is a JSON array") {
			t.Errorf("spooled error lost its text: %v", evs[2].Err)
		}
		d.Close()
	}
}

// A Message with the prefix whose length field is wrong is a broken stream,
// not an ignorable foreign message.
func TestMalformedMessageEvent(t *testing.T) {
	d, _ := decoder.New("public.outbox")
	d.SetMessagePrefix(msgPrefix, 0)
	if _, err := d.Decode(0x10, begin(0x30, 1)); err != nil {
		t.Fatal(err)
	}
	m := append(message(true, 0x20, msgPrefix, env("a", "b", "1", "")), 'x')
	if _, err := d.Decode(0x20, m); err == nil || !strings.Contains(err.Error(), "content length") {
		t.Fatalf("err %v, want a protocol error about the content length", err)
	}
	d2, _ := decoder.New("public.outbox")
	d2.SetMessagePrefix(msgPrefix, 0)
	if _, err := d2.Decode(0x20, message(true, 0x20, msgPrefix, env("a", "b", "1", ""))); err == nil || !strings.Contains(err.Error(), "outside any transaction") {
		t.Fatalf("err %v, want a protocol error: transactional outside a transaction", err)
	}
}
