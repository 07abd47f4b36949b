package decoder_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// lsnAt is the walStart the tests give to message i of a stream.
func lsnAt(i int) pglogrepl.LSN { return pglogrepl.LSN(0x16B3F00 + 0x28*i) }

// feed decodes msgs in order through one reused buffer, scribbling over the
// buffer after every call as the replication loop reuses its receive buffer:
// any byte the decoder kept without copying shows up as garbage. It stops at
// the first error and returns the index of the message that caused it.
func feed(t *testing.T, d *decoder.Decoder, msgs [][]byte) ([]*decoder.Txn, int, error) {
	t.Helper()
	var txns []*decoder.Txn
	buf := make([]byte, 0, 256)
	for i, m := range msgs {
		buf = append(buf[:0], m...)
		txn, err := d.Decode(lsnAt(i), buf)
		full := buf[:cap(buf)]
		for j := range full {
			full[j] = 0xA5
		}
		if err != nil {
			if txn != nil {
				t.Errorf("message %d: Decode returned a Txn with error %v", i, err)
			}
			return txns, i, err
		}
		if isCommit := len(m) > 0 && m[0] == 'C'; isCommit != (txn != nil) {
			t.Fatalf("message %d (%q): Txn returned = %v, want %v", i, m[0], txn != nil, isCommit)
		}
		if txn != nil {
			txns = append(txns, txn)
		}
	}
	return txns, -1, nil
}

func event(i int, id int64, aggType, aggID, eventType, payload string, headers []decoder.Header) decoder.Event {
	return decoder.Event{
		ID:            id,
		AggregateType: aggType,
		AggregateID:   aggID,
		EventType:     eventType,
		Payload:       []byte(payload),
		Headers:       headers,
		LSN:           lsnAt(i),
	}
}

func txn(xid uint32, beginLSN, commitLSN, endLSN pglogrepl.LSN, events ...decoder.Event) *decoder.Txn {
	return &decoder.Txn{
		Xid:        xid,
		BeginLSN:   beginLSN,
		CommitLSN:  commitLSN,
		EndLSN:     endLSN,
		CommitTime: commitTime,
		Events:     events,
	}
}

