package decoder_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/outboxschema/headernametest"
)

// eventVerdict is what the relay does with ev: publish it, or dead-letter
// it as a bad row/message or for a reserved header.
func eventVerdict(ev decoder.Event) headernametest.Verdict {
	switch {
	case ev.Err == nil:
		return headernametest.OK
	case ev.Err.ReservedHeader != "":
		return headernametest.Reserved
	}
	return headernametest.Bad
}

// The decoder judges header names by the one rule (CheckHeaderName): the
// same verdict on every case of headernametest for a row's headers column
// (first row and the next, which reuses the first's keys) and for a
// message event's envelope, and an error naming the key, quoted.
func TestHeaderNameRule(t *testing.T) {
	t.Parallel()
	for _, c := range headernametest.Cases {
		doc := headernametest.Headers(c.Name, "x")
		d, _ := decoder.New("public.outbox")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, row("42", "order", "o-1", "E", "{}", text(doc))...),
			insert(outboxID, row("43", "order", "o-1", "E", "{}", text(doc))...), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 || len(txns[0].Events) != 2 {
			t.Fatalf("%s: %v", doc, err)
		}
		for _, ev := range txns[0].Events {
			if got := eventVerdict(ev); got != c.Verdict {
				t.Errorf("row %d with headers %s: %s (%v), want %s", ev.ID, doc, got, ev.Err, c.Verdict)
				continue
			}
			if ev.Err == nil {
				if len(ev.Headers) != 1 || ev.Headers[0].Key != c.Name {
					t.Errorf("row %d with headers %s: headers %v, want the name as written", ev.ID, doc, ev.Headers)
				}
				continue
			}
			// The name as the relay read it (U+FFFD for bytes that are not UTF-8).
			read := strings.ToValidUTF8(c.Name, "\uFFFD")
			msg := ev.Err.Error()
			for _, want := range []string{"id=" + strconv.FormatInt(ev.ID, 10), `column "headers"`, strconv.Quote(read), "rename the key"} {
				if !strings.Contains(msg, want) {
					t.Errorf("row %d with headers %s: %q, want it to contain %q", ev.ID, doc, msg, want)
				}
			}
			if ev.Headers != nil {
				t.Errorf("row %d with headers %s: refused, yet Headers %v", ev.ID, doc, ev.Headers)
			}
		}

		txns, _ = decodeMsgs(t, msgPrefix, 0, [][]byte{begin(0x2000, 1), message(true, 0x1F00, msgPrefix, env("m-1", "o-1", "1", doc)), commit(0x2000, 0x2030)})
		if len(txns) != 1 || len(txns[0].Events) != 1 {
			t.Fatalf("message with headers %s: %d transactions", doc, len(txns))
		}
		ev := txns[0].Events[0]
		if got := eventVerdict(ev); got != c.Verdict {
			t.Errorf("message with headers %s: %s (%v), want %s", doc, got, ev.Err, c.Verdict)
		} else if ev.Err != nil && (ev.Err.Column != decoder.EnvelopeHeaders || !strings.Contains(ev.Err.Error(), "rename the key")) {
			t.Errorf("message with headers %s: %v, want the headers field and the fix", doc, ev.Err)
		}
	}
}

// With compat: debezium the relay sets id itself: a row or message may
// not use it, in any case, and a bad name stays bad.
func TestHeaderNameRuleExtraReserved(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]headernametest.Verdict{"ID": headernametest.Reserved, "id\t": headernametest.Bad, "idx": headernametest.OK} {
		d, err := decoder.NewMapped([]outboxschema.Mapping{outboxschema.DefaultMapping(outboxschema.Table{Schema: "public", Name: "outbox"})}, []string{"id"})
		if err != nil {
			t.Fatal(err)
		}
		d.SetMessagePrefix(msgPrefix, 0)
		doc := headernametest.Headers(name, "x")
		txns, _, err := feed(t, d, [][]byte{begin(0x2000, 1), outboxRelation(),
			insert(outboxID, row("42", "order", "o-1", "E", "{}", text(doc))...),
			message(true, 0x1F00, msgPrefix, env("m-1", "o-1", "1", doc)), commit(0x2000, 0x2030)})
		if err != nil || len(txns) != 1 || len(txns[0].Events) != 2 {
			t.Fatalf("%s: %v", doc, err)
		}
		for _, ev := range txns[0].Events {
			if got := eventVerdict(ev); got != want {
				t.Errorf("%v event with headers %s: %s (%v), want %s", ev.Source, doc, got, ev.Err, want)
			}
		}
	}
}
