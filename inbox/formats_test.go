package inbox

import (
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/outbox-relay/outbox-relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/sink"
)

// sdkRecord is the record the CloudEvents Go SDK's Kafka writer makes of e,
// as a consumer reads it.
func sdkRecord(t *testing.T, e event.Event, structured bool, extra ...sarama.RecordHeader) *sarama.ConsumerMessage {
	t.Helper()
	ctx := context.Background()
	if structured {
		ctx = binding.WithForceStructured(ctx)
	} else {
		ctx = binding.WithForceBinary(ctx)
	}
	pm := &sarama.ProducerMessage{Topic: "outbox.event.order"}
	if err := kafka_sarama.WriteProducerMessage(ctx, binding.ToMessage(&e), pm); err != nil {
		t.Fatal(err)
	}
	v, err := pm.Value.Encode()
	if err != nil {
		t.Fatal(err)
	}
	cm := &sarama.ConsumerMessage{Topic: pm.Topic, Partition: 3, Offset: 11, Value: v, Key: []byte("ord_1")}
	for _, h := range append(pm.Headers, extra...) {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return cm
}

func sdkEvent(t *testing.T, ct string, data []byte) event.Event {
	t.Helper()
	e := event.New()
	e.SetID("0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b")
	e.SetSource("/outbox-relay/public/outbox")
	e.SetType("order.created")
	e.SetSubject("ord_1")
	e.SetTime(time.Date(2026, 12, 5, 10, 0, 0, 123000000, time.UTC))
	e.SetDataSchema("https://registry.example/schemas/ids/7")
	e.SetExtension("traceparent", "00-abc-01")
	e.SetExtension("tenant", "acme")
	if err := e.SetData(ct, data); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestParseMessageReadsSDKRecords(t *testing.T) {
	for _, tt := range []struct {
		name, ct string
		data     []byte
	}{
		{"json", "application/json", []byte(`{"order_id":"ord_1","total":12.5}`)},
		{"json with charset", "application/json; charset=utf-8", []byte(`[1,"é"]`)},
		{"vendor json", "application/vnd.order+json", []byte(`{"a":1}`)},
		{"binary data", "application/octet-stream", []byte{0, 1, 2, 0xff, '"'}},
		{"text", "text/plain", []byte("hello \"world\"\n")},
	} {
		for _, structured := range []bool{false, true} {
			mode := map[bool]string{false: ModeBinary, true: ModeStructured}[structured]
			t.Run(tt.name+"/"+mode, func(t *testing.T) {
				e := sdkEvent(t, tt.ct, tt.data)
				r := sdkRecord(t, e, structured)
				m, err := ParseMessage(r)
				if err != nil {
					t.Fatal(err)
				}
				ce := m.CloudEvent
				if ce == nil {
					t.Fatalf("no CloudEvent: %+v", m)
				}
				if m.EventID != e.ID() || m.EventType != e.Type() || m.AggregateID != e.Subject() || m.Topic != r.Topic || m.Offset != 11 {
					t.Errorf("fields %+v", m)
				}
				if ce.Mode != mode || ce.SpecVersion != "1.0" || ce.ID != e.ID() || ce.Source != e.Source() || ce.Type != e.Type() ||
					ce.Subject != e.Subject() || !ce.Time.Equal(e.Time()) || ce.DataContentType != e.DataContentType() || ce.DataSchema != e.DataSchema() {
					t.Errorf("CloudEvent %+v\nwant %s", ce, e)
				}
				if want := map[string]string{"traceparent": "00-abc-01", "tenant": "acme"}; !maps.Equal(ce.Extensions, want) {
					t.Errorf("extensions %v, want %v", ce.Extensions, want)
				}
				if string(m.Payload) != string(e.Data()) {
					t.Errorf("payload %q, want %q", m.Payload, e.Data())
				}
				if string(m.Value) != string(r.Value) {
					t.Error("Value is not the record value")
				}
			})
		}
	}
}

// What the relay writes (package cloudevents), beside the relay's own
// headers, which win over the attributes.
func TestParseMessageReadsRelayRecords(t *testing.T) {
	a := cloudevents.Attributes{ID: "e-1", Source: "/outbox-relay/public/outbox", Type: "order.created", Subject: "ord_1",
		DataContentType: "application/json", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	payload := []byte(`{"total":1}`)
	own := []sink.Header{{Key: []byte("event_id"), Value: []byte("e-1")}, {Key: []byte("aggregate_type"), Value: []byte("order")},
		{Key: []byte("ce_tenant"), Value: []byte("acme")}}
	conv := func(h []sink.Header, v []byte) *sarama.ConsumerMessage {
		r := &sarama.ConsumerMessage{Topic: "t", Value: v}
		for _, x := range h {
			r.Headers = append(r.Headers, &sarama.RecordHeader{Key: x.Key, Value: x.Value})
		}
		return r
	}
	sv, _ := cloudevents.StructuredValue(nil, a, payload)
	for name, r := range map[string]*sarama.ConsumerMessage{
		"binary":     conv(cloudevents.AppendHeaders(own, a), payload),
		"structured": conv(append(own[:2:2], cloudevents.StructuredHeader()), sv),
	} {
		m, err := ParseMessage(r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m.EventID != "e-1" || m.EventType != "order.created" || m.AggregateType != "order" || m.AggregateID != "ord_1" ||
			string(m.Payload) != string(payload) || m.CloudEvent == nil || m.CloudEvent.Mode != name || !m.CloudEvent.Time.Equal(a.Time) {
			t.Errorf("%s: %+v %+v", name, m, m.CloudEvent)
		}
	}
	// event_id, event_type, aggregate_id headers come first.
	r := conv(append([]sink.Header{{Key: []byte("event_id"), Value: []byte("row-9")}, {Key: []byte("event_type"), Value: []byte("x.y")},
		{Key: []byte("aggregate_id"), Value: []byte("agg")}}, cloudevents.AppendHeaders(nil, a)...), payload)
	if m, err := ParseMessage(r); err != nil || m.EventID != "row-9" || m.EventType != "x.y" || m.AggregateID != "agg" {
		t.Errorf("headers first: %+v %v", m, err)
	}
}

func TestParseMessageBadCloudEvents(t *testing.T) {
	structured := func(v string) *sarama.ConsumerMessage {
		return &sarama.ConsumerMessage{Topic: "outbox.event.order", Partition: 2, Offset: 41, Value: []byte(v), Headers: []*sarama.RecordHeader{
			{Key: []byte("event_id"), Value: []byte("e-7")}, {Key: []byte("Content-Type"), Value: []byte("application/cloudevents+json; charset=UTF-8")}}}
	}
	bin := func(h ...string) *sarama.ConsumerMessage {
		r := &sarama.ConsumerMessage{Topic: "outbox.event.order", Partition: 2, Offset: 41, Value: []byte(`{}`)}
		for i := 0; i < len(h); i += 2 {
			r.Headers = append(r.Headers, &sarama.RecordHeader{Key: []byte(h[i]), Value: []byte(h[i+1])})
		}
		return r
	}
	const head = `{"specversion":"1.0","source":"/s","type":"t"`
	for _, tt := range []struct {
		name string
		r    *sarama.ConsumerMessage
		want string
	}{
		{"not JSON", structured(`{"specversion":`), "the value is not a JSON object"},
		{"an array", structured(`[1]`), "the value is not a JSON object"},
		{"no id", structured(head + `}`), "required attribute id is missing or empty"},
		{"blank id", structured(head + `,"id":"  "}`), "required attribute id is missing or empty"},
		{"id a number", structured(head + `,"id":7}`), "attribute id is 7, not a string"},
		{"spec 0.3", structured(`{"specversion":"0.3","id":"1","source":"/s","type":"t"}`), `specversion "0.3" is not 1.0`},
		{"bad time", structured(head + `,"id":"1","time":"yesterday"}`), `time "yesterday" is not RFC 3339`},
		{"both data", structured(head + `,"id":"1","data":1,"data_base64":"AA=="}`), "both data and data_base64"},
		{"bad base64", structured(head + `,"id":"1","data_base64":"%%%"}`), "data_base64 is not base64"},
		{"batch", &sarama.ConsumerMessage{Topic: "outbox.event.order", Partition: 2, Offset: 41, Value: []byte(`[]`), Headers: []*sarama.RecordHeader{
			{Key: []byte("content-type"), Value: []byte("application/cloudevents-batch+json")}}}, "one event per record"},
		{"binary without source", bin("ce_specversion", "1.0", "ce_id", "1", "ce_type", "t"), "required attribute source"},
		{"binary bad time", bin("ce_specversion", "1.0", "ce_id", "1", "ce_source", "/s", "ce_type", "t", "ce_time", "2026-13-01T00:00:00Z"), "not RFC 3339"},
		{"binary spec 2", bin("ce_specversion", "2.0", "ce_id", "1", "ce_source", "/s", "ce_type", "t"), `"2.0" is not 1.0`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseMessage(tt.r)
			if !errors.Is(err, ErrBadCloudEvent) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "record outbox.event.order/2@41") {
				t.Fatalf("error %v, want ErrBadCloudEvent naming outbox.event.order/2@41 and %q", err, tt.want)
			}
			if m == nil || m.CloudEvent != nil || string(m.Payload) != string(tt.r.Value) {
				t.Errorf("message on error: %+v", m)
			}
			if m := NewMessage(tt.r); m == nil || string(m.Payload) != string(tt.r.Value) {
				t.Errorf("NewMessage: %+v", m)
			}
		})
	}
}

func TestParseMessageStructuredData(t *testing.T) {
	const head = `{"specversion":"1.0","id":"1","source":"/s","type":"t"`
	for _, tt := range []struct{ name, v, want string }{
		{"no data", head + `}`, ""},
		{"null data", head + `,"data":null}`, ""},
		{"json object", head + `,"datacontenttype":"application/json","data": {"a" : 1}}`, `{"a" : 1}`},
		{"json without content type", head + `,"data":[1,2]}`, `[1,2]`},
		{"json string stays JSON", head + `,"datacontenttype":"application/json","data":"x\"y"}`, `"x\"y"`},
		{"text string", head + `,"datacontenttype":"text/plain","data":"x\"y\u00e9"}`, `x"yé`},
		{"xml string", head + `,"datacontenttype":"application/xml","data":"<a/>"}`, `<a/>`},
		{"base64", head + `,"datacontenttype":"application/octet-stream","data_base64":"AAEC/w=="}`, "\x00\x01\x02\xff"},
		{"extensions", head + `,"tenant":"acme","count":3,"data":{}}`, `{}`},
	} {
		m, err := ParseMessage(&sarama.ConsumerMessage{Value: []byte(tt.v), Headers: []*sarama.RecordHeader{
			{Key: []byte("content-type"), Value: []byte("application/cloudevents+json")}}})
		if err != nil || string(m.Payload) != tt.want || m.EventID != "1" {
			t.Errorf("%s: payload %q, want %q (%v)", tt.name, m.Payload, tt.want, err)
		}
		if tt.name == "extensions" && !maps.Equal(m.CloudEvent.Extensions, map[string]string{"tenant": "acme", "count": "3"}) {
			t.Errorf("extensions %v", m.CloudEvent.Extensions)
		}
	}
}

// A record that is no CloudEvent is read as before: no CloudEvent, the
// value as the payload, even one in the wire format.
func TestParseMessagePlainRecords(t *testing.T) {
	wire := append([]byte{0, 0, 0, 0, 42}, "\x02\x0aavro"...)
	for _, v := range [][]byte{[]byte(`{"a":1}`), wire, nil} {
		m, err := ParseMessage(&sarama.ConsumerMessage{Value: v, Headers: []*sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("1")},
			{Key: []byte("content-type"), Value: []byte("application/json")}}})
		if err != nil || m.CloudEvent != nil || string(m.Payload) != string(v) || m.EventID != "1" || m.SchemaID != 0 {
			t.Errorf("%q: %+v %v", v, m, err)
		}
	}
}

