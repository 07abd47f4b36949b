package record

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

const testUUID = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b"

func headerList(hs []sink.Header) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(string(h.Key) + "=" + string(h.Value) + ";")
	}
	return b.String()
}

// The own record's event_id is the event's identity, the row id goes in
// outbox_id, a dlq replay copy and a replay are marked; the dead letter of
// any of them keeps the relay's headers apart from the row's.
func TestOwnRecordIdentity(t *testing.T) {
	at := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	row := []decoder.Header{{Key: "trace", Value: []byte("t-1")}}
	const base = "event_type=E;aggregate_type=order;aggregate_id=o-1;pg_lsn=0/1;"
	for _, tt := range []struct {
		name string
		ev   decoder.Event
		mark string // replay's outbox_replay
		want string // the headers
	}{
		{name: "uuid", ev: decoder.Event{ID: 7, EventID: testUUID},
			want: "event_id=" + testUUID + ";" + base + "outbox_id=7;trace=t-1;"},
		{name: "NULL event_id: the numeric id", ev: decoder.Event{ID: 7},
			want: "event_id=7;" + base + "outbox_id=7;trace=t-1;"},
		{name: "dlq replay copy of a row with event_id", ev: decoder.Event{ID: 9, EventID: testUUID, ReplayOf: 7},
			want: "event_id=" + testUUID + ";" + base + "outbox_id=9;outbox_replayed_from=dlq;trace=t-1;"},
		{name: "dlq replay copy of a row without event_id", ev: decoder.Event{ID: 9, ReplayOf: 7},
			want: "event_id=7;" + base + "outbox_id=9;outbox_replayed_from=dlq;trace=t-1;"},
		{name: "replay", ev: decoder.Event{ID: 7, EventID: testUUID}, mark: "2026-05-06T07:00:00Z",
			want: "event_id=" + testUUID + ";" + base + "outbox_id=7;outbox_replay=2026-05-06T07:00:00Z;trace=t-1;"},
		{name: "mapped table with a text id: unchanged", ev: decoder.Event{IDText: "ev-1"},
			want: "event_id=ev-1;" + base + "trace=t-1;"},
		{name: "message event", ev: decoder.Event{Source: decoder.SourceMessage, MessageID: testUUID},
			want: "event_id=" + testUUID + ";" + base + "trace=t-1;"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.ev
			ev.AggregateType, ev.AggregateID, ev.EventType, ev.Headers = "order", "o-1", "E", row
			var m sink.Message
			if tt.mark == "" {
				m = Own(&ev, "0/1", at)
				// The slab path gives the same record.
				var s sink.Message
				To(&s, newSlab([]decoder.Event{ev}, "0/1"), &ev, "0/1", at)
				if headerList(s.Headers) != headerList(m.Headers) {
					t.Errorf("To from a slab: %s, Own: %s", headerList(s.Headers), headerList(m.Headers))
				}
			} else {
				m = Replayed(&ev, "0/1", at, tt.mark)
			}
			if got := headerList(m.Headers); got != tt.want {
				t.Errorf("headers\n got %s\nwant %s", got, tt.want)
			}
			_, l := RowLetter("public.outbox", Policy{Topic: "dlq"}, ev.ID, ev.IDText, 0, m, "bad_row", 1, errors.New("x"), at)
			if len(l.RowHeaders) != 1 || string(l.RowHeaders[0].Key) != "trace" || len(l.Headers) != len(m.Headers)-1 {
				t.Errorf("dead letter split: own %s row %s", headerList(l.Headers), headerList(l.RowHeaders))
			}
		})
	}
}

// A Debezium-format record keeps its id column as id: its mapping has no
// identity columns, and no outbox_id is added.
func TestDebeziumIdentityIsTheIDColumn(t *testing.T) {
	m := Debezium(&decoder.Event{ID: 42, AggregateID: "k"}, time.Time{})
	if headerList(m.Headers) != "id=42;" {
		t.Errorf("headers %s", headerList(m.Headers))
	}
}