func hdrs(kv ...string) []decoder.Header {
	h := make([]decoder.Header, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		h = append(h, decoder.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return h
}

func TestDecode(t *testing.T) {
	t.Parallel()
	withoutHeaders := relation(outboxID, "public", "outbox", "id", "aggregate_type", "aggregate_id", "event_type", "payload")

	tests := []struct {
		name   string
		table  string // default public.outbox
		msgs   [][]byte
		want   []*decoder.Txn
		counts decoder.Counts
	}{
		{
			name: "two events in one transaction",
			msgs: [][]byte{
				begin(0x2000, 700),
				outboxRelation(),
				insert(outboxID, row("41", "order", "o-1", "OrderCreated", `{"total": 10}`, text(`{"trace_id": "t-1"}`))...),
				insert(outboxID, row("42", "order", "o-1", "OrderPaid", `{"paid": true}`, null)...),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(700, 0x2000, 0x2000, 0x2030,
				event(2, 41, "order", "o-1", "OrderCreated", `{"total": 10}`, hdrs("trace_id", "t-1")),
				event(3, 42, "order", "o-1", "OrderPaid", `{"paid": true}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 2},
		},
		{
			name: "columns in another order and extra columns",
			msgs: [][]byte{
				begin(0x2000, 701),
				relation(outboxID, "public", "outbox",
					"created_at", "payload", "tenant", "headers", "event_type", "id", "aggregate_id", "aggregate_type", "blob"),
				insert(outboxID,
					text("2026-03-14 15:09:26+00"), text(`{"a": 1}`), null, text(`{"k": "v"}`),
					text("UserRenamed"), text("-7"), text("u-9"), text("user"), bin("\x00\x01")),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(701, 0x2000, 0x2000, 0x2030,
				event(2, -7, "user", "u-9", "UserRenamed", `{"a": 1}`, hdrs("k", "v")),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1},
		},
		{
			name: "table without a headers column",
			msgs: [][]byte{
				begin(0x2000, 702),
				withoutHeaders,
				insert(outboxID, text("1"), text("order"), text("o-1"), text("OrderCreated"), text(`{}`)),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(702, 0x2000, 0x2000, 0x2030,
				event(2, 1, "order", "o-1", "OrderCreated", `{}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1},
		},
		{
			name: "relation replaced after ALTER TABLE ADD COLUMN",
			msgs: [][]byte{
				begin(0x2000, 703),
				withoutHeaders,
				insert(outboxID, text("1"), text("order"), text("o-1"), text("OrderCreated"), text(`{}`)),
				commit(0x2000, 0x2030),
				begin(0x3000, 704),
				relation(outboxID, "public", "outbox", "id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "priority"),
				insert(outboxID, text("2"), text("order"), text("o-1"), text("OrderShipped"), text(`{}`), text(`{"x": 1}`), text("5")),
				commit(0x3000, 0x3030),
			},
			want: []*decoder.Txn{
				txn(703, 0x2000, 0x2000, 0x2030, event(2, 1, "order", "o-1", "OrderCreated", `{}`, nil)),
				txn(704, 0x3000, 0x3000, 0x3030, event(6, 2, "order", "o-1", "OrderShipped", `{}`, hdrs("x", "1"))),
			},
			counts: decoder.Counts{Txns: 2, Events: 2},
		},
		{
			name: "relation cached across transactions",
			msgs: [][]byte{
				begin(0x2000, 705),
				outboxRelation(),
				commit(0x2000, 0x2030),
				begin(0x3000, 706),
				insert(outboxID, row("9", "order", "o-2", "OrderCreated", `[]`, text(`{}`))...),
				commit(0x3000, 0x3030),
			},
			want: []*decoder.Txn{
				txn(705, 0x2000, 0x2000, 0x2030),
				txn(706, 0x3000, 0x3000, 0x3030, event(4, 9, "order", "o-2", "OrderCreated", `[]`, []decoder.Header{})),
			},
			counts: decoder.Counts{Txns: 2, Events: 1},
		},
		{
			name: "other tables' inserts counted and ignored",
			msgs: [][]byte{
				begin(0x2000, 707),
				relation(ordersID, "public", "orders", "id", "total"),
				insert(ordersID, text("1"), text("10.00")),
				outboxRelation(),
				insert(outboxID, row("5", "order", "o-1", "OrderCreated", `{}`, null)...),
				relation(16391, "audit", "outbox", outboxCols...), // same name, other schema
				insert(16391, row("6", "order", "o-1", "OrderCreated", `{}`, null)...),
				insert(ordersID, null, toast),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(707, 0x2000, 0x2000, 0x2030,
				event(4, 5, "order", "o-1", "OrderCreated", `{}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1, OtherTableRows: 3},
		},
		{
			name: "other message types counted and ignored",
			msgs: [][]byte{
				message(false, 0x1000, "app", "outside a transaction"),
				begin(0x2000, 708),
				origin(0x1F00, "node_a"),
				typ(17000, "public", "mood"),
				outboxRelation(),
				update(outboxID, row("5", "order", "o-1", "OrderCreated", `{}`, null)...),
				del(outboxID, text("5")),
				truncate(outboxID, ordersID),
				message(true, 0x2010, "app", "inside"),
				{'Z', 1, 2, 3},
				insert(outboxID, row("6", "order", "o-1", "OrderPaid", `{}`, null)...),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(708, 0x2000, 0x2000, 0x2030,
				event(10, 6, "order", "o-1", "OrderPaid", `{}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1, OtherMessages: 8},
		},
		{
			name:   "empty transaction",
			msgs:   [][]byte{begin(0x2000, 709), commit(0x2000, 0x2030)},
			want:   []*decoder.Txn{txn(709, 0x2000, 0x2000, 0x2030)},
			counts: decoder.Counts{Txns: 1},
		},
		{
			name:  "bare table name means schema public",
			table: "outbox",
			msgs: [][]byte{
				begin(0x2000, 710),
				outboxRelation(),
				insert(outboxID, row("1", "order", "o-1", "OrderCreated", `{}`, null)...),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(710, 0x2000, 0x2000, 0x2030,
				event(2, 1, "order", "o-1", "OrderCreated", `{}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1},
		},
		{
			name:  "schema-qualified table",
			table: "app.outbox",
			msgs: [][]byte{
				begin(0x2000, 711),
				outboxRelation(), // public.outbox is another table now
				insert(outboxID, row("1", "order", "o-1", "OrderCreated", `{}`, null)...),
				relation(16400, "app", "outbox", outboxCols...),
				insert(16400, row("2", "order", "o-1", "OrderCreated", `{}`, null)...),
				commit(0x2000, 0x2030),
			},
			want: []*decoder.Txn{txn(711, 0x2000, 0x2000, 0x2030,
				event(4, 2, "order", "o-1", "OrderCreated", `{}`, nil),
			)},
			counts: decoder.Counts{Txns: 1, Events: 1, OtherTableRows: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			table := tt.table
			if table == "" {
				table = "public.outbox"
			}
			d, err := decoder.New(table)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := feed(t, d, tt.msgs)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			assertTxns(t, got, tt.want)
			if c := d.Counts(); c != tt.counts {
				t.Errorf("Counts() = %+v, want %+v", c, tt.counts)
			}
			if d.InTxn() {
				t.Error("InTxn() = true after the last Commit")
			}
		})
	}
}

func assertTxns(t *testing.T, got, want []*decoder.Txn) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d transactions, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := *got[i], *want[i]
		if !g.CommitTime.Equal(w.CommitTime) {
			t.Errorf("txn %d: CommitTime = %v, want %v", i, g.CommitTime, w.CommitTime)
		}
		g.CommitTime = w.CommitTime
		// The source table is checked by the mapping tests.
		g.Events = slices.Clone(g.Events)
		for j := range g.Events {
			g.Events[j].Schema, g.Events[j].Table = "", ""
		}
		if len(g.Events) == 0 && len(w.Events) == 0 {
			g.Events, w.Events = nil, nil
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("txn %d:\n got %s\nwant %s", i, fmtTxn(g), fmtTxn(w))
		}
	}
}

func fmtTxn(x decoder.Txn) string {
	s := fmt.Sprintf("xid=%d begin=%s commit=%s end=%s events=[", x.Xid, x.BeginLSN, x.CommitLSN, x.EndLSN)
	for _, e := range x.Events {
		s += fmt.Sprintf("{id=%d %s/%s %s payload=%q lsn=%s headers=", e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.LSN)
		if e.Headers == nil {
			s += "nil"
		}
		for _, h := range e.Headers {
			s += fmt.Sprintf("%s:%q,", h.Key, h.Value)
		}
		s += "} "
	}
	return s + "]"
}

func TestInTxn(t *testing.T) {
	t.Parallel()
	d, _ := decoder.New("public.outbox")
	steps := []struct {
		msg  []byte
		want bool
	}{
		{outboxRelation(), false},
		{begin(0x2000, 1), true},
		{insert(outboxID, row("1", "order", "o-1", "E", `{}`, null)...), true},
		{update(outboxID, row("1", "order", "o-1", "E", `{}`, null)...), true},
		{commit(0x2000, 0x2030), false},
		{message(false, 0x2040, "p", "c"), false},
	}
	for i, s := range steps {
		if _, err := d.Decode(lsnAt(i), s.msg); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := d.InTxn(); got != s.want {
			t.Errorf("step %d (%q): InTxn() = %v, want %v", i, s.msg[0], got, s.want)
		}
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"outbox", "public.outbox", "App.Outbox"} {
		if _, err := decoder.New(table); err != nil {
			t.Errorf("New(%q): %v", table, err)
		}
	}
	for _, table := range []string{"", ".", "public.", ".outbox", "a.b.c", `"Public".outbox`, "public.out box"} {
		if _, err := decoder.New(table); err == nil || !strings.Contains(err.Error(), "postgres.table") {
			t.Errorf("New(%q) = %v, want an error naming postgres.table", table, err)
		}
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want []decoder.Header
	}{
		{"empty object", `{}`, []decoder.Header{}},
		{"strings verbatim", `{"trace_id": "abc-123", "empty": ""}`, hdrs("trace_id", "abc-123", "empty", "")},
		{"unicode", `{"name": "zoë ☃ 😀"}`, hdrs("name", "zoë ☃ 😀")},
		{"escapes", `{"q": "say \"hi\"\\now", "u": "\u00e9\ud83d\ude00", "nl": "a\nb\t/"}`,
			hdrs("q", `say "hi"\now`, "u", "é😀", "nl", "a\nb\t/")},
		{"escaped key", `{"a\"b": "v"}`, hdrs(`a"b`, "v")},
		{"html characters kept", `{"h": "<a&b>", "o": {"h": "<&>"}}`, hdrs("h", "<a&b>", "o", `{"h":"<&>"}`)},
		{"numbers keep their text", `{"i": 42, "f": 1.50, "e": -1e3, "big": 123456789012345678901234567890}`,
			hdrs("i", "42", "f", "1.50", "e", "-1e3", "big", "123456789012345678901234567890")},
		{"literals", `{"t": true, "f": false, "n": null}`, hdrs("t", "true", "f", "false", "n", "null")},
		{"nested values compact", `{"obj": {"a": [1, 2, {"b": "c d"}]}, "arr": [ ], "o2": { }}`,
			hdrs("obj", `{"a":[1,2,{"b":"c d"}]}`, "arr", "[]", "o2", "{}")},
		{"document order kept", `{"z": "1", "a": "2", "m": "3"}`, hdrs("z", "1", "a", "2", "m", "3")},
		{"whitespace around", " \n{ \"k\" :\t\"v\" }\n ", hdrs("k", "v")},
		{"duplicate keys kept (json, not jsonb)", `{"k": "1", "k": "2"}`, hdrs("k", "1", "k", "2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, _ := decoder.New("public.outbox")
			got, _, err := feed(t, d, [][]byte{
				begin(0x2000, 1),
				outboxRelation(),
				insert(outboxID, row("1", "order", "o-1", "E", `{}`, text(tt.doc))...),
				commit(0x2000, 0x2030),
			})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			h := got[0].Events[0].Headers
			if h == nil {
				t.Fatal("Headers = nil, want non-nil")
			}
			if !reflect.DeepEqual(h, tt.want) {
				t.Errorf("Headers =\n%q\nwant\n%q", h, tt.want)
			}
		})
	}
}

// TestEventOwnsItsBytes checks that the slices of an Event survive the
// caller's buffer reuse (feed scribbles over it) and cannot overwrite each
// other through append, though they share one allocation.
func TestEventOwnsItsBytes(t *testing.T) {
	t.Parallel()
	d, _ := decoder.New("public.outbox")
	got, _, err := feed(t, d, [][]byte{
		begin(0x2000, 1),
		outboxRelation(),
		insert(outboxID, row("1", "order", "o-1", "E", `{"p": 1}`, text(`{"a": "x", "b": "y"}`))...),
		insert(outboxID, row("2", "order", "o-2", "E", `{"p": 2}`, text(`{"c": "z"}`))...),
		commit(0x2000, 0x2030),
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := got[0].Events
	_ = append(ev[0].Payload, "garbage"...)
	_ = append(ev[0].Headers[0].Value, "garbage"...)
	if string(ev[0].Payload) != `{"p": 1}` || string(ev[0].Headers[0].Value) != "x" || string(ev[0].Headers[1].Value) != "y" {
		t.Errorf("event 0 = %q %q, bytes were overwritten", ev[0].Payload, ev[0].Headers)
	}
	if string(ev[1].Payload) != `{"p": 2}` || ev[1].AggregateID != "o-2" || string(ev[1].Headers[0].Value) != "z" {
		t.Errorf("event 1 = %q %q %q, bytes were overwritten", ev[1].AggregateID, ev[1].Payload, ev[1].Headers)
	}
}

func TestRowErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		rel    []byte // default outboxRelation()
		row    []tv
		column string
		id     int64
		reason string // part of RowError.Reason
	}{
		{"NULL aggregate_id", nil,
			[]tv{text("42"), text("order"), null, text("E"), text("{}"), null}, "aggregate_id", 42, "is NULL"},
		{"empty aggregate_id", nil,
			row("42", "order", "", "E", "{}", null), "aggregate_id", 42, "is empty"},
		{"NULL aggregate_type", nil,
			[]tv{text("42"), null, text("o-1"), text("E"), text("{}"), null}, "aggregate_type", 42, "is NULL"},
		{"NULL event_type", nil,
			[]tv{text("42"), text("order"), text("o-1"), null, text("{}"), null}, "event_type", 42, "is NULL"},
		{"NULL payload", nil,
			[]tv{text("42"), text("order"), text("o-1"), text("E"), null, null}, "payload", 42, "is NULL"},
		{"NULL id", nil,
			[]tv{null, text("order"), text("o-1"), text("E"), text("{}"), null}, "id", 0, "is NULL"},
		{"id not an integer", nil,
			row("4x2", "order", "o-1", "E", "{}", null), "id", 0, "not a 64-bit integer"},
		{"headers array", nil,
			row("42", "order", "o-1", "E", "{}", text(`[{"a": 1}]`)), "headers", 42, "is a JSON array, not a JSON object"},
		{"headers string", nil,
			row("42", "order", "o-1", "E", "{}", text(`"x"`)), "headers", 42, "is a JSON string, not a JSON object"},
		{"headers number", nil,
			row("42", "order", "o-1", "E", "{}", text(`7`)), "headers", 42, "is a JSON number"},
		{"headers JSON null", nil,
			row("42", "order", "o-1", "E", "{}", text(`null`)), "headers", 42, "is JSON null"},
		{"headers invalid JSON", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"a": `)), "headers", 42, "is not valid JSON"},
		{"headers boolean", nil,
			row("42", "order", "o-1", "E", "{}", text(`true`)), "headers", 42, "is a JSON boolean"},
		{"headers key not a string", nil,
			row("42", "order", "o-1", "E", "{}", text(`{1: 2}`)), "headers", 42, "is not valid JSON"},
		{"headers bad nested value", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"a": [1,]}`)), "headers", 42, "is not valid JSON"},
		{"headers unterminated", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"a": 1`)), "headers", 42, "is not valid JSON"},
		{"headers two documents", nil,
			row("42", "order", "o-1", "E", "{}", text(`{} {}`)), "headers", 42, "data after the JSON object"},
		{"reserved header key", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"event_id": "7", "aggregate_id": "victim"}`)), "headers", 42, `has the reserved key "event_id"`},
		{"reserved header key, any case", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"trace": "t", "Aggregate_ID": "victim"}`)), "headers", 42, `has the reserved key "Aggregate_ID"`},
		{"reserved dlq. prefix", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"trace": "t", "dlq.reason": "forged"}`)), "headers", 42, `has the reserved key "dlq.reason"`},
		{"reserved key behind an escape", nil, // takes the encoding/json path
			row("42", "order", "o-1", "E", "{}", text(`{"pg\u005flsn": "0/0"}`)), "headers", 42, `has the reserved key "pg_lsn"`},
		{"reserved key beside a nested value", nil,
			row("42", "order", "o-1", "E", "{}", text(`{"ctx": {"a": 1}, "event_type": "x"}`)), "headers", 42, `has the reserved key "event_type"`},
		{"missing required column",
			relation(outboxID, "public", "outbox", "id", "aggregate_type", "aggregate_id", "payload", "headers"),
			[]tv{text("42"), text("order"), text("o-1"), text("{}"), null}, "event_type", 42, "missing from the table"},
		{"missing id column",
			relation(outboxID, "public", "outbox", "aggregate_type", "aggregate_id", "event_type", "payload"),
			[]tv{text("order"), text("o-1"), text("E"), text("{}")}, "id", 0, "missing from the table"},
		{"unchanged TOAST payload", nil,
			[]tv{text("42"), text("order"), text("o-1"), text("E"), toast, null}, "payload", 42, "unchanged TOAST"},
		{"unchanged TOAST headers", nil,
			[]tv{text("42"), text("order"), text("o-1"), text("E"), text("{}"), toast}, "headers", 42, "unchanged TOAST"},
		{"binary aggregate_type", nil,
			[]tv{text("42"), bin("order"), text("o-1"), text("E"), text("{}"), null}, "aggregate_type", 42, "binary format"},
		{"binary id", nil,
			[]tv{bin("\x00\x00\x00\x2a"), text("order"), text("o-1"), text("E"), text("{}"), null}, "id", 0, "binary format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rel := tt.rel
			if rel == nil {
				rel = outboxRelation()
			}
			d, _ := decoder.New("public.outbox")
			msgs := [][]byte{begin(0x2000, 1), rel, insert(outboxID, tt.row...)}
			want := 1
			if tt.rel == nil { // a good row after the bad one must come out too
				msgs, want = append(msgs, insert(outboxID, row("43", "order", "o-2", "E", "{}", null)...)), 2
			}
			txns, at, err := feed(t, d, append(msgs, commit(0x2000, 0x2030)))
			if err != nil {
				t.Fatalf("Decode at message %d: %v; a bad row must not stop the stream", at, err)
			}
			if len(txns) != 1 || len(txns[0].Events) != want {
				t.Fatalf("got %d txns, want 1 with %d events (the bad row in its place, then the good one)", len(txns), want)
			}
			ev := txns[0].Events[0]
			if next := txns[0].Events[want-1]; want == 2 && (next.Err != nil || next.ID != 43) {
				t.Errorf("the row after the bad one: ID %d, Err %v; want 43 and no error", next.ID, next.Err)
			}
			re := ev.Err
			if re == nil {
				t.Fatalf("event %+v has no Err", ev)
			}
			if re.Table != "public.outbox" || re.Column != tt.column || re.ID != tt.id || re.LSN != lsnAt(2) ||
				ev.ID != tt.id || ev.LSN != lsnAt(2) {
				t.Errorf("RowError{Table: %q, Column: %q, ID: %d, LSN: %s}, Event{ID: %d}, want {public.outbox, %q, %d, %s}",
					re.Table, re.Column, re.ID, re.LSN, ev.ID, tt.column, tt.id, lsnAt(2))
			}
			idText := "id=?"
			if tt.id != 0 {
				idText = "id=" + strconv.FormatInt(tt.id, 10)
			}
			msg := re.Error()
			for _, want := range []string{"public.outbox", idText, "LSN " + lsnAt(2).String(), `column "` + tt.column + `"`, tt.reason} {
				if !strings.Contains(msg, want) {
					t.Errorf("Error() = %q, want it to contain %q", msg, want)
				}
			}
			if !strings.Contains(re.Reason, tt.reason) {
				t.Errorf("Reason = %q, want it to contain %q", re.Reason, tt.reason)
			}
		})
	}

	t.Run("missing column says what to do", func(t *testing.T) {
		t.Parallel()
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{
			begin(0x2000, 1),
			relation(outboxID, "public", "outbox", "id", "aggregate_type", "aggregate_id", "event_type"),
			insert(outboxID, text("42"), text("order"), text("o-1"), text("E")),
			commit(0x2000, 0x2030),
		})
		if err != nil || len(txns) != 1 || len(txns[0].Events) != 1 || txns[0].Events[0].Err == nil {
			t.Fatalf("want one poison event, got %v, %v", txns, err)
		}
		if msg := txns[0].Events[0].Err.Error(); !strings.Contains(msg, "restore the column") {
			t.Errorf("Error() = %v, want advice to restore the column", msg)
		}
	})

	t.Run("poison event keeps what it could read", func(t *testing.T) {
		t.Parallel()
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, row("42", "order", "o-1", "E", `{"a": 1}`, text(`[1]`))...), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 {
			t.Fatal(err)
		}
		ev := txns[0].Events[0]
		if ev.Err == nil || ev.AggregateType != "order" || ev.AggregateID != "o-1" || ev.EventType != "E" ||
			string(ev.Payload) != `{"a": 1}` || ev.Headers != nil {
			t.Errorf("poison event %+v, want the readable columns copied and no headers", ev)
		}
	})
}

func TestProtocolErrors(t *testing.T) {
	t.Parallel()
	good := insert(outboxID, row("1", "order", "o-1", "E", `{}`, null)...)
	badMarker := append([]byte(nil), good...)
	badMarker[5] = 'K'
	tooManyCols := outboxRelation()
	tooManyCols[1+4+len("public\x00outbox\x00")+1] = 0x40 // column count high byte

	tests := []struct {
		name string
		msgs [][]byte
		at   int
		text string
	}{
		{"empty walData", [][]byte{{}}, 0, "empty"},
		{"Begin inside a transaction", [][]byte{begin(0x2000, 1), begin(0x3000, 2)}, 1, "still open"},
		{"Commit outside a transaction", [][]byte{commit(0x2000, 0x2030)}, 0, "no transaction"},
		{"Insert outside a transaction", [][]byte{outboxRelation(), good}, 1, "no transaction"},
		{"Insert for an unknown relation", [][]byte{begin(0x2000, 1), good}, 1, "Relation message was never seen"},
		{"column count differs from the relation", [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, text("1"), text("order"), text("o-1"), text("E"), text(`{}`))}, 2, "5 columns"},
		{"unknown tuple data kind", [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, text("1"), text("order"), text("o-1"), text("E"), text(`{}`), tv{Kind: 'x'})}, 2, "kind 'x'"},
		{"other table's row malformed", [][]byte{begin(0x2000, 1), relation(ordersID, "public", "orders", "id"),
			insert(ordersID, tv{Kind: '?'})}, 2, "kind '?'"},
		{"Insert tuple marker", [][]byte{begin(0x2000, 1), outboxRelation(), badMarker}, 2, "tuple marker 'K'"},
		{"bytes after Begin", [][]byte{append(begin(0x2000, 1), 0)}, 0, "21 bytes"},
		{"bytes after Commit", [][]byte{begin(0x2000, 1), append(commit(0x2000, 0x2030), 0)}, 1, "26 bytes"},
		{"bytes after Relation", [][]byte{append(outboxRelation(), 0)}, 0, "after the columns"},
		{"bytes after Insert", [][]byte{begin(0x2000, 1), outboxRelation(), append(good, 0)}, 2, "after the tuple"},
		{"Relation column count too large", [][]byte{tooManyCols}, 0, "do not fit"},
		{"Insert text length too large", [][]byte{begin(0x2000, 1), outboxRelation(),
			func() []byte { b := append([]byte(nil), good...); b[9] = 0x7F; return b }()}, 2, "truncated in column 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, _ := decoder.New("public.outbox")
			_, at, err := feed(t, d, tt.msgs)
			if !errors.Is(err, decoder.ErrProtocol) {
				t.Fatalf("error %v, want one wrapping ErrProtocol", err)
			}
			if at != tt.at {
				t.Errorf("error at message %d, want %d", at, tt.at)
			}
			var re *decoder.RowError
			if errors.As(err, &re) {
				t.Error("a protocol error must not be a RowError")
			}
			for _, want := range []string{lsnAt(tt.at).String(), tt.text} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Error() = %q, want it to contain %q", err, want)
				}
			}
		})
	}
}

