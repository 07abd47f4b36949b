package outbox

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// The envelopes WriteMessage emits are what the relay's decoder reads:
// every field, the payload's text, the headers, a fresh UUIDv7 per event.
func TestMessageEnvelopesDecode(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	events := []Event{
		{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: json.RawMessage(`{"html": "<b>&amp;</b>", "n": 1.50}`),
			Headers: map[string]string{"tenant_id": "acme"}, SchemaVersion: 2},
		{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", Payload: struct {
			ID string `json:"id"`
		}{"o-1"}},
		{AggregateType: "user", AggregateID: "ü-ñ", EventType: "user.renamed", Payload: "just a string"},
	}
	now := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	envs, err := encodeMessages(WithTraceparent(context.Background(), tp), events, now)
	if err != nil {
		t.Fatal(err)
	}
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	d.SetMessagePrefix("orders-outbox", 1<<20)
	msgs := [][]byte{pg.Begin(0x2000, 7)}
	for _, e := range envs {
		msgs = append(msgs, pg.Message(true, 0x2000, "orders-outbox", e))
	}
	msgs = append(msgs, pg.Commit(0x2000, 0x2030))
	var txn *decoder.Txn
	for i, m := range msgs {
		if txn, err = d.Decode(pglogrepl.LSN(0x1000+i), m); err != nil {
			t.Fatal(err)
		}
	}
	if txn == nil || len(txn.Events) != 3 {
		t.Fatalf("decoded %v, want one transaction of 3 events", txn)
	}
	wantPayloads := []string{`{"html":"<b>&amp;</b>","n":1.50}`, `{"id":"o-1"}`, `"just a string"`}
	wantHeaders := []string{"schema_version=2 tenant_id=acme traceparent=" + tp, "traceparent=" + tp, "traceparent=" + tp}
	seen := map[string]bool{}
	for i, ev := range txn.Events {
		if ev.Err != nil {
			t.Fatalf("event %d refused: %v (envelope %s)", i, ev.Err, envs[i])
		}
		if ev.Source != decoder.SourceMessage || ev.AggregateType != events[i].AggregateType || ev.AggregateID != events[i].AggregateID || ev.EventType != events[i].EventType {
			t.Errorf("event %d: %+v", i, ev)
		}
		if !uuidV7.MatchString(ev.MessageID) || seen[ev.MessageID] {
			t.Errorf("event %d: id %q is not a fresh UUIDv7", i, ev.MessageID)
		}
		seen[ev.MessageID] = true
		if !strings.HasPrefix(ev.MessageID, "01a22f54-8d00-") { // 2026-12-01T02:00Z in Unix ms: 0x01a22f548d00
			t.Errorf("event %d: id %q does not start with the time", i, ev.MessageID)
		}
		if string(ev.Payload) != wantPayloads[i] {
			t.Errorf("event %d: payload %s, want %s", i, ev.Payload, wantPayloads[i])
		}
		var hs []string
		for _, h := range ev.Headers {
			hs = append(hs, h.Key+"="+string(h.Value))
		}
		if strings.Join(hs, " ") != wantHeaders[i] {
			t.Errorf("event %d: headers %q, want %q", i, hs, wantHeaders[i])
		}
	}
}

func TestWriteMessageValidation(t *testing.T) {
	ok := Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: json.RawMessage(`{}`)}
	bad := ok
	bad.Headers = map[string]string{"event_id": "x"}
	tests := []struct {
		name, prefix string
		tx           any
		events       []Event
		err          string
	}{
		{"empty prefix", "", nil, []Event{ok}, "message prefix is empty"},
		{"heartbeat prefix", "outbox-relay/outbox_relay", nil, []Event{ok}, "heartbeat namespace"},
		{"heartbeat namespace", "outbox-relay", nil, []Event{ok}, "heartbeat namespace"},
		{"control character", "a\nb", nil, []Event{ok}, "without control characters"},
		{"invalid event", "orders-outbox", nil, []Event{ok, bad}, `event 1: Headers: header name "event_id" is reserved`},
		{"empty aggregate id", "orders-outbox", nil, []Event{{AggregateType: "o", EventType: "e", Payload: 1}}, "event 0: AggregateID is empty"},
		{"not a transaction", "orders-outbox", "tx", []Event{ok}, "pgx.Tx or *sql.Tx"},
		{"nil", "orders-outbox", nil, []Event{ok}, "pgx.Tx or *sql.Tx"},
		{"nil *sql.Tx", "orders-outbox", (*struct{})(nil), nil, "pgx.Tx or *sql.Tx"},
	}
	for _, tt := range tests {
		err := WriteMessage(context.Background(), tt.tx, tt.prefix, tt.events...)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.err)
		}
	}
}
