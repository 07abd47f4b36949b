package serialize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// Input is one event to serialise.
type Input struct {
	Topic        string
	Key, Payload []byte
	// The event's fields the record name template may use.
	AggregateType, EventType, Schema, Table string
	// Header returns an event header's value (for VersionHeader); nil: none.
	Header func(key string) (string, bool)
}

// Output is a serialised record. SchemaID and Subject are zero for json.
type Output struct {
	Key, Value  []byte
	SchemaID    int
	Subject     string
	ContentType string // for CloudEvents' datacontenttype
}

// MismatchError says the event does not fit its schema (or the registry has
// no schema for it): the relay dead-letters it (reason schema_mismatch).
type MismatchError struct {
	Subject  string
	SchemaID int    // 0 when no schema was found
	Field    string // path in the payload, "" for the whole event
	Err      error
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	b.WriteString("subject ")
	b.WriteString(e.Subject)
	if e.SchemaID != 0 {
		b.WriteString(" (schema id ")
		b.WriteString(strconv.Itoa(e.SchemaID))
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *MismatchError) Unwrap() error { return e.Err }

func contentType(format string) string {
	switch format {
	case Avro:
		return "application/avro"
	case Protobuf:
		return "application/protobuf"
	}
	return "application/json" // json, and json_schema: JSON after the 5-byte header
}

// codec is one compiled schema. Immutable; shared by Encode and Decode.
type codec struct {
	id     int
	text   string // the schema text the registry gave for id
	format string
	avro   *avroCodec
	js     *jsonSchemaCodec
	pb     *protoCodec
}

type codecKey struct {
	id      int
	message string // protobuf: the message Encode writes ("" = first)
}

// subjectKey is what picks a subject's entry without building the subject
// string: only the fields the record name template uses are set.
type subjectKey struct {
	topic, aggregateType, eventType, schema, table string
	version                                        int
	key                                            bool
}

// entry is a subject's resolved schema, owned by the Encode goroutine; a
// refresh goroutine hands a newer one over through next.
type entry struct {
	subject  string
	codec    *codec
	latest   bool         // the subject's latest: refreshed after CacheTTL
	expires  atomic.Int64 // unix nanos; refresh due after it
	busy     atomic.Bool  // a refresh is running
	next     atomic.Pointer[codec]
	recordNm string // protobuf message for record name strategies
	gen      int64  // s.reset when resolved
}

// Serializer encodes events for Kafka. Encode from one goroutine only;
// Format, Decode and Unavailable from any goroutine.
type Serializer struct {
	def      string
	exact    map[string]string
	prefixes []prefixFormat
	cfg      RegistryConfig
	log      zerolog.Logger
	m        *metrics
	client   *sr.Client        // nil without a registry URL
	secrets  []string          // never printed
	files    map[string]string // subject -> schema text
	uses     [5]bool           // placeholders the record name template uses

	entries map[subjectKey]*entry // Encode goroutine only
	// reset counts schema ids seen naming another schema than before (a
	// registry that lost its storage): entries of an older count resolve again.
	reset  atomic.Int64
	codecs sync.Map // codecKey -> *codec

	mu        sync.Mutex
	downSince time.Time
	lastErr   string

	now    func() time.Time
	policy backoff.Policy
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type prefixFormat struct{ prefix, format string }

type metrics struct {
	up         prometheus.Gauge
	requests   *prometheus.CounterVec
	wait       prometheus.Counter
	serialized *prometheus.CounterVec
	mismatches *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_schema_registry_up",
			Help: "1 while the schema registry answers (or none is needed), 0 while events wait for it."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_schema_registry_requests_total",
			Help: "Schema registry requests by result: ok, unavailable (retried), not_found and refused (the event is a schema mismatch)."},
			[]string{"result"}),
		wait: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_schema_registry_wait_seconds_total",
			Help: "Seconds events waited for an unavailable schema registry."}),
		serialized: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_serialized_total",
			Help: "Events serialised, by format."}, []string{"format"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_schema_mismatches_total",
			Help: "Events that did not fit their schema (dead-lettered as schema_mismatch), by format."}, []string{"format"}),
	}
	for _, r := range []string{resultOK, resultUnavailable, resultNotFound, resultRefused} {
		m.requests.WithLabelValues(r)
	}
	m.up.Set(1)
	if reg != nil {
		reg.MustRegister(m.up, m.requests, m.wait, m.serialized, m.mismatches)
	}
	return m
}

