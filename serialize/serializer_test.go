package serialize

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

const itemAvsc = `{"type":"record","name":"Item","namespace":"com.acme","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}`

const itemJSONSchema = `{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1}},"required":["sku","qty"],"additionalProperties":false}`

const itemProto = `syntax = "proto3";
package com.acme;
import "google/protobuf/timestamp.proto";
message Item { string sku = 1; int32 qty = 2; google.protobuf.Timestamp at = 3; }
message Envelope {
  message ItemAdded { string sku = 1; int64 qty = 2; }
  message ItemRemoved { string sku = 1; }
  string id = 1;
}
`

// syncBuffer is a log sink safe for the refresh goroutine's writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testSer struct {
	*Serializer
	reg *prometheus.Registry
	log *syncBuffer
}

func newTestSer(t *testing.T, format string, topics map[string]string, cfg RegistryConfig) testSer {
	t.Helper()
	reg := prometheus.NewRegistry()
	buf := &syncBuffer{}
	s, err := New(format, topics, cfg, zerolog.New(buf), reg)
	if err != nil {
		t.Fatal(err)
	}
	s.policy.Initial, s.policy.Max = 5*time.Millisecond, 20*time.Millisecond
	t.Cleanup(s.Close)
	return testSer{s, reg, buf}
}

func wireID(t *testing.T, v []byte) int {
	t.Helper()
	if len(v) < 5 || v[0] != 0 {
		t.Fatalf("not the wire format: % x", v)
	}
	return int(binary.BigEndian.Uint32(v[1:5]))
}

func TestJSONPassThroughAndFormats(t *testing.T) {
	s := newTestSer(t, JSON, map[string]string{"orders*": Avro, "orders.eu*": JSONSchema, "billing": Protobuf},
		RegistryConfig{URL: "http://127.0.0.1:1"})
	for topic, want := range map[string]string{"x": JSON, "orders": Avro, "orders.us": Avro, "orders.eu.1": JSONSchema, "billing": Protobuf, "billing2": JSON} {
		if got := s.Format(topic); got != want {
			t.Errorf("Format(%q) = %s, want %s", topic, got, want)
		}
	}
	payload := []byte(`{"not":"checked"}`)
	out, err := s.Encode(context.Background(), Input{Topic: "x", Key: []byte("k"), Payload: payload})
	if err != nil || !bytes.Equal(out.Value, payload) || string(out.Key) != "k" || out.SchemaID != 0 || out.ContentType != "application/json" {
		t.Fatalf("json pass-through: %+v, %v", out, err)
	}
	v, id, err := s.Decode(context.Background(), "x", payload)
	if err != nil || id != 0 || !bytes.Equal(v, payload) {
		t.Fatalf("Decode of plain JSON: %s %d %v", v, id, err)
	}
}