func TestWireSchemaID(t *testing.T) {
	for _, tt := range []struct {
		v    []byte
		id   int
		isOK bool
	}{
		{[]byte{0, 0, 0, 1, 0, 2}, 256, true},
		{[]byte{0, 0x7f, 0xff, 0xff, 0xff, 0}, 1<<31 - 1, true},
		{[]byte{0, 0, 0, 0, 1}, 1, true},
		{[]byte{0, 0, 0, 1}, 0, false},
		{[]byte(`{"a":1}`), 0, false},
		{[]byte{1, 0, 0, 0, 1, 0}, 0, false},
		{nil, 0, false},
	} {
		if id, ok := WireSchemaID(tt.v); id != tt.id || ok != tt.isOK {
			t.Errorf("%v: %d %v, want %d %v", tt.v, id, ok, tt.id, tt.isOK)
		}
	}
}

// testDecoder decodes values whose data is already JSON, failing while
// down is set.
type testDecoder struct {
	calls int
	down  bool
}

func (d *testDecoder) Decode(_ context.Context, topic string, v []byte) ([]byte, int, error) {
	d.calls++
	if d.down {
		return nil, 0, errors.New("registry unreachable")
	}
	return v[5:], int(binary.BigEndian.Uint32(v[1:5])), nil
}