// validStream is a transaction using every message type the decoder parses,
// with rows of two tables.
func validStream() [][]byte {
	return [][]byte{
		begin(0x2000, 900),
		outboxRelation(),
		relation(ordersID, "public", "orders", "id", "total", "note"),
		insert(outboxID, row("1", "order", "o-1", "OrderCreated", `{"total": 10.5, "items": [1, 2]}`,
			text(`{"trace_id": "t-1", "n": 3, "o": {"a": [true, null]}}`))...),
		insert(ordersID, text("1"), text("10.50"), null),
		insert(outboxID, row("2", "order", "o-1", "OrderPaid", `{}`, null)...),
		commit(0x2000, 0x2030),
	}
}

// TestTruncatedMessages cuts each message of a valid stream at every length
// short of whole: decoding the cut message must fail with ErrProtocol, and
// never panic.
func TestTruncatedMessages(t *testing.T) {
	t.Parallel()
	msgs := validStream()
	cuts := 0
	for k, m := range msgs {
		for n := 0; n < len(m); n++ {
			d, _ := decoder.New("public.outbox")
			for i := 0; i < k; i++ {
				if _, err := d.Decode(lsnAt(i), msgs[i]); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			txn, err := d.Decode(lsnAt(k), m[:n])
			if !errors.Is(err, decoder.ErrProtocol) || txn != nil {
				t.Errorf("message %d (%q) cut to %d of %d bytes: Txn %v, error %v; want ErrProtocol",
					k, m[0], n, len(m), txn != nil, err)
			}
			cuts++
		}
	}
	t.Logf("%d cut points", cuts)
}

// A reserved key makes the row a bad row whose error names the key as the
// row spelled it and says what to do; other keys, however close, pass.
func TestReservedHeaderKeys(t *testing.T) {
	t.Parallel()
	long := "dlq." + strings.Repeat("x", 5000)
	tests := []struct {
		headers string
		key     string // the RowError's ReservedHeader; "" = no error
	}{
		{`{"event_id": "7", "aggregate_id": "victim"}`, "event_id"}, // jsonb order: the first one named
		{`{"EVENT_TYPE": "x"}`, "EVENT_TYPE"},
		{`{"trace": "t", "dlq.error": {"nested": true}}`, "dlq.error"},
		{`{"` + long + `": 1}`, long},
		{`{"dlq": "x", "dlqx": "x", "x-event_id": "7", "event_ids": "7", "trace_id": "t"}`, ""},
		{`{}`, ""},
	}
	for _, tt := range tests {
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, row("42", "order", "o-1", "E", "{}", text(tt.headers))...), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 || len(txns[0].Events) != 1 {
			t.Fatalf("%.60s: %v", tt.headers, err)
		}
		ev := txns[0].Events[0]
		if tt.key == "" {
			if ev.Err != nil {
				t.Errorf("%s: %v, want no error", tt.headers, ev.Err)
			}
			continue
		}
		if ev.Err == nil {
			t.Errorf("%.60s: no error, want the reserved key %.60q", tt.headers, tt.key)
			continue
		}
		if ev.Err.ReservedHeader != tt.key || ev.Headers != nil {
			t.Errorf("%.60s: Err %v (ReservedHeader %.60q), Headers %v; want the reserved key %.60q and no headers", tt.headers, ev.Err, ev.Err.ReservedHeader, ev.Headers, tt.key)
			continue
		}
		msg := ev.Err.Error()
		for _, want := range []string{"id=42", `column "headers"`, "rename the key", "event_id, event_type, aggregate_type, aggregate_id, pg_lsn"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Error() = %q, want it to contain %q", msg, want)
			}
		}
		if len(msg) > 1000 {
			t.Errorf("Error() is %d bytes: a long key must be cut", len(msg))
		}
	}
}
