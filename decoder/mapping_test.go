package decoder_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func tcol(name string, oid uint32) pgoutputtest.TypedCol {
	return pgoutputtest.TypedCol{Name: name, OID: oid}
}

var (
	tbl      = outboxschema.Table{Schema: "public", Name: "outbox"}
	dbzCols  = []pgoutputtest.TypedCol{tcol("id", pgoutputtest.OIDUUID), tcol("aggregatetype", pgoutputtest.OIDText), tcol("aggregateid", pgoutputtest.OIDText), tcol("type", pgoutputtest.OIDText), tcol("payload", pgoutputtest.OIDJSONB)}
	uuidText = "8b1d3a4e-0000-4000-8000-000000000001"
)

func dbzRow(id, aggType, aggID, typ string, payload tv) []tv {
	return []tv{text(id), text(aggType), text(aggID), text(typ), payload}
}

// decodeOne feeds a relation and one insert in a transaction to a decoder
// for maps and returns the event.
func decodeOne(t *testing.T, maps []outboxschema.Mapping, reserved []string, rel []byte, relID uint32, cols []tv) decoder.Event {
	t.Helper()
	d, err := decoder.NewMapped(maps, reserved)
	if err != nil {
		t.Fatal(err)
	}
	txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), rel, insert(relID, cols...), commit(0x2000, 0x2030)})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if len(txns) != 1 || len(txns[0].Events) != 1 {
		t.Fatalf("got %d txns, want 1 with 1 event", len(txns))
	}
	return txns[0].Events[0]
}

func headerText(ev decoder.Event) string {
	var b strings.Builder
	for _, h := range ev.Headers {
		v := "<null>"
		if h.Value != nil {
			v = fmt.Sprintf("%q", h.Value)
		}
		fmt.Fprintf(&b, "%s=%s;", h.Key, v)
	}
	return b.String()
}