func TestConsumerDecode(t *testing.T) {
	wire := append([]byte{0, 0, 0, 0, 9}, `{"a":1}`...)
	d := &testDecoder{down: true}
	c := &Consumer{cfg: Config{Decoder: d}}
	m := &Message{Topic: "t", Partition: 1, Offset: 5, Payload: wire}
	decoded := false
	err := c.decode(context.Background(), m, &decoded)
	if err == nil || !strings.Contains(err.Error(), "inbox: decode record t/1@5 (schema id 9): registry unreachable") || decoded || m.SchemaID != 0 {
		t.Fatalf("down: %v", err)
	}
	d.down = false
	if err := c.decode(context.Background(), m, &decoded); err != nil || string(m.Payload) != `{"a":1}` || m.SchemaID != 9 || !decoded {
		t.Fatalf("up: %v %+v", err, m)
	}
	if err := c.decode(context.Background(), m, &decoded); err != nil || d.calls != 2 {
		t.Errorf("decoded twice: %d calls", d.calls)
	}
	// Plain JSON is not the wire format: passed as it is.
	plain := &Message{Payload: []byte(`{"b":2}`)}
	decoded = false
	if err := c.decode(context.Background(), plain, &decoded); err != nil || string(plain.Payload) != `{"b":2}` || plain.SchemaID != 0 || d.calls != 2 {
		t.Errorf("plain: %v %+v", err, plain)
	}
	// Without a Decoder, the wire format is left as it is.
	m = &Message{Payload: wire}
	decoded = false
	if err := (&Consumer{}).decode(context.Background(), m, &decoded); err != nil || string(m.Payload) != string(wire) || m.SchemaID != 0 {
		t.Errorf("no decoder: %v %+v", err, m)
	}
}
