// Package encode is the last step of building a record: it writes the
// record's value (and key) in its topic's format, the Schema Registry wire
// format of package serialize (serialization: avro, json_schema,
// protobuf), and wraps it as a CloudEvent (envelope: cloudevents, package
// cloudevents). The relay's pipeline and outbox-relay replay call it on
// every record after routing, so a record has the same format whichever of
// them wrote it. Plain JSON without an envelope needs no Stage (New returns
// nil) and costs nothing.
package encode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/cloudevents"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/serialize"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Envelopes (the envelope key).
const (
	EnvelopeNone        = "none"
	EnvelopeCloudEvents = "cloudevents"
)

// Dead-letter reasons of the events Encode refuses.
const (
	// ReasonSchemaMismatch: the payload does not fit its topic's schema,
	// or the registry has no schema (subject, version) for it.
	ReasonSchemaMismatch = "schema_mismatch"
	// ReasonInvalidCloudEvent: the event's CloudEvents attributes are
	// invalid (an empty type, a source that is not a URI reference).
	ReasonInvalidCloudEvent = "invalid_cloudevent"
	// ReasonReservedHeader: a row header that would forge a CloudEvents
	// attribute (ce_id, content-type, ...), the relay's existing reason.
	ReasonReservedHeader = "reserved_header"
)

// Config is the formats part of the relay's configuration.
type Config struct {
	// Serialization is the value format of every topic: serialize.JSON
	// (default, the payload's bytes as they are), JSONSchema, Avro or
	// Protobuf; Topics overrides it per topic (exact name or prefix*).
	Serialization string
	Topics        map[string]string
	Registry      serialize.RegistryConfig
	// Envelope is EnvelopeNone ("" too) or EnvelopeCloudEvents.
	Envelope    string
	CloudEvents cloudevents.Config
}

// Formats lists every format c uses, the default first.
func (c Config) Formats() []string {
	f := []string{c.Serialization}
	if f[0] == "" {
		f[0] = serialize.JSON
	}
	for _, v := range c.Topics {
		f = append(f, v)
	}
	return f
}

// UsesRegistry reports whether some topic needs the Schema Registry.
func (c Config) UsesRegistry() bool {
	for _, f := range c.Formats() {
		switch f {
		case serialize.JSONSchema, serialize.Avro, serialize.Protobuf:
			return true
		}
	}
	return false
}

// Validate names each bad key: serialization, serialization_topics,
// schema_registry.*, envelope, cloudevents.*.
func (c Config) Validate() error {
	var errs []error
	valid := func(key, f string) bool {
		switch f {
		case "":
			return key == "serialization" // unset: json
		case serialize.JSON, serialize.JSONSchema, serialize.Avro, serialize.Protobuf:
			return true
		}
		errs = append(errs, fmt.Errorf("%s: %q is not json (the payload as it is, the default), json_schema, avro or protobuf", key, f))
		return false
	}
	// The formats in use, bad entries left out: each is named once, by its key.
	var formats []string
	if valid("serialization", c.Serialization) {
		formats = append(formats, cmp.Or(c.Serialization, serialize.JSON))
	}
	for t, f := range c.Topics {
		if err := validTopicPattern(t); err != nil {
			errs = append(errs, fmt.Errorf("serialization_topics: %q: %w", t, err))
			continue
		}
		if valid("serialization_topics: "+t, f) {
			formats = append(formats, f)
		}
	}
	// Checked even when unused: a typo is reported before it matters.
	errs = append(errs, c.Registry.Validate("schema_registry.", formats), c.CloudEvents.Validate("cloudevents"))
	switch c.Envelope {
	case "", EnvelopeNone:
	case EnvelopeCloudEvents:
		if c.CloudEvents.Mode == cloudevents.Structured {
			for _, f := range formats {
				if f != serialize.JSON {
					errs = append(errs, fmt.Errorf("cloudevents.mode: structured carries the payload inside a JSON event and cannot carry the %s wire format: use mode binary (the default) with serialization %s", f, f))
					break
				}
			}
		}
	default:
		errs = append(errs, fmt.Errorf("envelope: %q is not none (the default) or cloudevents", c.Envelope))
	}
	return errors.Join(errs...)
}

func validTopicPattern(t string) error {
	prefix, star := strings.CutSuffix(t, "*")
	if star {
		if prefix == "" {
			return errors.New("\"*\" is every topic: set serialization instead")
		}
		t = prefix + "x"
	}
	if strings.Contains(prefix, "*") {
		return errors.New("'*' may only end an entry (a prefix such as orders.*)")
	}
	return sink.ValidTopic(t)
}

// Stage writes records in their topic's format. Encode runs on one
// goroutine at a time (the replication loop, or a replay); Unavailable
// from any.
type Stage struct {
	ser      *serialize.Serializer // nil: every topic is plain JSON
	ce       bool
	ceMode   string
	ceTmpl   cloudevents.Templates
	schemaAt string // the registry's URL without credentials, for ce_dataschema
	buf      []byte
	// cur is the event being encoded, for header: one func for every
	// event, not a closure allocated per event.
	cur    *decoder.Event
	header func(string) (string, bool)
}