const (
	resultOK          = "ok"
	resultUnavailable = "unavailable"
	resultNotFound    = "not_found"
	resultRefused     = "refused"
)

// New validates the configuration, reads the schema files and builds the
// registry client; it does not contact the registry. format is the default
// of every topic; topics overrides it for an exact topic or a "prefix*".
func New(format string, topics map[string]string, cfg RegistryConfig, log zerolog.Logger, reg prometheus.Registerer) (*Serializer, error) {
	if format == "" {
		format = JSON
	}
	formats := []string{format}
	s := &Serializer{def: format, exact: map[string]string{}, cfg: cfg, secrets: secretsOf(cfg),
		log: log.With().Str("component", "serialize").Logger(), entries: map[subjectKey]*entry{},
		files: map[string]string{}, now: time.Now,
		policy: backoff.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}}
	for t, f := range topics {
		formats = append(formats, f)
		if p, ok := strings.CutSuffix(t, "*"); ok {
			s.prefixes = append(s.prefixes, prefixFormat{p, f})
		} else {
			s.exact[t] = f
		}
	}
	// Longest prefix first: "orders.eu*" beats "orders*".
	sort.Slice(s.prefixes, func(i, j int) bool { return len(s.prefixes[i].prefix) > len(s.prefixes[j].prefix) })
	if err := cfg.Validate("schema_registry.", formats); err != nil {
		return nil, err
	}
	if s.cfg.Timeout == 0 {
		s.cfg.Timeout = DefaultTimeout
	}
	if s.cfg.CacheTTL == 0 {
		s.cfg.CacheTTL = DefaultCacheTTL
	}
	if s.cfg.SubjectStrategy == "" {
		s.cfg.SubjectStrategy = TopicName
	}
	if s.cfg.Key == "" {
		s.cfg.Key = KeyRaw
	}
	for i, p := range []string{"{aggregate_type}", "{event_type}", "{schema}", "{table}", "{topic}"} {
		s.uses[i] = strings.Contains(s.cfg.RecordName, p)
	}
	for subject, file := range cfg.Schemas {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("schema_registry.schemas.%s: %w", subject, err)
		}
		s.files[subject] = string(b)
	}
	if cfg.URL != "" {
		cl, err := newClient(s.cfg)
		if err != nil {
			return nil, err
		}
		s.client = cl
	}
	s.m = newMetrics(reg)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Close stops background refreshes and waits for them. Idempotent.
func (s *Serializer) Close() {
	s.cancel()
	s.wg.Wait()
}

// Format is the format of topic's records. Any goroutine.
func (s *Serializer) Format(topic string) string {
	if f, ok := s.exact[topic]; ok {
		return f
	}
	for _, p := range s.prefixes {
		if strings.HasPrefix(topic, p.prefix) {
			return p.format
		}
	}
	return s.def
}

// Unavailable returns since when the registry has not answered and the
// last error (no secrets in it); a zero time while it answers. Any goroutine.
func (s *Serializer) Unavailable() (since time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.downSince.IsZero() {
		return time.Time{}, nil
	}
	return s.downSince, errors.New(s.lastErr)
}

