package inbox

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/cloudevents"
)

// CloudEvent is the CloudEvents 1.0 context of a record written as a
// CloudEvent (outbox-relay's envelope: cloudevents, or any producer
// following the Kafka protocol binding). Message.CloudEvent is nil for a
// record that is not one.
type CloudEvent struct {
	// Mode is "binary" (attributes in ce_* headers, the data as the
	// record value) or "structured" (the whole event as a JSON value,
	// content-type application/cloudevents+json).
	Mode            string
	SpecVersion     string // "1.0"
	ID              string
	Source          string
	Type            string
	Subject         string    // "" when absent
	Time            time.Time // zero when absent
	DataContentType string    // binary mode: the content-type header
	DataSchema      string
	// Extensions are the other attributes by name: binary mode, the ce_*
	// headers without their prefix; structured mode, the other members of
	// the JSON object (a string's value, or the member's JSON text).
	Extensions map[string]string
}

// Content modes of CloudEvent.Mode.
const (
	ModeBinary     = "binary"
	ModeStructured = "structured"
)

// ErrBadCloudEvent is wrapped by the error of a record that claims to be a
// CloudEvent (a ce_specversion header, or a CloudEvents content-type) but
// cannot be read as one: not JSON, no id, an unsupported spec version, a
// bad time. Like a record without event_id it never reaches the handler:
// it is a permanent failure (Config.OnGiveUp).
var ErrBadCloudEvent = errors.New("not a valid CloudEvent")

// Decoder turns a record value in the Schema Registry wire format (magic
// byte 0, a 4-byte big-endian schema id, then the encoded data) into the
// JSON the handler reads, and returns the schema id. The serialize
// package's *Serializer is one. Decode is called from the goroutine of
// the record's partition, several partitions at once; an error is
// retried like a handler error (a registry that is down makes the record
// wait), then goes to Config.OnGiveUp after Config.MaxAttempts.
type Decoder interface {
	Decode(ctx context.Context, topic string, value []byte) (payload []byte, schemaID int, err error)
}

// WireSchemaID returns the schema id of a value in the Schema Registry
// wire format (magic byte 0, 4-byte big-endian schema id, at least one
// more byte); false for anything else. A JSON value never starts with
// byte 0.
func WireSchemaID(v []byte) (int, bool) {
	if len(v) < 5 || v[0] != 0 {
		return 0, false
	}
	return int(binary.BigEndian.Uint32(v[1:5])), true
}

// ParseMessage builds the Message of a consumed record, reading the
// CloudEvents binary and structured modes: EventID is the event_id header,
// else the CloudEvent's id; EventType event_type, else its type;
// AggregateID aggregate_id, else its subject; for a structured record
// Payload is the event's data (data_base64 decoded). A record claiming
// to be a CloudEvent that cannot be read is an error wrapping
// ErrBadCloudEvent and naming topic/partition/offset; the Message is then
// what the headers give, with the value as Payload. It never returns a
// nil Message. It does no I/O: a value in the Schema Registry wire format
// is left as it is (Consumer decodes it with Config.Decoder).
func ParseMessage(r *sarama.ConsumerMessage) (*Message, error) {
	h := make(map[string]string, len(r.Headers))
	var contentType, specVersion string
	for _, x := range r.Headers {
		if x == nil {
			continue
		}
		k := string(x.Key)
		h[k] = string(x.Value)
		switch strings.ToLower(k) {
		case cloudevents.HeaderContentType:
			contentType = h[k]
		case cloudevents.HeaderSpecVersion:
			specVersion = h[k]
		}
	}
	m := &Message{
		EventID: h[HeaderEventID], EventType: h[HeaderEventType], AggregateType: h[HeaderAggregateType], AggregateID: h[HeaderAggregateID],
		Headers: h, Key: r.Key, Payload: r.Value, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
	}
	var ce *CloudEvent
	var payload []byte
	var err error
	switch {
	case cloudevents.IsStructured(contentType):
		ce, payload, err = parseStructured(r.Value)
	case cloudevents.IsCloudEventsFormat(contentType):
		err = fmt.Errorf("content-type %q: only the JSON event format, one event per record, is read", contentType)
	case specVersion != "":
		ce, err = parseBinary(r.Headers, contentType)
		payload = r.Value
	default:
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("inbox: record %s/%d@%d: %w: %v", r.Topic, r.Partition, r.Offset, ErrBadCloudEvent, err)
	}
	m.CloudEvent, m.Payload = ce, payload
	if m.EventID == "" {
		m.EventID = ce.ID
	}
	if m.EventType == "" {
		m.EventType = ce.Type
	}
	if m.AggregateID == "" {
		m.AggregateID = ce.Subject
	}
	return m, nil
}