// New returns the stage of cfg, or nil when there is nothing to do (plain
// JSON, no envelope). It does no I/O: the registry is asked at the first
// record that needs it.
func New(cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Stage, error) {
	ce := cfg.Envelope == EnvelopeCloudEvents
	if !cfg.UsesRegistry() && !ce {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Stage{ce: ce, ceMode: cfg.CloudEvents.Mode}
	s.header = s.headerOf
	if ce {
		t, err := cfg.CloudEvents.Compile()
		if err != nil {
			return nil, err
		}
		s.ceTmpl = t
	}
	if cfg.UsesRegistry() {
		def := cfg.Serialization
		if def == "" {
			def = serialize.JSON
		}
		ser, err := serialize.New(def, cfg.Topics, cfg.Registry, log, reg)
		if err != nil {
			return nil, err
		}
		s.ser = ser
		s.schemaAt = strings.TrimSuffix(redactURL(cfg.Registry.URL), "/")
	}
	return s, nil
}

// Close stops the stage's background work (schema cache refreshes).
func (s *Stage) Close() {
	if s != nil && s.ser != nil {
		s.ser.Close()
	}
}

// Unavailable is since when the registry has not answered a lookup a
// record waits for, and its last error (zero when it answers or is not
// used). Any goroutine.
func (s *Stage) Unavailable() (since time.Time, err error) {
	if s == nil || s.ser == nil {
		return time.Time{}, nil
	}
	return s.ser.Unavailable()
}

// redactURL is u without its user information: ce_dataschema names the
// registry, never its credentials.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	p.User = nil
	return p.String()
}

// Encode rewrites m, the record of ev routed to m.Topic, in its topic's
// format. A refused event gets a reason (ReasonSchemaMismatch,
// ReasonInvalidCloudEvent, ReasonReservedHeader) with its error: the
// caller dead-letters it, m untouched. An error without a reason is ctx's:
// Encode waits while the registry does not answer, and never writes a
// record in another format.
func (s *Stage) Encode(ctx context.Context, m *sink.Message, ev *decoder.Event) (reason string, err error) {
	// Everything that can refuse the event first: a refused event's
	// dead letter holds its record as built, not half encoded.
	var a cloudevents.Attributes
	if s.ce {
		for _, h := range ev.Headers {
			if err := cloudevents.CheckHeader(h.Key); err != nil {
				return ReasonReservedHeader, fmt.Errorf("header %q: %w", h.Key, err)
			}
		}
		s.buf = ev.AppendIdentity(s.buf[:0])
		a = cloudevents.Attributes{ID: string(s.buf),
			Source:  s.ceTmpl.Source.Render(ev.Schema, ev.Table, ev.AggregateType, ev.EventType, m.Topic),
			Type:    s.ceTmpl.Type.Render(ev.Schema, ev.Table, ev.AggregateType, ev.EventType, m.Topic),
			Subject: ev.AggregateID, Time: m.Timestamp, DataContentType: "application/json"}
		if err := a.Check(); err != nil {
			return ReasonInvalidCloudEvent, err
		}
	}
	if s.ser != nil && m.Value != nil { // a null value (a tombstone) stays null
		if f := s.ser.Format(m.Topic); f != serialize.JSON {
			in := serialize.Input{Topic: m.Topic, Key: m.Key, Payload: m.Value, AggregateType: ev.AggregateType,
				EventType: ev.EventType, Schema: ev.Schema, Table: ev.Table, Header: s.header}
			s.cur = ev
			out, err := s.ser.Encode(ctx, in)
			s.cur = nil // the event's memory is recycled after its transaction
			if err != nil {
				if ctx.Err() != nil {
					return "", err
				}
				var mm *serialize.MismatchError
				if errors.As(err, &mm) {
					return ReasonSchemaMismatch, fmt.Errorf("topic %s: %w", m.Topic, err)
				}
				return "", fmt.Errorf("topic %s: %w", m.Topic, err)
			}
			m.Value = out.Value
			if out.Key != nil {
				m.Key = out.Key
			}
			if out.ContentType != "" {
				a.DataContentType = out.ContentType
			}
			if out.SchemaID > 0 {
				a.DataSchema = s.schemaAt + "/schemas/ids/" + strconv.Itoa(out.SchemaID)
			}
		}
	}
	if !s.ce {
		return "", nil
	}
	if s.ceMode == cloudevents.Structured {
		v, err := cloudevents.StructuredValue(nil, a, m.Value)
		if err != nil {
			return ReasonInvalidCloudEvent, err
		}
		m.Value = v
		h := make([]sink.Header, len(m.Headers), len(m.Headers)+1)
		copy(h, m.Headers)
		m.Headers = append(h, cloudevents.StructuredHeader())
		return "", nil
	}
	// A new slice: m.Headers may end where the next record's start in a slab.
	h := make([]sink.Header, len(m.Headers), len(m.Headers)+8)
	copy(h, m.Headers)
	m.Headers = cloudevents.AppendHeaders(h, a)
	return "", nil
}

// headerOf looks the headers of the event being encoded up by key (the
// last of a repeated key).
func (s *Stage) headerOf(key string) (string, bool) {
	hs := s.cur.Headers
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value), hs[i].Value != nil
		}
	}
	return "", false
}