// Encode serialises one event in its topic's format. It blocks while the
// registry is unavailable, retrying until ctx ends (then it returns an
// error wrapping ctx's); an event that does not fit is a *MismatchError.
// One goroutine only (the relay's replication loop).
func (s *Serializer) Encode(ctx context.Context, in Input) (Output, error) {
	format := s.Format(in.Topic)
	if format == JSON {
		s.m.serialized.WithLabelValues(JSON).Inc()
		return Output{Key: in.Key, Value: in.Payload, ContentType: "application/json"}, nil
	}
	k := s.keyOf(in)
	if s.cfg.VersionHeader != "" && in.Header != nil {
		if v, ok := in.Header(s.cfg.VersionHeader); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return Output{}, s.mismatch(format, &MismatchError{Subject: s.subjectOf(in), Err: fmt.Errorf(
					"header %s: %q is not a schema version (a positive integer)", s.cfg.VersionHeader, v)})
			}
			k.version = n
		}
	}
	e := s.entries[k]
	if e != nil && e.gen != s.reset.Load() {
		e = nil
	}
	if e == nil {
		var err error
		if e, err = s.resolve(ctx, format, k, in); err != nil {
			return Output{}, s.mismatch(format, err)
		}
		s.entries[k] = e
	} else if e.latest {
		s.maybeRefresh(format, e)
	}
	out := Output{Key: in.Key, SchemaID: e.codec.id, Subject: e.subject, ContentType: contentType(format)}
	v, err := s.encodeWith(e.codec, in.Payload)
	if err != nil {
		return Output{}, s.mismatch(format, s.asMismatch(e, err))
	}
	out.Value = v
	if s.cfg.Key == KeyString {
		ke := s.entries[subjectKey{topic: in.Topic, key: true}]
		if ke != nil && ke.gen != s.reset.Load() {
			ke = nil
		}
		if ke == nil {
			if ke, err = s.resolveKey(ctx, format, in.Topic); err != nil {
				return Output{}, s.mismatch(format, err)
			}
			s.entries[subjectKey{topic: in.Topic, key: true}] = ke
		}
		if !utf8.Valid(in.Key) {
			return Output{}, s.mismatch(format, &MismatchError{Subject: ke.subject, SchemaID: ke.codec.id, Field: "key",
				Err: errors.New("the key is not valid UTF-8, so not a string")})
		}
		kj, _ := json.Marshal(string(in.Key))
		if out.Key, err = s.encodeWith(ke.codec, kj); err != nil {
			return Output{}, s.mismatch(format, s.asMismatch(ke, err))
		}
	}
	s.m.serialized.WithLabelValues(format).Inc()
	return out, nil
}

func (s *Serializer) mismatch(format string, err error) error {
	var me *MismatchError
	if errors.As(err, &me) {
		s.m.mismatches.WithLabelValues(format).Inc()
	}
	return err
}

func (s *Serializer) asMismatch(e *entry, err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		return &MismatchError{Subject: e.subject, SchemaID: e.codec.id, Field: fe.path, Err: fe}
	}
	return &MismatchError{Subject: e.subject, SchemaID: e.codec.id, Err: err}
}

// encodeWith writes the wire format: magic byte, id, encoded payload.
func (s *Serializer) encodeWith(c *codec, payload []byte) ([]byte, error) {
	b := make([]byte, 5, 5+len(payload)+8)
	b[1], b[2], b[3], b[4] = byte(c.id>>24), byte(c.id>>16), byte(c.id>>8), byte(c.id)
	switch c.format {
	case Avro:
		return c.avro.encode(b, payload)
	case Protobuf:
		return c.pb.encode(b, payload)
	default:
		if err := c.js.validate(payload); err != nil {
			return nil, err
		}
		return append(b, payload...), nil
	}
}

