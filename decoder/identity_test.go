package decoder_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

const testUUID = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b"

// The identity of a row of the relay's own table (migration 0006): its
// event_id column when not NULL, else the dlq_replay_of of a dlq replay
// copy, else its id. A column that is not of the identity's type, or a
// mapped table's, is not read.
func TestEventIdentity(t *testing.T) {
	t.Parallel()
	typed := func(eventIDOID uint32) []byte {
		return pt.RelationTyped(outboxID, "public", "outbox",
			pt.TypedCol{Name: "id", OID: pt.OIDInt8}, pt.TypedCol{Name: "aggregate_type", OID: pt.OIDText},
			pt.TypedCol{Name: "aggregate_id", OID: pt.OIDText}, pt.TypedCol{Name: "event_type", OID: pt.OIDText},
			pt.TypedCol{Name: "payload", OID: pt.OIDJSONB}, pt.TypedCol{Name: "headers", OID: pt.OIDJSONB},
			pt.TypedCol{Name: "event_id", OID: eventIDOID}, pt.TypedCol{Name: "dlq_replay_of", OID: pt.OIDInt8})
	}
	mapped := outboxschema.DefaultMapping(outboxschema.Table{Schema: "public", Name: "outbox"})
	mapped.EventID, mapped.ReplayOf = "", "" // as relay.Outboxes leaves a configured columns.* mapping
	tests := []struct {
		name     string
		maps     []outboxschema.Mapping // nil: New("public.outbox")
		rel      []byte
		cols     []tv
		eventID  string
		replayOf int64
		kind     decoder.IdentityKind
		identity string
		errCol   string // the RowError's column; "" = no error
	}{
		{name: "uuid", rel: pt.IdentityRelation(), cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, text(testUUID), null),
			eventID: testUUID, kind: decoder.IdentityEventID, identity: testUUID},
		{name: "NULL: a row older than the migration keeps its id", rel: pt.IdentityRelation(), cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, null, null),
			kind: decoder.IdentityID, identity: "7"},
		{name: "table not migrated", rel: outboxRelation(), cols: row("7", "order", "o-1", "E", "{}", null),
			kind: decoder.IdentityID, identity: "7"},
		{name: "dlq replay copy of a row with event_id", rel: pt.IdentityRelation(), cols: pt.IdentityRow("9", "order", "o-1", "E", "{}", null, text(testUUID), text("7")),
			eventID: testUUID, replayOf: 7, kind: decoder.IdentityEventID, identity: testUUID},
		{name: "dlq replay copy of a row without event_id", rel: pt.IdentityRelation(), cols: pt.IdentityRow("9", "order", "o-1", "E", "{}", null, null, text("7")),
			replayOf: 7, kind: decoder.IdentityReplayOf, identity: "7"},
		{name: "event_id not a uuid column: not read", rel: typed(pt.OIDText), cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, text("forged"), null),
			kind: decoder.IdentityID, identity: "7"},
		{name: "mapped table keeps its id column", maps: []outboxschema.Mapping{mapped}, rel: pt.IdentityRelation(),
			cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, text(testUUID), text("3")), kind: decoder.IdentityID, identity: "7"},
		{name: "event_id of the wrong length", rel: pt.IdentityRelation(), cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, text("abc"), null),
			errCol: "event_id"},
		{name: "dlq_replay_of not positive", rel: pt.IdentityRelation(), cols: pt.IdentityRow("7", "order", "o-1", "E", "{}", null, null, text("0")),
			errCol: "dlq_replay_of"},
		{name: "a poison row keeps its identity", rel: pt.IdentityRelation(), cols: pt.IdentityRow("7", "order", "", "E", "{}", null, text(testUUID), null),
			eventID: testUUID, kind: decoder.IdentityEventID, identity: testUUID, errCol: "aggregate_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d *decoder.Decoder
			var err error
			if tt.maps == nil {
				d, err = decoder.New("public.outbox")
			} else {
				d, err = decoder.NewMapped(tt.maps, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Two rows in one transaction: the handout shares one string
			// for their keys and event ids, which must not mix them up.
			txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), tt.rel, insert(outboxID, tt.cols...),
				insert(outboxID, pt.IdentityRow("8", "order", "o-2", "E", "{}", null, text(strings.Repeat("f", 36)), null)[:len(tt.cols)]...),
				commit(0x2000, 0x2030)})
			if err != nil || len(txns) != 1 || len(txns[0].Events) != 2 {
				t.Fatalf("decode: %v %+v", err, txns)
			}
			ev := txns[0].Events[0]
			if tt.errCol != "" {
				if ev.Err == nil || ev.Err.Column != tt.errCol {
					t.Fatalf("Err %v, want one about column %s", ev.Err, tt.errCol)
				}
				if tt.eventID == "" {
					return
				}
			} else if ev.Err != nil {
				t.Fatalf("Err %v", ev.Err)
			}
			if ev.EventID != tt.eventID || ev.ReplayOf != tt.replayOf || ev.ID != 7 && ev.ID != 9 {
				t.Errorf("EventID %q ReplayOf %d ID %d, want %q %d", ev.EventID, ev.ReplayOf, ev.ID, tt.eventID, tt.replayOf)
			}
			if k, id := ev.Identity(), string(ev.AppendIdentity(nil)); k != tt.kind || id != tt.identity {
				t.Errorf("identity %d %q, want %d %q", k, id, tt.kind, tt.identity)
			}
			if next := txns[0].Events[1]; next.AggregateID != "o-2" || next.Err != nil {
				t.Errorf("the next event: %+v", next)
			}
		})
	}
}

