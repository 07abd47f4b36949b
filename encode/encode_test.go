package encode

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/serialize"
	"github.com/outbox-relay/outbox-relay/sink"
)

// registry answers the latest version of orders-value with an Avro schema.
func registry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		switch r.URL.Path {
		case "/subjects/orders-value/versions/latest":
			w.Write([]byte(`{"subject":"orders-value","version":2,"id":7,"schema":"{\"type\":\"record\",\"name\":\"O\",\"fields\":[{\"name\":\"n\",\"type\":\"int\"}]}"}`))
		case "/subjects/orders-value/versions/1":
			w.Write([]byte(`{"subject":"orders-value","version":1,"id":9,"schema":"{\"type\":\"record\",\"name\":\"O1\",\"fields\":[{\"name\":\"n\",\"type\":\"long\"}]}"}`))
		default:
			w.WriteHeader(404)
			w.Write([]byte(`{"error_code":40401,"message":"Subject not found."}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func event(payload string, headers ...decoder.Header) *decoder.Event {
	return &decoder.Event{ID: 42, EventID: "0193b5b8-7d3c-7c1e-9a51-2f9e0c4b1d27", AggregateType: "order", AggregateID: "o-1",
		EventType: "order.placed", Payload: []byte(payload), Headers: headers, Schema: "public", Table: "outbox"}
}

func message(topic, payload string) *sink.Message {
	return &sink.Message{Topic: topic, Key: []byte("o-1"), Value: []byte(payload),
		Headers:   []sink.Header{{Key: []byte("event_id"), Value: []byte("0193b5b8-7d3c-7c1e-9a51-2f9e0c4b1d27")}},
		Timestamp: time.Date(2026, 12, 5, 10, 0, 0, 123000000, time.UTC)}
}

func headers(m *sink.Message) map[string]string {
	h := map[string]string{}
	for _, x := range m.Headers {
		h[string(x.Key)] = string(x.Value)
	}
	return h
}

func stage(t *testing.T, cfg Config) *Stage {
	t.Helper()
	if cfg.CloudEvents == (cloudevents.Config{}) {
		cfg.CloudEvents = cloudevents.DefaultConfig()
	}
	s, err := New(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestNothingToDo(t *testing.T) {
	s, err := New(Config{Serialization: serialize.JSON, CloudEvents: cloudevents.DefaultConfig()}, zerolog.Nop(), nil)
	if err != nil || s != nil {
		t.Fatalf("plain JSON without an envelope: stage %v, error %v; want none", s, err)
	}
}

func TestEncode(t *testing.T) {
	url := registry(t)
	avroCE := Config{Serialization: serialize.Avro, Registry: serialize.RegistryConfig{URL: url}, Envelope: EnvelopeCloudEvents}
	tests := []struct {
		name, topic, payload string
		cfg                  Config
		hdrs                 []decoder.Header
		reason               string // "" = encoded
		check                func(t *testing.T, m *sink.Message)
	}{
		{name: "avro in the wire format with CloudEvents headers", topic: "orders", payload: `{"n": 5}`, cfg: avroCE,
			check: func(t *testing.T, m *sink.Message) {
				if len(m.Value) != 6 || m.Value[0] != 0 || binary.BigEndian.Uint32(m.Value[1:5]) != 7 || m.Value[5] != 10 {
					t.Errorf("value % x, want 00 00000007 0a (zig-zag 5)", m.Value)
				}
				h := headers(m)
				if h["ce_id"] != "0193b5b8-7d3c-7c1e-9a51-2f9e0c4b1d27" || h["ce_type"] != "order.placed" || h["ce_subject"] != "o-1" ||
					h["ce_source"] != "/outbox-relay/public/outbox" || h["content-type"] != "application/avro" ||
					h["ce_dataschema"] != url+"/schemas/ids/7" || h["ce_time"] != "2026-12-05T10:00:00.123Z" || h["event_id"] == "" {
					t.Errorf("headers %v", h)
				}
			}},
		{name: "the event's version header picks the subject's version", topic: "orders", payload: `{"n": 5}`,
			cfg:  Config{Serialization: serialize.Avro, Registry: serialize.RegistryConfig{URL: url, VersionHeader: "schema_version"}},
			hdrs: []decoder.Header{{Key: "schema_version", Value: []byte("1")}},
			check: func(t *testing.T, m *sink.Message) {
				if len(m.Value) < 5 || binary.BigEndian.Uint32(m.Value[1:5]) != 9 {
					t.Errorf("value % x, want schema id 9 (version 1), not the latest's 7", m.Value)
				}
			}},
		{name: "a payload that does not fit", topic: "orders", payload: `{"n": "five"}`, cfg: avroCE, reason: ReasonSchemaMismatch},
		{name: "a subject the registry lacks", topic: "payments", payload: `{"n": 5}`, cfg: avroCE, reason: ReasonSchemaMismatch},
		{name: "a row header forging ce_id", topic: "orders", payload: `{"n": 5}`, cfg: avroCE,
			hdrs: []decoder.Header{{Key: "CE_ID", Value: []byte("x")}}, reason: ReasonReservedHeader},
		{name: "an extension header passes", topic: "other", payload: `{"n": 5}`,
			cfg:  Config{Envelope: EnvelopeCloudEvents, Topics: map[string]string{"orders": serialize.Avro}, Registry: serialize.RegistryConfig{URL: url}},
			hdrs: []decoder.Header{{Key: "ce_traceparent", Value: []byte("00-x")}},
			check: func(t *testing.T, m *sink.Message) {
				if string(m.Value) != `{"n": 5}` || headers(m)["content-type"] != "application/json" {
					t.Errorf("a json topic's value %q headers %v", m.Value, headers(m))
				}
			}},
		{name: "a type from other placeholders", topic: "orders", payload: `{}`,
			cfg: Config{Envelope: EnvelopeCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.Binary, Source: "/x", Type: "{aggregate_type}{table}x"}}},
		{name: "structured", topic: "orders", payload: `{"n": 5}`,
			cfg: Config{Envelope: EnvelopeCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.Structured, Source: "/shop/{aggregate_type}", Type: "{event_type}"}},
			check: func(t *testing.T, m *sink.Message) {
				if !strings.Contains(string(m.Value), `"data":{"n": 5}`) && !strings.Contains(string(m.Value), `"data":{"n":5}`) ||
					!strings.Contains(string(m.Value), `"source":"/shop/order"`) || !strings.HasPrefix(headers(m)["content-type"], "application/cloudevents+json") {
					t.Errorf("structured value %s headers %v", m.Value, headers(m))
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := stage(t, tt.cfg)
			m := message(tt.topic, tt.payload)
			before := string(m.Value)
			reason, err := s.Encode(context.Background(), m, event(tt.payload, tt.hdrs...))
			if reason != tt.reason || (reason != "") != (err != nil) {
				t.Fatalf("Encode = %q, %v; want reason %q", reason, err, tt.reason)
			}
			if reason != "" {
				if string(m.Value) != before || len(m.Headers) != 1 {
					t.Errorf("a refused record was changed: value %q, %d headers", m.Value, len(m.Headers))
				}
				return
			}
			if tt.check != nil {
				tt.check(t, m)
			}
		})
	}
}

// The empty type case above is refused with its reason.
func TestEmptyTypeRefused(t *testing.T) {
	s := stage(t, Config{Envelope: EnvelopeCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.Binary, Source: "/x", Type: "{event_type}"}})
	ev := event(`{}`)
	ev.EventType = ""
	reason, err := s.Encode(context.Background(), message("orders", `{}`), ev)
	if reason != ReasonInvalidCloudEvent || err == nil || !strings.Contains(err.Error(), "type") {
		t.Fatalf("Encode = %q, %v; want invalid_cloudevent naming the type", reason, err)
	}
}

func TestValidate(t *testing.T) {
	ce := cloudevents.DefaultConfig()
	tests := []struct {
		cfg  Config
		want string // "" valid
	}{
		{Config{Serialization: serialize.Avro, CloudEvents: ce}, "schema_registry.url"},
		{Config{Serialization: "xml", CloudEvents: ce}, `serialization: "xml"`},
		{Config{Topics: map[string]string{"*": serialize.Avro}, CloudEvents: ce}, "serialization_topics"},
		{Config{Envelope: "cloud", CloudEvents: ce}, "envelope"},
		{Config{Serialization: serialize.Avro, Registry: serialize.RegistryConfig{URL: "http://r"}, Envelope: EnvelopeCloudEvents,
			CloudEvents: cloudevents.Config{Mode: cloudevents.Structured, Source: "/x", Type: "{event_type}"}}, "cloudevents.mode: structured"},
		{Config{Topics: map[string]string{"orders.*": serialize.Protobuf}, Registry: serialize.RegistryConfig{URL: "http://r"}, CloudEvents: ce}, ""},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}
