package decoder

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// envelopeRef is the envelope decode without scanEnvelope: the bounds,
// then encoding/json alone (envelopeJSON, the decode before the scan and
// still the one that words every refusal). The fuzz test holds envelope
// to it.
func (d *Decoder) envelopeRef(lsn pglogrepl.LSN, content []byte) Event {
	if ev, bad := d.envelopeBounds(lsn, content); bad {
		return ev
	}
	return d.envelopeJSON(lsn, content)
}

// envelopeSeeds are the envelopes of the message tests, accepted and
// refused, and a few more around what the scan takes and leaves.
func envelopeSeeds() []string {
	env := func(id, aggID, payload, headers string) string {
		s := `{"id": "` + id + `", "aggregate_type": "order", "aggregate_id": "` + aggID + `", "event_type": "E"`
		if payload != "" {
			s += `, "payload": ` + payload
		}
		if headers != "" {
			s += `, "headers": ` + headers
		}
		return s + "}"
	}
	return []string{
		env("m-2", "o-1", `{"n":2, "nested": [1, {"x": "y"}]}`, `{"trace": "t-1", "n": 5}`),
		env("m-4", "o-2", `"just a string"`, ""), env("m-5", "o-2", "", "null"),
		`{"payload":{},"event_type":"E","aggregate_id":"a","aggregate_type":"order","id":"x","extra":[1,2]}`,
		env("a", "b", "1", ""), env("m-1", "o-1", `{"n": 1}`, ""), `[]`,
		`{"id": "m", `, `hello`, ``, `[1, 2]`, `"x"`, `null`, env("m", "o", "1", "") + ` {}`, env("m", "o\xff", "1", ""),
		`{"aggregate_type": "order", "aggregate_id": "o", "event_type": "E", "payload": 1}`,
		`{"id": "m", "aggregate_id": "o", "event_type": "E"}`, `{"id": "m", "aggregate_type": "order", "event_type": "E"}`,
		`{"id": "m", "aggregate_type": "order", "aggregate_id": "o"}`,
		`{"id": 42, "aggregate_type": "order", "aggregate_id": "o", "event_type": "E"}`,
		`{"id": "m", "aggregate_type": "order", "aggregate_id": {"a": 1}, "event_type": "E"}`,
		`{"id": "m", "aggregate_type": "order", "aggregate_id": "o", "event_type": null}`,
		env("", "o", "1", ""), env("m", "", "1", ""),
		`{"id": "m", "aggregate_type": "order", "aggregate_id": "o", "aggregate_id": "p", "event_type": "E"}`,
		env("m", "o", "1", `["a"]`), env("m", "o", "1", `"k=v"`), env("m", "o", "1", `{"event_id": "1"}`),
		env("m", "o", "1", `{"ok": "1", "PG_LSN": "0/0"}`), env("m", "o", "1", `{"aggregate_id": "other"}`),
		env("m", "o", "1", `{"dlq.reason": "x"}`), env("m", "o", `"`+strings.Repeat("x", 2000)+`"`, ""),
		// What outbox.WriteMessage writes, and variations the scan must
		// leave to encoding/json or take exactly as it would.
		`{"id":"0190a1b2-c3d4-7e5f-8a6b-000001000000","aggregate_type":"order","aggregate_id":"ord_1","event_type":"OrderPlaced",` +
			`"payload":{"total":129.95,"items":[{"sku":"SKU-1001","qty":2}],"ok":true,"n":null},"headers":{"tenant":"acme","v":2}}`,
		`{"id":"m\u0031","aggregate_type":"order","aggregate_id":"o","event_type":"E"}`,
		`{"i\u0064":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","id":"n"}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":"a\"b\\c\/\b\f\n\r\t\u00e9\ud800"}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":"\u00G0"}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":[1,2,]}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":{"a":1,}}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":01}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":-1.5e+3 }`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":[[[[[[[[[[[]]]]]]]]]]]}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":{"a":{"b":[true,false,null]}}}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":tru}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","headers":{"a":"x\"y","b":{"c":1}}}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","headers":{"a":1,"a":2}}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","headers":{" a":"1"}}`,
		"{\t\"id\"\n:\r\"m\" , \"aggregate_type\":\"order\",\"aggregate_id\":\"o\",\"event_type\":\"E\"}\n",
		"{\"id\":\"m\x01\",\"aggregate_type\":\"order\",\"aggregate_id\":\"o\",\"event_type\":\"E\"}",
		`{"id":"é","aggregate_type":"ordér","aggregate_id":"ö","event_type":"É","payload":"日本"}`,
	}
}

// FuzzEnvelopeMatchesReference: on every input, envelope (the scan, then
// encoding/json for what it leaves) gives the event envelopeRef gives: the
// same fields and the same verdict, with the same refusal. Both on its own
// and as an event of a transaction (slabs, ids set at handout).
func FuzzEnvelopeMatchesReference(f *testing.F) {
	for _, s := range envelopeSeeds() {
		f.Add([]byte(s), uint16(1024))
		f.Add([]byte(s), uint16(0))
	}
	const prefix = "orders-outbox"
	newDec := func(limit int) *Decoder {
		d, err := New("public.outbox")
		if err != nil {
			f.Fatal(err)
		}
		d.SetMessagePrefix(prefix, limit)
		return d
	}
	f.Fuzz(func(t *testing.T, content []byte, limit uint16) {
		const lsn = pglogrepl.LSN(0x16B3F28)
		want := newDec(int(limit)).envelopeRef(lsn, content)
		if got := newDec(int(limit)).envelope(lsn, content); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %s\nwant %s", content, evString(got), evString(want))
		}
		// The same content as the second event of a transaction, after
		// a first one, through Decode.
		d := newDec(int(limit))
		const first = `{"id":"a","aggregate_type":"t","aggregate_id":"b","event_type":"E"}`
		var txn *Txn
		for i, m := range [][]byte{pt.Begin(0x2000, 9), pt.Message(true, 0x2008, prefix, first),
			pt.Message(true, 0x2010, prefix, string(content)), pt.Commit(0x2000, 0x2030)} {
			var err error
			at := lsn
			if i != 2 {
				at = pglogrepl.LSN(0x1000 + i)
			}
			if txn, err = d.Decode(at, m); err != nil {
				t.Fatal(err)
			}
		}
		if txn == nil || len(txn.Events) != 2 {
			t.Fatalf("%q: transaction %+v", content, txn)
		}
		if got := txn.Events[1]; !reflect.DeepEqual(got, want) {
			t.Fatalf("%q in a transaction:\n got %s\nwant %s", content, evString(got), evString(want))
		}
		if limit != 0 && int(limit) < len(first) {
			return
		}
		if first := txn.Events[0]; first.MessageID != "a" || first.AggregateID != "b" || first.Err != nil {
			t.Fatalf("%q: the first event became %s", content, evString(first))
		}
	})
}

func evString(ev Event) string {
	s := fmt.Sprintf("%+v", ev)
	if ev.Err != nil {
		s += fmt.Sprintf(" Err=%+v", *ev.Err)
	}
	return s
}

// The envelopes outbox.WriteMessage writes take the scan, not encoding/json.
func TestScanEnvelopeTakesWrittenEnvelopes(t *testing.T) {
	for _, s := range []string{
		`{"id":"0190a1b2-c3d4-7e5f-8a6b-000001000000","aggregate_type":"order","aggregate_id":"ord_1","event_type":"OrderPlaced",` +
			`"payload":{"total":129.95,"items":[{"sku":"SKU-1001","qty":2}],"note":"a \"quoted\" word","ok":true,"n":null},"headers":{"tenant":"acme","v":2}}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":null}`,
		`{"id":"m","aggregate_type":"order","aggregate_id":"o","event_type":"E","payload":"日本","headers":null}`,
	} {
		d, _ := New("public.outbox")
		d.SetMessagePrefix("p", 0)
		ev, ok := d.scanEnvelope(1, []byte(s))
		if !ok || ev.Err != nil || ev.MessageID == "" {
			t.Errorf("scan left %s to encoding/json (%s)", s, evString(ev))
		}
	}
}
