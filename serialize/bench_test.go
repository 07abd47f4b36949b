package serialize

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
)

const benchAvsc = `{"type":"record","name":"OrderPlaced","namespace":"com.acme","fields":[
 {"name":"order_id","type":"string"},{"name":"customer_id","type":"long"},
 {"name":"total","type":"double"},{"name":"currency","type":"string"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
   {"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}}]}`

const benchJSONSchema = `{"type":"object","properties":{"order_id":{"type":"string"},"customer_id":{"type":"integer"},
 "total":{"type":"number"},"currency":{"type":"string","maxLength":3},"note":{"type":["string","null"]},
 "items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1}},
 "required":["sku","qty"],"additionalProperties":false}}},"required":["order_id","customer_id","total","currency","items"],"additionalProperties":false}`

const benchProto = `syntax = "proto3"; package com.acme;
message OrderPlaced { string order_id = 1; int64 customer_id = 2; double total = 3; string currency = 4;
  optional string note = 5; repeated Line items = 6; }
message Line { string sku = 1; int32 qty = 2; }`

// About 200 bytes, as a typical outbox event.
const benchPayload = `{"order_id":"9f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b","customer_id":1234567,"total":149.95,"currency":"EUR","note":"leave at the door","items":[{"sku":"SKU-0001","qty":2},{"sku":"SKU-0042","qty":1},{"sku":"SKU-0777","qty":3}]}`

func benchEncode(b *testing.B, format, schemaType, schema string) {
	f := newFakeRegistry(b)
	if format != JSON {
		f.add("orders-value", schemaType, schema)
	}
	s, err := New(format, nil, RegistryConfig{URL: f.url()}, zerolog.Nop(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	in := Input{Topic: "orders", Key: []byte("agg-1"), Payload: []byte(benchPayload)}
	ctx := context.Background()
	if _, err := s.Encode(ctx, in); err != nil { // warm the cache
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Encode(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	if f.total.Load() > 1 {
		b.Fatalf("%d registry requests", f.total.Load())
	}
}

func BenchmarkEncodeJSON(b *testing.B)       { benchEncode(b, JSON, "", "") }
func BenchmarkEncodeAvro(b *testing.B)       { benchEncode(b, Avro, "AVRO", benchAvsc) }
func BenchmarkEncodeJSONSchema(b *testing.B) { benchEncode(b, JSONSchema, "JSON", benchJSONSchema) }
func BenchmarkEncodeProtobuf(b *testing.B)   { benchEncode(b, Protobuf, "PROTOBUF", benchProto) }

// A cache hit costs no allocation beyond the codec's own work: Encode
// allocates exactly what encoding the payload with the cached codec does.
func TestCacheHitAllocatesNothingMore(t *testing.T) {
	f := newFakeRegistry(t)
	f.add("orders-value", "AVRO", benchAvsc)
	f.add("carts-value", "JSON", benchJSONSchema)
	f.add("stock-value", "PROTOBUF", benchProto)
	s := newTestSer(t, JSON, map[string]string{"orders": Avro, "carts": JSONSchema, "stock": Protobuf},
		RegistryConfig{URL: f.url(), VersionHeader: "schema_version"})
	ctx := context.Background()
	hdr := func(string) (string, bool) { return "", false }
	for _, topic := range []string{"orders", "carts", "stock", "plain"} {
		in := Input{Topic: topic, Key: []byte("k"), Payload: []byte(benchPayload), Header: hdr}
		if _, err := s.Encode(ctx, in); err != nil {
			t.Fatal(err)
		}
		total := testing.AllocsPerRun(200, func() { _, _ = s.Encode(ctx, in) })
		codecOnly := 0.0
		if e := s.entries[s.keyOf(in)]; e != nil {
			codecOnly = testing.AllocsPerRun(200, func() { _, _ = s.encodeWith(e.codec, in.Payload) })
		}
		if diff := total - codecOnly; diff != 0 && !(raceEnabled && diff >= -1 && diff <= 1) {
			t.Errorf("%s: Encode allocates %v, its codec %v: the cache hit costs %v", topic, total, codecOnly, total-codecOnly)
		}
	}
	if f.total.Load() != 3 {
		t.Fatalf("%d registry requests", f.total.Load())
	}
}