func TestDecodeMapped(t *testing.T) {
	dbz := outboxschema.DebeziumMapping(tbl)
	dbzRel := pgoutputtest.RelationTyped(outboxID, "public", "outbox", dbzCols...)
	withExtra := dbz
	withExtra.Additional = []outboxschema.Placement{{Column: "type", Header: "eventType"}, {Column: "trace", Header: "trace"}, {Column: "id", Header: "x-id"}}
	extraRel := pgoutputtest.RelationTyped(outboxID, "public", "outbox", append(dbzCols, tcol("trace", pgoutputtest.OIDText))...)
	noTomb := dbz
	noTomb.TombstoneOnNull = false
	bigint := outboxschema.Mapping{Table: tbl, ID: "event_no", Key: "tenant", Payload: "body", RouteBy: "stream"}
	bigRel := func(idOID, payloadOID uint32) []byte {
		return pgoutputtest.RelationTyped(outboxID, "public", "outbox", tcol("tenant", pgoutputtest.OIDInt8), tcol("body", payloadOID), tcol("event_no", idOID), tcol("stream", pgoutputtest.OIDText))
	}
	withHeaders := dbz
	withHeaders.Headers = "meta"
	headersRel := pgoutputtest.RelationTyped(outboxID, "public", "outbox", append(dbzCols, tcol("meta", pgoutputtest.OIDJSONB))...)
	sameCol := outboxschema.Mapping{Table: tbl, ID: "id", Key: "id", Payload: "payload", RouteBy: "id", Additional: []outboxschema.Placement{{Column: "id", Header: "x"}}}
	huge := strings.Repeat("h", 1<<20)

	tests := []struct {
		name     string
		m        outboxschema.Mapping
		reserved []string
		rel      []byte
		cols     []tv
		// want, when err is "": the event's fields
		id                             int64
		idText, key, route, typ, value string
		nullValue                      bool
		headers                        string
		err                            string // substring of Event.Err, "" for a good row
	}{
		{name: "debezium table", m: dbz, rel: dbzRel, cols: dbzRow(uuidText, "order", "o-1", "Created", text(`{"a": 1}`)),
			idText: uuidText, key: "o-1", route: "order", typ: "Created", value: `{"a": 1}`},
		{name: "debezium NULL payload is a null value", m: dbz, rel: dbzRel, cols: dbzRow(uuidText, "order", "o-1", "Deleted", null),
			idText: uuidText, key: "o-1", route: "order", typ: "Deleted", nullValue: true},
		{name: "NULL payload without tombstones is poison", m: noTomb, rel: dbzRel, cols: dbzRow(uuidText, "order", "o-1", "Deleted", null),
			err: `outbox row public.outbox id="` + uuidText + `" at LSN 0/16B3F50: column "payload": is NULL`},
		{name: "NULL key is poison naming the key column", m: dbz, rel: dbzRel, cols: []tv{text(uuidText), text("order"), null, text("Created"), text(`{}`)},
			err: `column "aggregateid": is NULL`},
		{name: "empty key is poison", m: dbz, rel: dbzRel, cols: dbzRow(uuidText, "order", "", "Created", text(`{}`)),
			err: `column "aggregateid": is empty`},
		{name: "empty text id is poison", m: dbz, rel: dbzRel, cols: dbzRow("", "order", "o-1", "Created", text(`{}`)),
			err: `column "id": is empty`},
		{name: "NULL uuid id is poison", m: dbz, rel: dbzRel, cols: []tv{null, text("order"), text("o-1"), text("C"), text(`{}`)},
			err: `column "id": is NULL`},
		{name: "placements in order, NULL as a null header value", m: withExtra, rel: extraRel,
			cols:   append(dbzRow(uuidText, "order", "o-1", "Created", text(`{}`)), null),
			idText: uuidText, key: "o-1", route: "order", typ: "Created", value: `{}`,
			headers: `eventType="Created";trace=<null>;x-id="` + uuidText + `";`},
		{name: "huge placement value carried whole", m: withExtra, rel: extraRel,
			cols:   append(dbzRow(uuidText, "order", "o-1", "Created", text(`{}`)), text(huge)),
			idText: uuidText, key: "o-1", route: "order", typ: "Created", value: `{}`,
			headers: `eventType="Created";trace="` + huge + `";x-id="` + uuidText + `";`},
		{name: "bigint id in another column, key from a bigint, bytea payload raw", m: bigint, rel: bigRel(pgoutputtest.OIDInt8, pgoutputtest.OIDBytea),
			cols: []tv{text("42"), text(`\x00ff5c78`), text("9001"), text("billing")},
			id:   9001, key: "42", route: "billing", value: "\x00\xff\\x"},
		{name: "integer id", m: bigint, rel: bigRel(pgoutputtest.OIDInt4, pgoutputtest.OIDText),
			cols: []tv{text("42"), text(`plain`), text("7"), text("billing")}, id: 7, key: "42", route: "billing", value: "plain"},
		{name: "bigint id that is not an integer", m: bigint, rel: bigRel(pgoutputtest.OIDInt8, pgoutputtest.OIDText),
			cols: []tv{text("42"), text(`x`), text("1e3"), text("billing")}, err: `column "event_no": "1e3" is not a 64-bit integer`},
		{name: "bytea payload in escape format", m: bigint, rel: bigRel(pgoutputtest.OIDInt8, pgoutputtest.OIDBytea),
			cols: []tv{text("42"), text(`abc\000`), text("1"), text("billing")}, err: `column "body": is bytea in escape format`},
		{name: "bytea payload with bad hex", m: bigint, rel: bigRel(pgoutputtest.OIDInt8, pgoutputtest.OIDBytea),
			cols: []tv{text("42"), text(`\xZZ`), text("1"), text("billing")}, err: `column "body": is not valid bytea hex text`},
		{name: "text id of a table whose id is text", m: bigint, rel: bigRel(pgoutputtest.OIDText, pgoutputtest.OIDJSON),
			cols: []tv{text("42"), text(`{ "a" : 1 }`), text("ev-9"), text("billing")}, idText: "ev-9", key: "42", route: "billing", value: `{ "a" : 1 }`},
		{name: "missing mapped column names the key", m: bigint, rel: pgoutputtest.RelationTyped(outboxID, "public", "outbox", tcol("body", 25), tcol("event_no", 20), tcol("stream", 25)),
			cols: []tv{text("x"), text("1"), text("s")}, err: `column "tenant": is missing from the table (columns.key)`},
		{name: "headers column key event_id is reserved", m: withHeaders, rel: headersRel,
			cols: append(dbzRow(uuidText, "order", "o-1", "C", text(`{}`)), text(`{"event_id": "forged"}`)), err: `has the reserved key "event_id"`},
		{name: "headers column key ID is reserved with compat", m: withHeaders, reserved: []string{"id"}, rel: headersRel,
			cols: append(dbzRow(uuidText, "order", "o-1", "C", text(`{}`)), text(`{"ID": "forged"}`)), err: `has the reserved key "ID"`},
		{name: "headers column key id is free without compat", m: withHeaders, rel: headersRel,
			cols:   append(dbzRow(uuidText, "order", "o-1", "C", text(`{}`)), text(`{"id": "mine", "t": 1}`)),
			idText: uuidText, key: "o-1", route: "order", typ: "C", value: `{}`, headers: `id="mine";t="1";`},
		{name: "one column in several roles", m: sameCol, rel: pgoutputtest.RelationTyped(outboxID, "public", "outbox", tcol("id", 20), tcol("payload", 3802)),
			cols: []tv{text("5"), text(`{}`)}, id: 5, key: "5", route: "5", value: `{}`, headers: `x="5";`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := decodeOne(t, []outboxschema.Mapping{tt.m}, tt.reserved, tt.rel, outboxID, tt.cols)
			if tt.err != "" {
				if ev.Err == nil || !strings.Contains(ev.Err.Error(), tt.err) {
					t.Fatalf("Err = %v, want one containing %q", ev.Err, tt.err)
				}
				return
			}
			if ev.Err != nil {
				t.Fatalf("Err = %v", ev.Err)
			}
			if ev.ID != tt.id || ev.IDText != tt.idText || ev.AggregateID != tt.key || ev.AggregateType != tt.route || ev.EventType != tt.typ {
				t.Errorf("event id=%d idText=%q key=%q route=%q type=%q, want %d %q %q %q %q", ev.ID, ev.IDText, ev.AggregateID, ev.AggregateType, ev.EventType,
					tt.id, tt.idText, tt.key, tt.route, tt.typ)
			}
			if tt.nullValue != (ev.Payload == nil) || !bytes.Equal(ev.Payload, []byte(tt.value)) {
				t.Errorf("payload %q (nil %v), want %q (nil %v)", ev.Payload, ev.Payload == nil, tt.value, tt.nullValue)
			}
			if got := headerText(ev); got != tt.headers {
				if len(got) > 200 {
					got = got[:200] + "..."
				}
				t.Errorf("headers %s, want %.200s", got, tt.headers)
			}
			if ev.Schema != "public" || ev.Table != "outbox" || ev.TableIndex != 0 {
				t.Errorf("source %s.%s #%d, want public.outbox #0", ev.Schema, ev.Table, ev.TableIndex)
			}
		})
	}
}

