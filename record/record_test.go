package record

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The record compat: debezium writes: key, value (nil stays nil: a null
// value), header id first and alone but for the row's headers and placements.
func TestDebeziumRecord(t *testing.T) {
	at := time.Unix(1700000000, 0)
	for _, tt := range []struct {
		name    string
		ev      decoder.Event
		headers string
	}{
		{name: "uuid id", ev: decoder.Event{IDText: "8b1d3a4e-0000-4000-8000-000000000001", AggregateID: "o-1", Payload: []byte(`{"a": 1}`)},
			headers: "id=8b1d3a4e-0000-4000-8000-000000000001;"},
		{name: "bigint id, placements, null value", ev: decoder.Event{ID: 42, AggregateID: "o-1",
			Headers: []decoder.Header{{Key: "eventType", Value: []byte("Created")}, {Key: "trace", Value: nil}}},
			headers: "id=42;eventType=Created;trace=<null>;"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := Debezium(&tt.ev, at)
			if string(m.Key) != tt.ev.AggregateID || (m.Value == nil) != (tt.ev.Payload == nil) || string(m.Value) != string(tt.ev.Payload) || !m.Timestamp.Equal(at) {
				t.Errorf("record key %q value %q, want %q %q", m.Key, m.Value, tt.ev.AggregateID, tt.ev.Payload)
			}
			var b strings.Builder
			for _, h := range m.Headers {
				v := string(h.Value)
				if h.Value == nil {
					v = "<null>"
				}
				b.WriteString(string(h.Key) + "=" + v + ";")
			}
			if b.String() != tt.headers {
				t.Errorf("headers %s, want %s", b.String(), tt.headers)
			}
			// The dead letter of such a record keeps id as the relay's own
			// header and the rest as the row's.
			dl, l := RowLetter("public.outbox", Policy{Topic: "dlq", Format: FormatDebezium}, tt.ev.ID, tt.ev.IDText, 0, m, "bad_row", 1, errors.New("x"), at)
			wantID := tt.ev.IDText
			if wantID == "" {
				wantID = "42"
			}
			for _, h := range dl.Headers {
				if string(h.Key) == "dlq.event_id" && string(h.Value) != wantID {
					t.Errorf("dlq.event_id %q, want %q", h.Value, wantID)
				}
			}
			if len(l.Headers) != 1 || string(l.Headers[0].Key) != "id" || len(l.RowHeaders) != len(tt.ev.Headers) {
				t.Errorf("dead letter split %d own + %d row headers, want 1 + %d", len(l.Headers), len(l.RowHeaders), len(tt.ev.Headers))
			}
		})
	}
	// The relay's own record of a text id: event_id is the text.
	m := Own(&decoder.Event{IDText: "ev-1", AggregateID: "k"}, "0/1", at)
	if string(m.Headers[0].Key) != "event_id" || string(m.Headers[0].Value) != "ev-1" {
		t.Errorf("own record of a text id: first header %s=%s", m.Headers[0].Key, m.Headers[0].Value)
	}
}