// One registry round trip per subject, not per event; the base URL's path
// is kept; Decode fetches an unknown id once.
func TestOneRoundTripPerSubject(t *testing.T) {
	f := newFakeRegistry(t)
	idA := f.add("orders-value", "AVRO", itemAvsc)
	idJ := f.add("carts-value", "JSON", itemJSONSchema)
	idP := f.add("stock-value", "PROTOBUF", itemProto)
	s := newTestSer(t, Avro, map[string]string{"carts": JSONSchema, "stock": Protobuf}, RegistryConfig{URL: f.url()})
	ctx := context.Background()
	for i := range 300 {
		for _, tc := range []struct {
			topic string
			id    int
			ct    string
		}{{"orders", idA, "application/avro"}, {"carts", idJ, "application/json"}, {"stock", idP, "application/protobuf"}} {
			out, err := s.Encode(ctx, Input{Topic: tc.topic, Payload: []byte(fmt.Sprintf(`{"sku":"a%d","qty":%d}`, i, i+1))})
			if err != nil {
				t.Fatalf("%s: %v", tc.topic, err)
			}
			if wireID(t, out.Value) != tc.id || out.SchemaID != tc.id || out.Subject != tc.topic+"-value" || out.ContentType != tc.ct {
				t.Fatalf("%s: %+v, want id %d", tc.topic, out, tc.id)
			}
		}
	}
	if got := f.total.Load(); got != 3 {
		t.Fatalf("%d registry requests for 900 events of 3 subjects, want 3", got)
	}
	for _, p := range []string{"/subjects/orders-value/versions/latest", "/subjects/carts-value/versions/latest", "/subjects/stock-value/versions/latest"} {
		if n := f.count("GET " + p); n != 1 {
			t.Errorf("GET %s%s: %d requests, want 1", basePath, p, n)
		}
	}
	if got := testutil.ToFloat64(s.m.serialized.WithLabelValues(Avro)); got != 300 {
		t.Errorf("serialized_total{avro} = %v", got)
	}
	// A second serializer (a consumer) decodes by id: one GET per id.
	d := newTestSer(t, JSON, nil, RegistryConfig{URL: f.url()})
	out, _ := s.Encode(ctx, Input{Topic: "stock", Payload: []byte(`{"sku":"z","qty":3,"at":"2024-01-02T03:04:05Z"}`)})
	for range 3 {
		j, id, err := d.Decode(ctx, "stock", out.Value)
		if err != nil || id != idP || string(j) != `{"sku":"z","qty":3,"at":"2024-01-02T03:04:05Z"}` && !strings.Contains(string(j), `"at":"2024-01-02T03:04:05Z"`) {
			t.Fatalf("Decode = %s, %d, %v", j, id, err)
		}
	}
	if n := f.count(fmt.Sprintf("GET /schemas/ids/%d", idP)); n != 1 {
		t.Fatalf("GET /schemas/ids/%d: %d requests, want 1", idP, n)
	}
}