// Several tables: each row is read through its own table's mapping and
// carries its table; a table not listed is another table.
func TestDecodeSeveralTables(t *testing.T) {
	a := outboxschema.DefaultMapping(outboxschema.Table{Schema: "billing", Name: "outbox"})
	b := outboxschema.Mapping{Table: outboxschema.Table{Schema: "orders", Name: "events"}, ID: "ref", Key: "customer", Payload: "body"}
	d, err := decoder.NewMapped([]outboxschema.Mapping{a, b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	txns, _, err := feed(t, d, [][]byte{
		begin(0x2000, 1),
		relation(1, "billing", "outbox", outboxCols...),
		pgoutputtest.RelationTyped(2, "orders", "events", tcol("ref", 25), tcol("customer", 25), tcol("body", 25)),
		relation(3, "public", "outbox", outboxCols...), // not listed
		insert(2, text("r-1"), text("c-1"), text("b1")),
		insert(1, row("7", "invoice", "c-1", "Issued", `{}`, null)...),
		insert(3, row("8", "invoice", "c-1", "Issued", `{}`, null)...),
		commit(0x2000, 0x2030),
	})
	if err != nil {
		t.Fatal(err)
	}
	evs := txns[0].Events
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	if e := evs[0]; e.Schema != "orders" || e.Table != "events" || e.TableIndex != 1 || e.IDText != "r-1" || e.AggregateID != "c-1" || string(e.Payload) != "b1" {
		t.Errorf("first event %+v, want orders.events r-1", e)
	}
	if e := evs[1]; e.Schema != "billing" || e.Table != "outbox" || e.TableIndex != 0 || e.ID != 7 || e.AggregateType != "invoice" {
		t.Errorf("second event %+v, want billing.outbox 7", e)
	}
	if c := d.Counts(); c.OtherTableRows != 1 {
		t.Errorf("OtherTableRows = %d, want 1", c.OtherTableRows)
	}
}

// FuzzDecodeMapped decodes arbitrary message sequences through a mapping
// with a text id, a bytea payload, placements and tombstones: no panic,
// errors only for the byte stream, and every event either poison or with a
// non-empty key, its table set and no reserved header key.
func FuzzDecodeMapped(f *testing.F) {
	m := outboxschema.Mapping{Table: tbl, ID: "ref", Key: "k", Payload: "body", RouteBy: "r", Type: "t", Headers: "h",
		Additional: []outboxschema.Placement{{Column: "t", Header: "type"}, {Column: "x", Header: "x-x"}}, TombstoneOnNull: true}
	rel := pgoutputtest.RelationTyped(outboxID, "public", "outbox", tcol("ref", pgoutputtest.OIDText), tcol("k", pgoutputtest.OIDInt8),
		tcol("body", pgoutputtest.OIDBytea), tcol("r", 25), tcol("t", 25), tcol("h", pgoutputtest.OIDJSONB), tcol("x", 25))
	f.Add(frame(begin(0x2000, 1), rel,
		insert(outboxID, text("a"), text("1"), text(`\x00ff`), text("order"), text("E"), text(`{"id": "x", "z": 1}`), null),
		insert(outboxID, text("b"), null, null, text("order"), text("E"), null, text("v")),
		insert(outboxID, text(""), text("1"), text(`\xzz`), text("order"), text("E"), text(`{"event_id": "x"}`), toast),
		commit(0x2000, 0x2030)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decoder.NewMapped([]outboxschema.Mapping{m}, []string{"id"})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for i, msg := range unframe(data) {
			txn, err := d.Decode(lsnAt(i), msg)
			if err != nil {
				if !errors.Is(err, decoder.ErrProtocol) && !errors.Is(err, decoder.ErrSpill) {
					t.Fatalf("message %d: error %v does not wrap ErrProtocol", i, err)
				}
				continue
			}
			if txn == nil {
				continue
			}
			for _, ev := range txn.Events {
				if ev.Err != nil {
					continue
				}
				if ev.AggregateID == "" || ev.Table != "outbox" || ev.IDText == "" {
					t.Fatalf("event %+v: empty key, id or table without Err", ev)
				}
				for _, h := range ev.Headers {
					if outboxschema.ReservedHeader(h.Key) || strings.EqualFold(h.Key, "id") {
						t.Fatalf("event with reserved header %q", h.Key)
					}
				}
			}
		}
	})
}