func (s *Serializer) keyOf(in Input) subjectKey {
	k := subjectKey{topic: in.Topic}
	if s.cfg.SubjectStrategy == TopicName {
		return k
	}
	if s.cfg.SubjectStrategy == RecordName && !s.uses[4] {
		k.topic = ""
	}
	if s.uses[0] {
		k.aggregateType = in.AggregateType
	}
	if s.uses[1] {
		k.eventType = in.EventType
	}
	if s.uses[2] {
		k.schema = in.Schema
	}
	if s.uses[3] {
		k.table = in.Table
	}
	return k
}

func (s *Serializer) recordName(in Input) string {
	return strings.NewReplacer("{aggregate_type}", in.AggregateType, "{event_type}", in.EventType,
		"{schema}", in.Schema, "{table}", in.Table, "{topic}", in.Topic).Replace(s.cfg.RecordName)
}

func (s *Serializer) subjectOf(in Input) string {
	switch s.cfg.SubjectStrategy {
	case RecordName:
		return s.recordName(in)
	case TopicRecordName:
		return in.Topic + "-" + s.recordName(in)
	}
	return in.Topic + "-value"
}

func schemaType(format string) sr.SchemaType {
	switch format {
	case JSONSchema:
		return sr.TypeJSON
	case Protobuf:
		return sr.TypeProtobuf
	}
	return sr.TypeAvro
}

