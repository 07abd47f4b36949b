package decoder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// envelopeRef is the envelope decode before scanEnvelope (encoding/json
// only), kept verbatim as the reference the fuzz test holds envelope to.
// (It built the Event of a transactional message's content.)
func (d *Decoder) envelopeRef(lsn pglogrepl.LSN, content []byte) Event {
	ev := Event{LSN: lsn, Source: SourceMessage}
	if d.msg.limit > 0 && len(content) > d.msg.limit {
		return d.refuseMessage(ev, nil, "content",
			fmt.Sprintf("is %d bytes, over the limit of %d (kafka.max_message_bytes); the dead letter cannot carry it", len(content), d.msg.limit),
			hintMsgSize)
	}
	bad := func(field, text string) Event { return d.refuseMessage(ev, content, field, text, hintMsgProducer) }
	if !utf8.Valid(content) {
		return bad("content", "is not valid UTF-8")
	}
	d.rd.Reset(content)
	dec := json.NewDecoder(&d.rd)
	tok, err := dec.Token()
	if err != nil {
		return bad("content", invalidJSON(err).text)
	}
	if tok != json.Delim('{') {
		return bad("content", "is "+jsonKind(tok)+", not a JSON object (the envelope: id, aggregate_type, aggregate_id, event_type, payload, headers)")
	}
	var (
		payload, hdrs   json.RawMessage
		hasPay, hasHdrs bool
		got             [4]bool // required fields read
		id, aggID       string
	)
	required := [4]string{EnvelopeID, EnvelopeAggregateType, EnvelopeAggregateID, EnvelopeEventType}
	d.msg.seen = d.msg.seen[:0]
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad("content", invalidJSON(err).text)
		}
		key, _ := tok.(string)
		for _, k := range d.msg.seen {
			if k == key {
				return bad(cutKey(key), "appears twice in the envelope")
			}
		}
		if len(d.msg.seen) < 64 {
			d.msg.seen = append(d.msg.seen, key)
		}
		switch key {
		case EnvelopePayload:
			if err := dec.Decode(&payload); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			hasPay = true
		case EnvelopeHeaders:
			if err := dec.Decode(&hdrs); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			hasHdrs = true
		default:
			if err := dec.Decode(&d.raw); err != nil {
				return bad("content", invalidJSON(err).text)
			}
			for i, r := range required {
				if key != r {
					continue
				}
				if d.raw[0] != '"' {
					return bad(key, "is "+rawKind(d.raw)+", not a JSON string")
				}
				var s string
				if err := json.Unmarshal(d.raw, &s); err != nil {
					return bad(key, invalidJSON(err).text)
				}
				got[i] = true
				switch i { // kept as soon as read, for a dead letter
				case 0:
					ev.MessageID, id = s, s
				case 1:
					ev.AggregateType = d.str([]byte(s))
				case 2:
					ev.AggregateID, aggID = s, s
				case 3:
					ev.EventType = d.str([]byte(s))
				}
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return bad("content", invalidJSON(err).text)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("content", "has data after the JSON object")
	}
	for i, ok := range got {
		if !ok {
			return bad(required[i], "is missing (required: id, aggregate_type, aggregate_id, event_type)")
		}
	}
	if id == "" {
		return bad(EnvelopeID, "is empty")
	}
	if aggID == "" {
		// It is the Kafka key: an empty key loses per-aggregate ordering.
		return bad(EnvelopeAggregateID, "is empty")
	}
	hasHeaders := hasHdrs && !bytes.Equal(hdrs, []byte("null"))
	if hasHeaders {
		if r := d.parseHeaders(hdrs); r != nil {
			return bad(EnvelopeHeaders, r.text)
		}
		for _, h := range d.hdrs {
			if h.refused {
				r, reserved := headerNameReason(h.key, d.reserved, hintMsgReserved, hintMsgBadName)
				ev = d.refuseMessage(ev, content, EnvelopeHeaders, r.text, r.hint)
				if reserved {
					ev.Err.ReservedHeader = h.key
				}
				return ev
			}
		}
	}
	if !hasPay {
		payload = json.RawMessage("null")
	}
	// One allocation for the payload and all header values, as for a row.
	var vals []byte
	if hasHeaders {
		vals = d.vals.Bytes()
	}
	buf := make([]byte, len(payload)+len(vals))
	p := copy(buf, payload)
	copy(buf[p:], vals)
	ev.Payload = buf[:p:p]
	if hasHeaders {
		ev.Headers = make([]Header, len(d.hdrs))
		for i, h := range d.hdrs {
			ev.Headers[i] = Header{Key: h.key, Value: buf[p+h.start : p+h.end : p+h.end]}
		}
	}
	return ev
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