// Row reads the identity columns as Decode does, so replay republishes a
// row under the identity the relay streamed it with.
func TestRowIdentityMatchesDecode(t *testing.T) {
	t.Parallel()
	for _, c := range [][2]tv{{text(testUUID), null}, {null, null}, {null, text("41")}, {text(testUUID), text("41")}, {text("short"), null}} {
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), pt.IdentityRelation(),
			insert(outboxID, pt.IdentityRow("7", "order", "o-1", "E", "{}", null, c[0], c[1])...), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 {
			t.Fatal(err)
		}
		want := txns[0].Events[0]
		val := func(x tv) []byte {
			if x.Kind == 'n' {
				return nil
			}
			return []byte(x.Data)
		}
		r, _ := decoder.New("public.outbox")
		got := r.Row(decoder.RowText{ID: []byte("7"), AggregateType: []byte("order"), AggregateID: []byte("o-1"), EventType: []byte("E"),
			Payload: []byte("{}"), EventID: val(c[0]), ReplayOf: val(c[1])}, want.LSN)
		if got.EventID != want.EventID || got.ReplayOf != want.ReplayOf || (got.Err == nil) != (want.Err == nil) {
			t.Errorf("%v: Row %q %d %v, Decode %q %d %v", c, got.EventID, got.ReplayOf, got.Err, want.EventID, want.ReplayOf, want.Err)
		}
	}
}

// The identity's headers are reserved: a row's headers column cannot
// forge outbox_id or the replay marks.
func TestIdentityHeadersReserved(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"outbox_id", "Outbox_ID", "outbox_replayed_from", "outbox_replay"} {
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), pt.IdentityRelation(),
			insert(outboxID, pt.IdentityRow("42", "order", "o-1", "E", "{}", text(`{"`+key+`": "1"}`), text(testUUID), null)...), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 {
			t.Fatal(err)
		}
		ev := txns[0].Events[0]
		if ev.Err == nil || ev.Err.ReservedHeader != key || !strings.Contains(ev.Err.Error(), "outbox_id") {
			t.Errorf("headers key %s: Err %v, want it refused as reserved", key, ev.Err)
		}
		if ev.EventID != testUUID {
			t.Errorf("headers key %s: the poison row lost its event_id: %q", key, ev.EventID)
		}
	}
}