func TestVersionHeader(t *testing.T) {
	f := newFakeRegistry(t)
	v1 := f.add("orders-value", "AVRO", itemAvsc)
	v2 := f.add("orders-value", "AVRO", strings.Replace(itemAvsc, `{"name":"qty","type":"int"}`, `{"name":"qty","type":"int"},{"name":"note","type":"string","default":""}`, 1))
	s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), VersionHeader: "schema_version"})
	hdr := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) { return v, k == "schema_version" && v != "" }
	}
	ctx := context.Background()
	for _, tc := range []struct {
		header string
		id     int
		err    string
	}{{"1", v1, ""}, {"2", v2, ""}, {"", v2, ""}, {"1", v1, ""}, {"3", 0, "Version 3 not found"}, {"x", 0, `header schema_version: "x" is not a schema version`}, {"0", 0, "not a schema version"}, {"-2", 0, "not a schema version"}} {
		out, err := s.Encode(ctx, Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`), Header: hdr(tc.header)})
		if tc.err != "" {
			var me *MismatchError
			if !errors.As(err, &me) || !strings.Contains(err.Error(), tc.err) || me.Subject != "orders-value" {
				t.Fatalf("header %q: %v, want a mismatch %q", tc.header, err, tc.err)
			}
			continue
		}
		if err != nil || out.SchemaID != tc.id {
			t.Fatalf("header %q: id %d, %v; want %d", tc.header, out.SchemaID, err, tc.id)
		}
	}
	if n := f.count("GET /subjects/orders-value/versions/1"); n != 1 {
		t.Fatalf("version 1 fetched %d times, want 1 (cached)", n)
	}
	if got := testutil.ToFloat64(s.m.mismatches.WithLabelValues(Avro)); got != 4 {
		t.Fatalf("mismatches = %v, want 4", got)
	}
}

// Statuses that mean "the registry cannot serve now" make Encode wait; the
// registry's refusals are mismatches.
func TestRegistryErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		wait   bool
		err    string
	}{
		{500, `{"error_code":50001,"message":"store unavailable"}`, true, "HTTP 500"},
		{503, ``, true, "HTTP 503"},
		{429, `{"error_code":429,"message":"slow down"}`, true, "HTTP 429"},
		{408, ``, true, "HTTP 408"},
		{401, `{"error_code":401,"message":"Unauthorized"}`, true, "HTTP 401"},
		{403, `{"error_code":403,"message":"Forbidden"}`, true, "HTTP 403"},
		{404, `{"error_code":40401,"message":"Subject 'orders-value' not found."}`, false, "Subject 'orders-value' not found."},
		{404, `{"error_code":40402,"message":"Version not found."}`, false, "Version not found."},
		{422, `{"error_code":42201,"message":"Invalid schema"}`, false, "Invalid schema"},
		{409, `{"error_code":409,"message":"incompatible"}`, false, "incompatible"},
	} {
		t.Run(fmt.Sprint(tc.status, tc.body), func(t *testing.T) {
			f := newFakeRegistry(t)
			id := f.add("orders-value", "AVRO", itemAvsc)
			f.fail.Store(int32(tc.status))
			f.failBody.Store(&tc.body)
			s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url()})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := s.Encode(ctx, Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)})
			var me *MismatchError
			if !tc.wait {
				if !errors.As(err, &me) || !strings.Contains(me.Error(), tc.err) || f.total.Load() != 1 {
					t.Fatalf("got %v after %d requests, want one request and a mismatch with %q", err, f.total.Load(), tc.err)
				}
				if since, _ := s.Unavailable(); !since.IsZero() {
					t.Fatal("a refusal marked the registry unavailable")
				}
				return
			}
			if err == nil || errors.As(err, &me) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want it to wait until the deadline, naming %q", err, tc.err)
			}
			if time.Since(start) < 250*time.Millisecond || f.total.Load() < 3 {
				t.Fatalf("returned after %v and %d requests: it did not wait and retry", time.Since(start), f.total.Load())
			}
			since, uerr := s.Unavailable()
			if since.IsZero() || uerr == nil || !strings.Contains(uerr.Error(), tc.err) {
				t.Fatalf("Unavailable() = %v, %v", since, uerr)
			}
			if testutil.ToFloat64(s.m.up) != 0 || testutil.ToFloat64(s.m.requests.WithLabelValues(resultUnavailable)) < 3 || testutil.ToFloat64(s.m.wait) < 0.2 {
				t.Fatalf("metrics: up %v, unavailable %v, wait %v", testutil.ToFloat64(s.m.up),
					testutil.ToFloat64(s.m.requests.WithLabelValues(resultUnavailable)), testutil.ToFloat64(s.m.wait))
			}
			// The registry comes back: the next Encode succeeds, readiness clears.
			f.fail.Store(0)
			out, err := s.Encode(context.Background(), Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)})
			if err != nil || out.SchemaID != id {
				t.Fatalf("after recovery: %+v %v", out, err)
			}
			if since, _ := s.Unavailable(); !since.IsZero() || testutil.ToFloat64(s.m.up) != 1 {
				t.Fatal("still unavailable after an answer")
			}
		})
	}
}

// A registry down for a while: Encode waits through it and then delivers
// in the registry's format, never another one.
func TestEncodeWaitsForRegistry(t *testing.T) {
	f := newFakeRegistry(t)
	id := f.add("orders-value", "AVRO", itemAvsc)
	f.fail.Store(503)
	s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url()})
	time.AfterFunc(400*time.Millisecond, func() { f.fail.Store(0) })
	start := time.Now()
	out, err := s.Encode(context.Background(), Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)})
	took := time.Since(start)
	if err != nil || wireID(t, out.Value) != id {
		t.Fatalf("%+v %v", out, err)
	}
	if took < 400*time.Millisecond || testutil.ToFloat64(s.m.wait) < 0.35 {
		t.Fatalf("returned after %v, wait counter %v: it did not wait", took, testutil.ToFloat64(s.m.wait))
	}
}

func TestNoSecretsInErrorsLogsOrString(t *testing.T) {
	const pw = "s3cr3t-Pa55"
	f := newFakeRegistry(t)
	f.add("orders-value", "AVRO", itemAvsc)
	// A hostile registry echoes the Authorization header and the password.
	body := `{"error_code":50001,"message":"denied for {auth} with ` + pw + `"}`
	f.failBody.Store(&body)
	f.fail.Store(500)
	u := strings.Replace(f.url(), "http://", "http://alice:"+pw+"@", 1)
	for _, cfg := range []RegistryConfig{{URL: u}, {URL: f.url(), Username: "alice", Password: pw}} {
		s := newTestSer(t, Avro, nil, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := s.Encode(ctx, Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)})
		cancel()
		_, uerr := s.Unavailable()
		if a := f.auth.Load(); a == nil || !strings.HasPrefix(*a, "Basic ") {
			t.Fatal("no basic auth sent")
		}
		auth := *f.auth.Load()
		for what, text := range map[string]string{"Encode error": fmt.Sprint(err), "Unavailable": fmt.Sprint(uerr), "log": s.log.String(), "String()": cfg.String()} {
			if strings.Contains(text, pw) || strings.Contains(text, strings.TrimPrefix(auth, "Basic ")) {
				t.Errorf("%s leaks the secret: %s", what, text)
			}
		}
		if !strings.Contains(fmt.Sprint(uerr), "HTTP 500") {
			t.Errorf("Unavailable lost the error: %v", uerr)
		}
	}
	// Validate names a bad URL without its userinfo.
	err := RegistryConfig{URL: "ftp://bob:" + pw + "@host"}.Validate("schema_registry.", []string{Avro})
	if err == nil || strings.Contains(err.Error(), pw) || !strings.Contains(err.Error(), "schema_registry.url") {
		t.Fatalf("Validate: %v", err)
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSchemaFileLookupAndAutoRegister(t *testing.T) {
	file := writeFile(t, "item.avsc", itemAvsc)
	in := Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)}
	ctx := context.Background()

	f := newFakeRegistry(t)
	s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), Schemas: map[string]string{"orders-value": file}})
	_, err := s.Encode(ctx, in)
	var me *MismatchError
	if !errors.As(err, &me) || me.Subject != "orders-value" || !strings.Contains(err.Error(), "auto_register") {
		t.Fatalf("unregistered file schema: %v", err)
	}

	s = newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), Schemas: map[string]string{"orders-value": file}, AutoRegister: true})
	out, err := s.Encode(ctx, in)
	if err != nil || f.count("POST /subjects/orders-value/versions") != 1 || f.badCT.Load() != 0 {
		t.Fatalf("auto register: %+v %v, %d registrations, %d POSTs without the registry content type", out, err,
			f.count("POST /subjects/orders-value/versions"), f.badCT.Load())
	}
	// Registered now: a plain lookup finds it; a newer latest does not matter.
	f.add("orders-value", "AVRO", `{"type":"record","name":"Other","fields":[]}`)
	s = newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), Schemas: map[string]string{"orders-value": file}})
	out2, err := s.Encode(ctx, in)
	if err != nil || out2.SchemaID != out.SchemaID || f.count("POST /subjects/orders-value") != 2 {
		t.Fatalf("lookup: %+v %v (want id %d)", out2, err, out.SchemaID)
	}

	// Refusals of a registration are mismatches carrying the registry's words.
	for _, tc := range []struct{ text, want string }{{`{"type":"record","name":"INVALID","fields":[]}`, "Invalid schema"},
		{`{"type":"record","name":"INCOMPATIBLE","fields":[]}`, "incompatible"}} {
		s = newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), Schemas: map[string]string{"bad-value": writeFile(t, "bad.avsc", tc.text)}, AutoRegister: true})
		_, err = s.Encode(ctx, Input{Topic: "bad", Payload: []byte(`{}`)})
		if !errors.As(err, &me) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("registration refused: %v, want %q", err, tc.want)
		}
	}
}

func TestRecordNameStrategiesAndProtobufMessages(t *testing.T) {
	f := newFakeRegistry(t)
	f.add("com.acme.Item", "PROTOBUF", itemProto)
	f.add("stock-com.acme.Envelope.ItemAdded", "PROTOBUF", itemProto)
	ctx := context.Background()

	s := newTestSer(t, Protobuf, nil, RegistryConfig{URL: f.url(), SubjectStrategy: RecordName, RecordName: "com.acme.{event_type}"})
	out, err := s.Encode(ctx, Input{Topic: "stock", EventType: "Item", Payload: []byte(`{"sku":"a","qty":2}`)})
	if err != nil || out.Subject != "com.acme.Item" || out.Value[5] != 0 {
		t.Fatalf("record_name: %+v %v", out, err)
	}
	_, err = s.Encode(ctx, Input{Topic: "stock", EventType: "", Payload: []byte(`{}`)})
	var me *MismatchError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "is not a name") {
		t.Fatalf("empty record name: %v", err)
	}

	s = newTestSer(t, Protobuf, nil, RegistryConfig{URL: f.url(), SubjectStrategy: TopicRecordName, RecordName: "com.acme.Envelope.{event_type}"})
	out, err = s.Encode(ctx, Input{Topic: "stock", EventType: "ItemAdded", Payload: []byte(`{"sku":"a","qty":"7"}`)})
	if err != nil || out.Subject != "stock-com.acme.Envelope.ItemAdded" {
		t.Fatalf("topic_record_name: %+v %v", out, err)
	}
	// Nested message Envelope.ItemAdded = indexes [1, 0]: count 2, then 1, 0 as zig-zag varints.
	if !bytes.Equal(out.Value[5:8], []byte{4, 2, 0}) {
		t.Fatalf("message indexes % x, want 04 02 00", out.Value[5:8])
	}
	d := newTestSer(t, JSON, nil, RegistryConfig{URL: f.url()})
	j, _, err := d.Decode(ctx, "stock", out.Value)
	if err != nil || string(j) != `{"sku":"a","qty":"7"}` {
		t.Fatalf("Decode = %s %v", j, err)
	}
	// Unknown field and a message the schema lacks: mismatches.
	_, err = s.Encode(ctx, Input{Topic: "stock", EventType: "ItemAdded", Payload: []byte(`{"sku":"a","extra":1}`)})
	if !errors.As(err, &me) || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Fatalf("unknown protobuf field: %v", err)
	}
	f.add("stock-com.acme.Nope", "PROTOBUF", itemProto)
	s2 := newTestSer(t, Protobuf, nil, RegistryConfig{URL: f.url(), SubjectStrategy: TopicRecordName, RecordName: "com.acme.{event_type}"})
	_, err = s2.Encode(ctx, Input{Topic: "stock", EventType: "Nope", Payload: []byte(`{}`)})
	if !errors.As(err, &me) || !strings.Contains(err.Error(), `has no message "com.acme.Nope"`) {
		t.Fatalf("missing message: %v", err)
	}
}

// Referenced schemas are fetched from their subjects (a reference of a
// reference too) and used: Protobuf imports, Avro named types, JSON Schema $refs.
func TestSchemaReferences(t *testing.T) {
	f := newFakeRegistry(t)
	f.add("base.proto", "PROTOBUF", `syntax = "proto3"; package com.acme; message Money { int64 cents = 1; }`)
	f.addRefs("item.proto", "PROTOBUF", `syntax = "proto3"; package com.acme; import "base.proto"; message Line { string sku = 1; Money price = 2; }`,
		`{"name":"base.proto","subject":"base.proto","version":1}`)
	f.addRefs("orders-value", "PROTOBUF", `syntax = "proto3"; package com.acme; import "item.proto"; message Order { repeated Line lines = 1; }`,
		`{"name":"item.proto","subject":"item.proto","version":1}`)
	f.add("com.acme.Money", "AVRO", `{"type":"record","name":"Money","namespace":"com.acme","fields":[{"name":"cents","type":"long"}]}`)
	f.addRefs("carts-value", "AVRO", `{"type":"record","name":"Cart","namespace":"com.acme","fields":[{"name":"total","type":"com.acme.Money"}]}`,
		`{"name":"com.acme.Money","subject":"com.acme.Money","version":1}`)
	f.add("item.json", "JSON", itemJSONSchema)
	f.addRefs("lists-value", "JSON", `{"type":"array","items":{"$ref":"item.json"}}`, `{"name":"item.json","subject":"item.json","version":1}`)
	s := newTestSer(t, Protobuf, map[string]string{"carts": Avro, "lists": JSONSchema}, RegistryConfig{URL: f.url()})
	ctx := context.Background()
	out, err := s.Encode(ctx, Input{Topic: "orders", Payload: []byte(`{"lines":[{"sku":"a","price":{"cents":"150"}}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if j, _, err := s.Decode(ctx, "orders", out.Value); err != nil || string(j) != `{"lines":[{"sku":"a","price":{"cents":"150"}}]}` {
		t.Fatalf("Decode = %s %v", j, err)
	}
	if _, err := s.Encode(ctx, Input{Topic: "carts", Payload: []byte(`{"total":{"cents":5}}`)}); err != nil {
		t.Fatal(err)
	}
	var me *MismatchError
	if _, err := s.Encode(ctx, Input{Topic: "carts", Payload: []byte(`{"total":{"cents":"5"}}`)}); !errors.As(err, &me) || me.Field != "total.cents" {
		t.Fatalf("referenced Avro type not applied: %v", err)
	}
	if _, err := s.Encode(ctx, Input{Topic: "lists", Payload: []byte(`[{"sku":"a","qty":0}]`)}); !errors.As(err, &me) || !strings.Contains(err.Error(), "minimum") {
		t.Fatalf("referenced JSON Schema not applied: %v", err)
	}
}

func TestKeyAsString(t *testing.T) {
	f := newFakeRegistry(t)
	f.add("orders-value", "AVRO", itemAvsc)
	f.add("carts-value", "JSON", itemJSONSchema)
	s := newTestSer(t, Avro, map[string]string{"carts": JSONSchema}, RegistryConfig{URL: f.url(), Key: KeyString, AutoRegister: true})
	ctx := context.Background()
	out, err := s.Encode(ctx, Input{Topic: "orders", Key: []byte("agg-1"), Payload: []byte(`{"sku":"a","qty":1}`)})
	if err != nil || !bytes.Equal(out.Key[5:], append([]byte{10}, "agg-1"...)) {
		t.Fatalf("avro key: % x %v", out.Key, err)
	}
	out, err = s.Encode(ctx, Input{Topic: "carts", Key: []byte("agg-1"), Payload: []byte(`{"sku":"a","qty":1}`)})
	if err != nil || string(out.Key[5:]) != `"agg-1"` {
		t.Fatalf("json_schema key: %q %v", out.Key, err)
	}
	if f.count("POST /subjects/orders-key/versions") != 1 || f.count("POST /subjects/carts-key/versions") != 1 {
		t.Fatal("key schemas not registered once each")
	}
	_, err = s.Encode(ctx, Input{Topic: "carts", Key: []byte("\xff"), Payload: []byte(`{"sku":"a","qty":1}`)})
	var me *MismatchError
	if !errors.As(err, &me) || me.Field != "key" {
		t.Fatalf("invalid UTF-8 key: %v", err)
	}
}

// After the TTL a failed refresh keeps the cached schema and never blocks
// Encode; a later successful one brings the new latest.
func TestStaleSchemaKeptWhenRefreshFails(t *testing.T) {
	f := newFakeRegistry(t)
	v1 := f.add("orders-value", "AVRO", itemAvsc)
	s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), CacheTTL: time.Minute})
	var mu sync.Mutex
	now := time.Now()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	in := Input{Topic: "orders", Payload: []byte(`{"sku":"a","qty":1}`)}
	ctx := context.Background()
	if out, err := s.Encode(ctx, in); err != nil || out.SchemaID != v1 {
		t.Fatal(out, err)
	}
	f.fail.Store(503)
	advance(2 * time.Minute)
	before := f.total.Load()
	for range 50 {
		start := time.Now()
		out, err := s.Encode(ctx, in)
		if err != nil || out.SchemaID != v1 || time.Since(start) > 50*time.Millisecond {
			t.Fatalf("stale cache: %+v %v after %v", out, err, time.Since(start))
		}
	}
	waitFor(t, func() bool { return strings.Contains(s.log.String(), "keeping the cached one") })
	if n := f.total.Load() - before; n != 1 {
		t.Fatalf("%d refresh requests for 50 events, want 1 (then wait 30 s)", n)
	}
	f.fail.Store(0)
	v2 := f.add("orders-value", "AVRO", strings.Replace(itemAvsc, `"Item"`, `"Item2"`, 1))
	advance(time.Minute)
	waitFor(t, func() bool {
		out, err := s.Encode(ctx, in)
		return err == nil && out.SchemaID == v2
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	f := newFakeRegistry(t)
	f.add("orders-value", "AVRO", orderAvsc)
	f.add("carts-value", "JSON", itemJSONSchema)
	s := newTestSer(t, Avro, map[string]string{"carts": JSONSchema}, RegistryConfig{URL: f.url()})
	ctx := context.Background()
	payload := `{"id":1,"qty":2,"price":3.5,"paid":true,"status":"PAID","choice":{"string":"x"},"note":"n","amount":"1.25"}`
	out, err := s.Encode(ctx, Input{Topic: "orders", Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 { // Decode from several goroutines (-race)
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, _, err := s.Decode(ctx, "orders", out.Value)
			if err != nil || !strings.Contains(string(j), `"choice":{"string":"x"}`) || !strings.Contains(string(j), `"amount":1.25`) {
				t.Errorf("Decode = %s %v", j, err)
			}
		}()
	}
	wg.Wait()
	out, err = s.Encode(ctx, Input{Topic: "carts", Payload: []byte(`{"sku":"a","qty":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if j, _, err := s.Decode(ctx, "carts", out.Value); err != nil || string(j) != `{"sku":"a","qty":1}` {
		t.Fatalf("json_schema Decode = %s %v", j, err)
	}
	if _, _, err := s.Decode(ctx, "carts", []byte{0, 0, 0}); err == nil {
		t.Fatal("a 3-byte value with the magic byte decoded")
	}
	if _, _, err := s.Decode(ctx, "carts", []byte{0, 0, 0, 3, 232, 1}); err == nil || !strings.Contains(err.Error(), "schema id 1000") {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := RegistryConfig{URL: "http://r:8081/apis/ccompat/v7"}
	if err := ok.Validate("schema_registry.", []string{Avro, JSON}); err != nil {
		t.Fatal(err)
	}
	if err := (RegistryConfig{}).Validate("schema_registry.", []string{JSON}); err != nil {
		t.Fatalf("json needs no registry: %v", err)
	}
	for _, tc := range []struct {
		cfg     RegistryConfig
		formats []string
		want    string
	}{
		{RegistryConfig{}, []string{Avro}, "schema_registry.url: required"},
		{RegistryConfig{URL: "r:8081"}, []string{Avro}, "schema_registry.url: "},
		{RegistryConfig{URL: "http://r"}, []string{"xml"}, `unknown serialization format "xml"`},
		{RegistryConfig{URL: "http://r", SubjectStrategy: "x"}, []string{Avro}, "schema_registry.subject_strategy:"},
		{RegistryConfig{URL: "http://r", SubjectStrategy: RecordName}, []string{Avro}, "schema_registry.record_name: required"},
		{RegistryConfig{URL: "http://r", SubjectStrategy: RecordName, RecordName: "a.{evt}"}, []string{Avro}, "unknown placeholder {evt}"},
		{RegistryConfig{URL: "http://r", Key: KeyString}, []string{Protobuf}, "schema_registry.key: string keys are not supported with protobuf"},
		{RegistryConfig{URL: "http://r", Key: "int"}, []string{Avro}, "schema_registry.key:"},
		{RegistryConfig{URL: "http://r", Password: "p"}, []string{Avro}, "schema_registry.password: is set without schema_registry.username"},
		{RegistryConfig{URL: "http://r", Timeout: -1}, []string{Avro}, "schema_registry.timeout"},
		{RegistryConfig{URL: "http://r", CacheTTL: -1}, []string{Avro}, "schema_registry.cache_ttl"},
		{RegistryConfig{URL: "http://r", Schemas: map[string]string{"s": "/nonexistent.avsc"}}, []string{Avro}, "schema_registry.schemas: subject \"s\""},
		{RegistryConfig{URL: "http://r", TLS: TLSConfig{CertFile: "/x"}}, []string{Avro}, "schema_registry.tls.cert_file: needs schema_registry.tls.key_file too"},
		{RegistryConfig{URL: "http://r", TLS: TLSConfig{CAFile: "/nonexistent.pem"}}, []string{Avro}, "schema_registry.tls.ca_file:"},
	} {
		err := tc.cfg.Validate("schema_registry.", tc.formats)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