func isJSONType(ct string) bool {
	mt := cloudevents.MediaType(ct)
	return mt == "" || mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

func checkRequired(ce *CloudEvent) error {
	if ce.SpecVersion != "1.0" {
		return fmt.Errorf("specversion %q is not 1.0", ce.SpecVersion)
	}
	for _, a := range []struct{ name, v string }{{"id", ce.ID}, {"source", ce.Source}, {"type", ce.Type}} {
		if strings.TrimSpace(a.v) == "" {
			return fmt.Errorf("required attribute %s is missing or empty", a.name)
		}
	}
	return nil
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("time %q is not RFC 3339", s)
	}
	return t, nil
}

// parseBinary reads the ce_* headers (keys compared in lower case, as
// the binding's readers do) and the content-type header.
func parseBinary(headers []*sarama.RecordHeader, contentType string) (*CloudEvent, error) {
	ce := &CloudEvent{Mode: ModeBinary, DataContentType: contentType}
	var timeText string
	for _, x := range headers {
		if x == nil {
			continue
		}
		k := strings.ToLower(string(x.Key))
		name, ok := strings.CutPrefix(k, cloudevents.HeaderPrefix)
		if !ok {
			continue
		}
		v := string(x.Value)
		switch name {
		case "specversion":
			ce.SpecVersion = v
		case "id":
			ce.ID = v
		case "source":
			ce.Source = v
		case "type":
			ce.Type = v
		case "subject":
			ce.Subject = v
		case "time":
			timeText = v
		case "dataschema":
			ce.DataSchema = v
		case "datacontenttype":
			// The binding carries it in content-type; a ce_ header is
			// read only when that is absent.
			if ce.DataContentType == "" {
				ce.DataContentType = v
			}
		default:
			if ce.Extensions == nil {
				ce.Extensions = map[string]string{}
			}
			ce.Extensions[name] = v
		}
	}
	if err := checkRequired(ce); err != nil {
		return nil, err
	}
	t, err := parseTime(timeText)
	if err != nil {
		return nil, err
	}
	ce.Time = t
	return ce, nil
}

// parseStructured reads a JSON-format event and returns it with its data.
func parseStructured(v []byte) (*CloudEvent, []byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(v, &members); err != nil {
		return nil, nil, fmt.Errorf("the value is not a JSON object: %v", err)
	}
	ce := &CloudEvent{Mode: ModeStructured}
	str := func(name string) (string, error) {
		raw, ok := members[name]
		if !ok || string(raw) == "null" {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("attribute %s is %s, not a string", name, clipJSON(raw))
		}
		return s, nil
	}
	var timeText string
	for _, a := range []struct {
		name string
		dst  *string
	}{{"specversion", &ce.SpecVersion}, {"id", &ce.ID}, {"source", &ce.Source}, {"type", &ce.Type}, {"subject", &ce.Subject},
		{"time", &timeText}, {"datacontenttype", &ce.DataContentType}, {"dataschema", &ce.DataSchema}} {
		s, err := str(a.name)
		if err != nil {
			return nil, nil, err
		}
		*a.dst = s
	}
	if err := checkRequired(ce); err != nil {
		return nil, nil, err
	}
	t, err := parseTime(timeText)
	if err != nil {
		return nil, nil, err
	}
	ce.Time = t
	for k, raw := range members {
		switch k {
		case "specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema", "data", "data_base64":
			continue
		}
		if ce.Extensions == nil {
			ce.Extensions = map[string]string{}
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			ce.Extensions[k] = s
		} else {
			ce.Extensions[k] = string(raw)
		}
	}
	data, hasData := members["data"]
	b64, hasB64 := members["data_base64"]
	switch {
	case hasData && hasB64:
		return nil, nil, errors.New("it has both data and data_base64")
	case hasB64:
		var s string
		if err := json.Unmarshal(b64, &s); err != nil {
			return nil, nil, fmt.Errorf("data_base64 is %s, not a string", clipJSON(b64))
		}
		d, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, nil, fmt.Errorf("data_base64 is not base64: %v", err)
		}
		return ce, d, nil
	case hasData && string(data) == "null":
		return ce, nil, nil
	case hasData && !isJSONType(ce.DataContentType) && len(data) > 0 && data[0] == '"':
		// Data of another media type, carried as a JSON string.
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, nil, err
		}
		return ce, []byte(s), nil
	case hasData:
		return ce, data, nil
	}
	return ce, nil, nil
}

func clipJSON(raw json.RawMessage) string {
	if len(raw) > 60 {
		return string(raw[:60]) + "..."
	}
	return string(raw)
}
