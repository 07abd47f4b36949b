//go:build e2e

package serialize

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// registryURL is the real registry's Confluent-compatible base URL. No
// registry is a failure, not a skip.
func registryURL(t *testing.T) string {
	u := os.Getenv("OUTBOX_TEST_SCHEMA_REGISTRY_URL")
	if u == "" {
		t.Fatal("OUTBOX_TEST_SCHEMA_REGISTRY_URL is not set: start the registry (test/services.sh) and export its env")
	}
	return strings.TrimSuffix(u, "/")
}

// rawRegistry talks to the registry with net/http only: the test registers
// and fetches schemas without the package's client.
type rawRegistry struct {
	t    *testing.T
	base string
}

func (r rawRegistry) do(method, path string, body any) (int, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, r.base+path, rd)
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (r rawRegistry) register(subject, typ, schema string) int {
	r.t.Helper()
	body := map[string]any{"schema": schema}
	if typ != "AVRO" {
		body["schemaType"] = typ
	}
	st, b := r.do(http.MethodPost, "/subjects/"+subject+"/versions", body)
	var out struct{ ID int }
	if st != 200 || json.Unmarshal(b, &out) != nil || out.ID == 0 {
		r.t.Fatalf("register %s: HTTP %d %s", subject, st, b)
	}
	return out.ID
}

func (r rawRegistry) schemaByID(id int) (text, typ string) {
	r.t.Helper()
	st, b := r.do(http.MethodGet, fmt.Sprintf("/schemas/ids/%d", id), nil)
	var out struct{ Schema, SchemaType string }
	if st != 200 || json.Unmarshal(b, &out) != nil {
		r.t.Fatalf("schema %d: HTTP %d %s", id, st, b)
	}
	return out.Schema, out.SchemaType
}

