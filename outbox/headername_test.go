package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/outboxschema/headernametest"
)

// writerVerdict is what Write (and WriteMessage: the same encode) does with
// an event whose Headers hold name.
func writerVerdict(t testing.TB, name string) headernametest.Verdict {
	e := Event{AggregateType: "order", AggregateID: "o-1", EventType: "E", Payload: json.RawMessage(`{}`), Headers: map[string]string{name: "x"}}
	_, err := encode(context.Background(), []Event{e})
	_, merr := encodeMessages(context.Background(), []Event{e}, time.Now())
	if (err == nil) != (merr == nil) {
		t.Fatalf("header name %q: Write says %v, WriteMessage %v", name, err, merr)
	}
	if err == nil {
		return headernametest.OK
	}
	var he *outboxschema.HeaderNameError
	if !errors.As(err, &he) {
		t.Fatalf("header name %q: %v does not wrap a *HeaderNameError", name, err)
	}
	if he.Reserved != "" {
		return headernametest.Reserved
	}
	return headernametest.Bad
}

// relayVerdict is what the relay's decoder does with a row, and with a
// message event, whose headers are {name: "x"} as PostgreSQL stores them.
func relayVerdict(t testing.TB, name string) headernametest.Verdict {
	doc := headernametest.Headers(name, "x")
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "orders-outbox"
	d.SetMessagePrefix(prefix, 0)
	env, _ := json.Marshal(envelope{ID: "m-1", AggregateType: "order", AggregateID: "o-1", EventType: "E",
		Payload: json.RawMessage(`{}`), Headers: json.RawMessage(doc)})
	var evs []decoder.Event
	for i, m := range [][]byte{pg.Begin(0x2000, 1), pg.OutboxRelation(),
		pg.Insert(pg.OutboxID, pg.Row("42", "order", "o-1", "E", "{}", pg.Text(doc))...),
		pg.Message(true, 0x1F00, prefix, string(env)), pg.Commit(0x2000, 0x2030)} {
		txn, err := d.Decode(pglogrepl.LSN(0x1000+0x28*i), m)
		if err != nil {
			t.Fatalf("headers %s: %v", doc, err)
		}
		if txn != nil {
			evs = txn.Events
		}
	}
	if len(evs) != 2 {
		t.Fatalf("headers %s: %d events, want the row's and the message's", doc, len(evs))
	}
	var v [2]headernametest.Verdict
	for i, ev := range evs {
		switch {
		case ev.Err == nil:
			v[i] = headernametest.OK
		case ev.Err.ReservedHeader != "":
			v[i] = headernametest.Reserved
		default:
			v[i] = headernametest.Bad
		}
	}
	if v[0] != v[1] {
		t.Fatalf("headers %s: the row is %s (%v), the message %s (%v)", doc, v[0], evs[0].Err, v[1], evs[1].Err)
	}
	return v[0]
}

// Write, WriteMessage and the relay give every case of headernametest its
// verdict: what the relay would dead-letter, the writer refuses, and
// nothing else.
func TestHeaderNameRuleMatchesRelay(t *testing.T) {
	for _, c := range headernametest.Cases {
		if got := writerVerdict(t, c.Name); got != c.Verdict {
			t.Errorf("Write with header name %q: %s, want %s", c.Name, got, c.Verdict)
		}
		if got := relayVerdict(t, c.Name); got != c.Verdict {
			t.Errorf("relay with header name %q: %s, want %s", c.Name, got, c.Verdict)
		}
	}
}

// FuzzHeaderNameRelayMatchesWriter: for any name, the relay's verdict on
// a row (and a message) carrying it equals outbox.Write's.
func FuzzHeaderNameRelayMatchesWriter(f *testing.F) {
	for _, c := range headernametest.Cases {
		f.Add(c.Name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if w, r := writerVerdict(t, name), relayVerdict(t, name); w != r {
			t.Fatalf("header name %q: Write says %s, the relay %s", name, w, r)
		}
	})
}