// resolve finds the subject's schema (file, header version or latest) and
// compiles it; waits while the registry is unavailable.
func (s *Serializer) resolve(ctx context.Context, format string, k subjectKey, in Input) (*entry, error) {
	subject := s.subjectOf(in)
	e := &entry{subject: subject, gen: s.reset.Load()}
	if s.cfg.SubjectStrategy != TopicName {
		name := s.recordName(in)
		if name == "" || strings.HasSuffix(name, ".") || strings.HasPrefix(name, ".") {
			return nil, &MismatchError{Subject: subject, Err: fmt.Errorf(
				"record name %q (from schema_registry.record_name %q) is not a name: an empty field of the event?", name, s.cfg.RecordName)}
		}
		e.recordNm = name
	}
	if s.client == nil {
		return nil, fmt.Errorf("topic %s: format %s needs schema_registry.url", in.Topic, format)
	}
	var ss sr.SubjectSchema
	if text, ok := s.files[subject]; ok {
		var err error
		if ss, err = s.byContent(ctx, subject, sr.Schema{Schema: text, Type: schemaType(format)}); err != nil {
			return nil, err
		}
	} else {
		version := k.version
		if version == 0 {
			version, e.latest = -1, true
		}
		err := s.call(ctx, subject, func(ctx context.Context) (err error) {
			ss, err = s.client.SchemaByVersion(ctx, subject, version)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	c, err := s.codecFor(ctx, format, ss.ID, ss.Schema, e.recordNm, s.call)
	if err != nil {
		var me *MismatchError
		if errors.As(err, &me) && me.Subject == "" {
			me.Subject = subject
		}
		return nil, err
	}
	e.codec = c
	e.expires.Store(s.now().Add(s.cfg.CacheTTL).UnixNano())
	s.log.Info().Str("topic", in.Topic).Str("subject", subject).Int("schema_id", ss.ID).Int("version", ss.Version).
		Str("format", format).Msg("schema resolved")
	return e, nil
}

// byContent registers (auto_register) or looks up a schema under subject.
func (s *Serializer) byContent(ctx context.Context, subject string, sch sr.Schema) (sr.SubjectSchema, error) {
	var ss sr.SubjectSchema
	err := s.call(ctx, subject, func(ctx context.Context) (err error) {
		if s.cfg.AutoRegister {
			ss = sr.SubjectSchema{Subject: subject}
			ss.ID, err = s.client.RegisterSchema(ctx, subject, sch, -1, -1)
		} else {
			ss, err = s.client.LookupSchema(ctx, subject, sch)
		}
		return err
	})
	if err == nil && ss.Schema.Schema == "" {
		ss.Schema = sch // the registry's answer may omit the text it was given
	}
	var me *MismatchError
	if errors.As(err, &me) && !s.cfg.AutoRegister {
		me.Err = fmt.Errorf("the configured schema is not registered under this subject (%w): register it, or set schema_registry.auto_register", me.Err)
	}
	return ss, err
}

func (s *Serializer) resolveKey(ctx context.Context, format, topic string) (*entry, error) {
	subject := topic + "-key"
	gen := s.reset.Load()
	text := `"string"`
	if format == JSONSchema {
		// With $schema: Apicurio does not take {"type":"string"} for JSON Schema.
		text = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}`
	}
	if s.client == nil {
		return nil, fmt.Errorf("topic %s: format %s needs schema_registry.url", topic, format)
	}
	ss, err := s.byContent(ctx, subject, sr.Schema{Schema: text, Type: schemaType(format)})
	if err != nil {
		return nil, err
	}
	c, err := s.codecFor(ctx, format, ss.ID, ss.Schema, "", s.call)
	if err != nil {
		var me *MismatchError
		if errors.As(err, &me) && me.Subject == "" {
			me.Subject = subject
		}
		return nil, err
	}
	return &entry{subject: subject, codec: c, gen: gen}, nil
}

type caller func(ctx context.Context, subject string, fn func(context.Context) error) error

// codecFor compiles (or finds) the codec of schema id; references are
// fetched through call.
func (s *Serializer) codecFor(ctx context.Context, format string, id int, sch sr.Schema, message string, call caller) (*codec, error) {
	key := codecKey{id: id, message: message}
	old, ok := s.codecs.Load(key)
	if ok && (sch.Schema == "" || old.(*codec).text == sch.Schema) {
		return old.(*codec), nil
	}
	refs, order, err := s.references(ctx, sch.References, call, 0)
	if err != nil {
		return nil, err
	}
	c := &codec{id: id, text: sch.Schema}
	switch sch.Type {
	case sr.TypeAvro:
		c.format = Avro
		c.avro, err = newAvroCodec(sch.Schema, order, refs)
	case sr.TypeJSON:
		c.format = JSONSchema
		c.js, err = newJSONSchemaCodec(sch.Schema, refs)
	case sr.TypeProtobuf:
		c.format = Protobuf
		c.pb, err = newProtoCodec(sch.Schema, refs, message)
	default:
		err = fmt.Errorf("schema type %s is not supported", sch.Type)
	}
	if err == nil && format != "" && c.format != format {
		err = fmt.Errorf("the registry's schema is %s, the topic's format is %s", c.format, format)
	}
	if err != nil {
		return nil, &MismatchError{SchemaID: id, Err: err}
	}
	if ok {
		s.codecs.Store(key, c)
		s.reset.Add(1)
		s.log.Error().Int("schema_id", id).Msg("the registry gives this schema id for another schema than before: it lost its storage? resolving every subject again")
		return c, nil
	}
	got, _ := s.codecs.LoadOrStore(key, c)
	return got.(*codec), nil
}

const maxReferenceDepth = 16

// references fetches the referenced schemas, depth first: order lists the
// names dependencies first (Avro parses them in that order).
func (s *Serializer) references(ctx context.Context, refs []sr.SchemaReference, call caller, depth int) (map[string]string, []string, error) {
	if len(refs) == 0 {
		return nil, nil, nil
	}
	if depth > maxReferenceDepth {
		return nil, nil, fmt.Errorf("schema references nested deeper than %d", maxReferenceDepth)
	}
	texts := map[string]string{}
	var order []string
	for _, r := range refs {
		var ss sr.SubjectSchema
		err := call(ctx, r.Subject, func(ctx context.Context) (err error) {
			ss, err = s.client.SchemaByVersion(ctx, r.Subject, r.Version)
			return err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("reference %s (subject %s version %d): %w", r.Name, r.Subject, r.Version, err)
		}
		sub, subOrder, err := s.references(ctx, ss.References, call, depth+1)
		if err != nil {
			return nil, nil, err
		}
		for _, n := range subOrder {
			if _, ok := texts[n]; !ok {
				texts[n] = sub[n]
				order = append(order, n)
			}
		}
		if _, ok := texts[r.Name]; !ok {
			texts[r.Name] = ss.Schema.Schema
			order = append(order, r.Name)
		}
	}
	return texts, order, nil
}

// maybeRefresh starts a background lookup of e's subject's latest version
// once its TTL passed; Encode keeps using the cached codec meanwhile, and
// after a failure too. The newer codec is taken on a later event.
func (s *Serializer) maybeRefresh(format string, e *entry) {
	if c := e.next.Swap(nil); c != nil {
		if c.id != e.codec.id {
			s.log.Info().Str("subject", e.subject).Int("schema_id", c.id).Int("previous_schema_id", e.codec.id).
				Msg("subject has a new latest schema")
		}
		e.codec = c
	}
	if s.now().UnixNano() < e.expires.Load() || !e.busy.CompareAndSwap(false, true) {
		return
	}
	cachedID := e.codec.id
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer e.busy.Store(false)
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
		defer cancel()
		var ss sr.SubjectSchema
		err := s.once(ctx, e.subject, func(ctx context.Context) (err error) {
			ss, err = s.client.SchemaByVersion(ctx, e.subject, -1)
			return err
		})
		var c *codec
		if err == nil {
			c, err = s.codecFor(ctx, format, ss.ID, ss.Schema, e.recordNm, s.once)
		}
		if err != nil {
			retry := min(s.cfg.CacheTTL, 30*time.Second)
			e.expires.Store(s.now().Add(retry).UnixNano())
			s.log.Warn().Str("subject", e.subject).Int("schema_id", cachedID).Str("error", s.clean(err.Error())).
				Dur("retry_in", retry).Msg("could not refresh the subject's latest schema; keeping the cached one")
			return
		}
		e.expires.Store(s.now().Add(s.cfg.CacheTTL).UnixNano())
		e.next.Store(c)
	}()
}

// Decode reads a record value of topic back to JSON: Avro as JSON, Protobuf
// as protojson, JSON Schema as its JSON; a value without the magic byte is
// returned as it is (schemaID 0). Fetches an unknown schema id once (no
// waiting: a registry error is returned). Any goroutine.
func (s *Serializer) Decode(ctx context.Context, topic string, value []byte) (payloadJSON []byte, schemaID int, err error) {
	if len(value) == 0 || value[0] != 0 {
		return value, 0, nil
	}
	if len(value) < 5 {
		return nil, 0, fmt.Errorf("topic %s: a record value of %d bytes starting with the magic byte 0 is too short", topic, len(value))
	}
	id := int(uint32(value[1])<<24 | uint32(value[2])<<16 | uint32(value[3])<<8 | uint32(value[4]))
	c, err := s.decodeCodec(ctx, id)
	if err != nil {
		return nil, id, fmt.Errorf("topic %s: schema id %d: %w", topic, id, err)
	}
	var out []byte
	switch c.format {
	case Avro:
		out, err = c.avro.decode(value[5:])
	case Protobuf:
		out, err = c.pb.decode(value[5:])
	default:
		out = value[5:]
	}
	if err != nil {
		return nil, id, fmt.Errorf("topic %s: schema id %d: %w", topic, id, err)
	}
	return out, id, nil
}

func (s *Serializer) decodeCodec(ctx context.Context, id int) (*codec, error) {
	if c, ok := s.codecs.Load(codecKey{id: id}); ok {
		return c.(*codec), nil
	}
	if s.client == nil {
		return nil, errors.New("no schema_registry.url to look the schema up")
	}
	var sch sr.Schema
	err := s.once(ctx, "", func(ctx context.Context) (err error) {
		sch, err = s.client.SchemaByID(ctx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.codecFor(ctx, "", id, sch, "", s.once)
}