func TestE2ERealRegistry(t *testing.T) {
	base := registryURL(t)
	raw := rawRegistry{t: t, base: base}
	run := fmt.Sprintf("e2e%d", time.Now().UnixNano())
	tAvro, tJS, tPB := run+".avro", run+".json", run+".pb"

	idAvro := raw.register(tAvro+"-value", "AVRO", orderAvsc)
	idJS := raw.register(tJS+"-value", "JSON", itemJSONSchema)
	idPB := raw.register(tPB+"-value", "PROTOBUF", itemProto)

	reg := prometheus.NewRegistry()
	s, err := New(JSON, map[string]string{tAvro: Avro, tJS: JSONSchema},
		RegistryConfig{URL: base, Key: KeyString, AutoRegister: true, VersionHeader: "schema_version"}, zerolog.New(zerolog.NewTestWriter(t)), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Avro: every kind of field, decoded with hamba and the schema fetched by id.
	avroPayload := `{"id":42,"qty":-7,"price":1.25,"ratio":0.5,"note":"hello","paid":true,"raw":"\u0001\u00ff","status":"PAID",
	 "tags":["a","b"],"attrs":{"x":9007199254740993},"hash":"wxyz","items":[{"sku":"s1","qty":3}],
	 "at":"2024-05-06T07:08:09.123Z","atu":1715000000123456,"day":"2024-02-29","uid":"7d444840-9dc0-11d1-b245-5ffdce74fad2",
	 "amount":"-1234.56","choice":{"long":5},"either":{"int":3}}`
	out, err := s.Encode(ctx, Input{Topic: tAvro, Key: []byte("agg-1"), Payload: []byte(avroPayload)})
	if err != nil {
		t.Fatal(err)
	}
	if id := int(binary.BigEndian.Uint32(out.Value[1:5])); out.Value[0] != 0 || id != idAvro || out.SchemaID != idAvro {
		t.Fatalf("avro header % x, want id %d", out.Value[:5], idAvro)
	}
	text, _ := raw.schemaByID(idAvro)
	sch, err := avro.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(sch, out.Value[5:], &got); err != nil {
		t.Fatalf("hamba cannot read the record: %v", err)
	}
	wantTime := time.Date(2024, 5, 6, 7, 8, 9, 123e6, time.UTC)
	for field, want := range map[string]any{
		"id": int64(42), "qty": -7, "price": 1.25, "ratio": float32(0.5), "note": "hello", "paid": true,
		"raw": []byte{1, 0xff}, "status": "PAID", "tags": []any{"a", "b"}, "attrs": map[string]any{"x": int64(9007199254740993)},
		"hash": [4]byte{'w', 'x', 'y', 'z'}, "items": []any{map[string]any{"sku": "s1", "qty": 3}},
		"uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2", "choice": int64(5), "either": 3, "nothing": nil,
	} {
		if g := got[field]; fmt.Sprintf("%#v", g) != fmt.Sprintf("%#v", want) {
			t.Errorf("avro %s = %#v, want %#v", field, g, want)
		}
	}
	if at, _ := got["at"].(time.Time); !at.Equal(wantTime) {
		t.Errorf("avro at = %v, want %v", got["at"], wantTime)
	}
	if atu, _ := got["atu"].(time.Time); atu.UnixMicro() != 1715000000123456 {
		t.Errorf("avro atu = %v", got["atu"])
	}
	if day, _ := got["day"].(time.Time); day.Format(time.DateOnly) != "2024-02-29" {
		t.Errorf("avro day = %v", got["day"])
	}
	if amt, _ := got["amount"].(*big.Rat); amt == nil || amt.FloatString(2) != "-1234.56" {
		t.Errorf("avro amount = %v", got["amount"])
	}
	// The key: the primitive string schema under <topic>-key.
	keyText, _ := raw.schemaByID(int(binary.BigEndian.Uint32(out.Key[1:5])))
	var key string
	if err := avro.Unmarshal(avro.MustParse(keyText), out.Key[5:], &key); err != nil || key != "agg-1" {
		t.Fatalf("avro key %q (%v), schema %s", key, err, keyText)
	}

	// JSON Schema: the payload's bytes after the header, unchanged.
	jsPayload := []byte(`{"sku":"j1","qty":2}`)
	out, err = s.Encode(ctx, Input{Topic: tJS, Payload: jsPayload})
	if err != nil || out.SchemaID != idJS || !bytes.Equal(out.Value[5:], jsPayload) || int(binary.BigEndian.Uint32(out.Value[1:5])) != idJS {
		t.Fatalf("json_schema: %q %v", out.Value, err)
	}
	var me *MismatchError
	if _, err = s.Encode(ctx, Input{Topic: tJS, Payload: []byte(`{"sku":"j1","qty":0}`)}); !errors.As(err, &me) || me.SchemaID != idJS {
		t.Fatalf("json_schema misfit: %v", err)
	}

	// Protobuf (keys raw: string keys are refused with protobuf): the first
	// message, read with dynamicpb from the schema by id.
	sp, err := New(JSON, map[string]string{tPB: Protobuf}, RegistryConfig{URL: base}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	out, err = sp.Encode(ctx, Input{Topic: tPB, Payload: []byte(`{"sku":"p1","qty":9,"at":"2024-01-02T03:04:05Z"}`)})
	if err != nil || out.SchemaID != idPB {
		t.Fatal(out, err)
	}
	if out.Value[5] != 0 {
		t.Fatalf("message index byte %d, want 0 (first message)", out.Value[5])
	}
	pbText, pbType := raw.schemaByID(idPB)
	if pbType != "PROTOBUF" {
		t.Fatalf("schema type %q", pbType)
	}
	files, err := (&protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"x.proto": pbText})})}).Compile(ctx, "x.proto")
	if err != nil {
		t.Fatal(err)
	}
	msg := dynamicpb.NewMessage(files[0].Messages().Get(0))
	if err := proto.Unmarshal(out.Value[6:], msg); err != nil {
		t.Fatal(err)
	}
	fd := msg.Descriptor().Fields()
	at := msg.Get(fd.ByName("at")).Message()
	if msg.Get(fd.ByName("sku")).String() != "p1" || msg.Get(fd.ByName("qty")).Int() != 9 ||
		at.Get(at.Descriptor().Fields().ByName(protoreflect.Name("seconds"))).Int() != 1704164645 {
		t.Fatalf("protobuf fields: %v", msg)
	}

	// The registry's refusals are mismatches with its words.
	if _, err = s.Encode(ctx, Input{Topic: tAvro, Payload: []byte(avroPayload),
		Header: func(k string) (string, bool) { return "7", k == "schema_version" }}); !errors.As(err, &me) {
		t.Fatalf("unknown version: %v", err)
	} else {
		t.Logf("unknown version: %v", err)
	}
	_, err = s.Encode(ctx, Input{Topic: run + ".missing", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatalf("a json topic: %v", err)
	}
	s2, err := New(Avro, nil, RegistryConfig{URL: base}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err = s2.Encode(ctx, Input{Topic: run + ".nosubject", Payload: []byte(`{}`)}); !errors.As(err, &me) {
		t.Fatalf("unknown subject: %v", err)
	} else {
		t.Logf("unknown subject: %v", err)
	}

	// Decode (the consumers' side) gives the payloads back.
	if j, id, err := s2.Decode(ctx, tJS, append(append([]byte{0}, binary.BigEndian.AppendUint32(nil, uint32(idJS))...), jsPayload...)); err != nil || id != idJS || !bytes.Equal(j, jsPayload) {
		t.Fatalf("Decode json_schema: %s %v", j, err)
	}

	// Cached: 300 more events of the three subjects make no request.
	before := testutil.ToFloat64(s.m.requests.WithLabelValues(resultOK)) + testutil.ToFloat64(sp.m.requests.WithLabelValues(resultOK))
	for i := range 100 {
		for _, in := range []struct {
			s     *Serializer
			topic string
			p     string
		}{{s, tAvro, avroPayload}, {s, tJS, `{"sku":"j","qty":1}`}, {sp, tPB, `{"sku":"p","qty":1}`}} {
			if _, err := in.s.Encode(ctx, Input{Topic: in.topic, Key: []byte(fmt.Sprint(i)), Payload: []byte(in.p)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	after := testutil.ToFloat64(s.m.requests.WithLabelValues(resultOK)) + testutil.ToFloat64(sp.m.requests.WithLabelValues(resultOK))
	if after != before {
		t.Fatalf("%v registry requests for 300 cached events", after-before)
	}

	// Incompatible under BACKWARD: the registry's 409 is a mismatch.
	subject := run + ".compat-value"
	raw.register(subject, "AVRO", itemAvsc)
	if st, b := raw.do(http.MethodPut, "/config/"+subject, map[string]string{"compatibility": "BACKWARD"}); st != 200 {
		t.Fatalf("set compatibility: HTTP %d %s", st, b)
	}
	incompatible := strings.Replace(itemAvsc, `{"name":"qty","type":"int"}`, `{"name":"qty","type":"int"},{"name":"must","type":"string"}`, 1)
	file := writeFile(t, "incompatible.avsc", incompatible)
	s3, err := New(Avro, nil, RegistryConfig{URL: base, AutoRegister: true, Schemas: map[string]string{subject: file}}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if _, err = s3.Encode(ctx, Input{Topic: run + ".compat", Payload: []byte(`{"sku":"a","qty":1,"must":"x"}`)}); !errors.As(err, &me) {
		t.Fatalf("incompatible registration: %v", err)
	} else {
		t.Logf("incompatible registration: %v", err)
	}
}
