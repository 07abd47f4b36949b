//go:build e2e && formats

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/serialize"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// The long suite of issue 39 (make formats; not compiled by make test):
// each feature of the Schema Registry serialisation and CloudEvents,
// checked as a consumer of another stack reads it. The schema is fetched
// from the registry by the id in the record and decoded with hamba/avro or
// compiled with protocompile and read with dynamicpb (the relay's own
// encoder is never used to check itself).

// --- registry and decoding helpers --------------------------------------------

// subjectVersion reads GET <base>/subjects/<subject>/versions/<version>
// ("latest" or a number): the schema id, or found false on a 404.
func subjectVersion(t *testing.T, base, subject, version string) (id int, schema string, found bool) {
	t.Helper()
	u := strings.TrimSuffix(base, "/") + "/subjects/" + url.PathEscape(subject) + "/versions/" + version
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return 0, "", false
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d: %s", u, resp.StatusCode, b)
	}
	var out struct {
		ID     int    `json:"id"`
		Schema string `json:"schema"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("GET %s: %s: %v", u, b, err)
	}
	return out.ID, out.Schema, true
}

// schemaIDStatus is GET <base>/schemas/ids/<id>'s status and body, for an
// id that may be unknown.
func schemaIDStatus(t *testing.T, base string, id int) (int, string) {
	t.Helper()
	u := fmt.Sprintf("%s/schemas/ids/%d", strings.TrimSuffix(base, "/"), id)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	return resp.StatusCode, string(b)
}

// avroReader decodes wire-format records with the schema fetched by id.
type avroReader struct {
	url    string
	codecs map[int]avro.Schema
}

func newAvroReader(url string) *avroReader {
	return &avroReader{url: url, codecs: map[int]avro.Schema{}}
}

// decode splits b (a value or key) and decodes its body into out.
func (a *avroReader) decode(t *testing.T, what string, b []byte, out any) int {
	t.Helper()
	if len(b) < 5 || b[0] != 0 {
		t.Fatalf("%s %q is not in the Schema Registry wire format (magic byte 0, 4-byte id)", what, testkit.Tail(string(b), 80))
	}
	id := int(b[1])<<24 | int(b[2])<<16 | int(b[3])<<8 | int(b[4])
	sc, ok := a.codecs[id]
	if !ok {
		kind, text := testkit.SchemaByID(t, a.url, id)
		if kind != "AVRO" {
			t.Fatalf("%s: schema id %d is %s, want AVRO", what, id, kind)
		}
		var err error
		if sc, err = avro.Parse(text); err != nil {
			t.Fatalf("%s: schema id %d: %v", what, id, err)
		}
		a.codecs[id] = sc
	}
	if err := avro.Unmarshal(sc, b[5:], out); err != nil {
		t.Fatalf("%s: Avro decode with schema %d: %v", what, id, err)
	}
	return id
}

// rowID is the record's outbox_id header.
func rowID(t *testing.T, rec record) int64 {
	t.Helper()
	id, err := strconv.ParseInt(rec.Headers["outbox_id"], 10, 64)
	if err != nil {
		t.Fatalf("%s/%d@%d: outbox_id header %q: %v", rec.Topic, rec.Partition, rec.Offset, rec.Headers["outbox_id"], err)
	}
	return id
}

// eventIDOf is a row's event_id column.
func (e *env) eventIDOf(t *testing.T, id int64) string {
	t.Helper()
	var s string
	if err := e.DB.QueryRow(context.Background(), "SELECT event_id::text FROM "+e.Table+" WHERE id = $1", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// deadLetters reads n dead letters and checks each is a schema_mismatch
// whose dlq.error holds want[row id].
func deadLetters(t *testing.T, dlq string, want map[int64]string) {
	t.Helper()
	letters := consume(t, []string{dlq}, len(want), 60*time.Second, 2*time.Second)
	if len(letters) != len(want) {
		t.Fatalf("%d dead letters in %s, want %d", len(letters), dlq, len(want))
	}
	logged := map[string]bool{}
	for _, l := range letters {
		id, _ := strconv.ParseInt(l.Headers["dlq.event_id"], 10, 64)
		if id == 0 {
			id, _ = strconv.ParseInt(l.Headers["outbox_id"], 10, 64)
		}
		word, ok := want[id]
		if !ok || l.Headers["dlq.reason"] != "schema_mismatch" || !strings.Contains(l.Headers["dlq.error"], word) {
			t.Errorf("dead letter of row %d (headers %v): want reason schema_mismatch and an error naming %q", id, l.Headers, word)
		} else if !logged[word] {
			logged[word] = true
			t.Logf("dead letter of row %d: %s", id, l.Headers["dlq.error"])
		}
	}
}

// --- a. Protobuf, record_name strategy ----------------------------------------

// The message a record is written as: the second and third top-level
// messages, so the message-index array is not Confluent's [0] shorthand.
const orderProto = `syntax = "proto3";
package com.acme;

import "google/protobuf/timestamp.proto";

enum Status {
  STATUS_UNKNOWN = 0;
  PLACED = 1;
  SHIPPED = 2;
}

message Money {
  string currency = 1;
  int64 cents = 2;
}

message OrderPlaced {
  message Line {
    string sku = 1;
    int32 qty = 2;
  }
  string order_id = 1;
  Status status = 2;
  repeated Line lines = 3;
  google.protobuf.Timestamp placed_at = 4;
  Money total = 5;
}

message OrderShipped {
  string order_id = 1;
  Status status = 2;
  google.protobuf.Timestamp shipped_at = 3;
}
`

type protoLine struct {
	Sku string `json:"sku"`
	Qty int32  `json:"qty"`
}

type protoOrder struct {
	OrderID   string      `json:"order_id"`
	Status    string      `json:"status"`
	Lines     []protoLine `json:"lines,omitempty"`
	PlacedAt  string      `json:"placed_at,omitempty"`
	ShippedAt string      `json:"shipped_at,omitempty"`
	Total     *struct {
		Currency string `json:"currency"`
		Cents    int64  `json:"cents"`
	} `json:"total,omitempty"`
}

// readProto decodes a Protobuf wire-format value independently: the
// schema text by id compiled with protocompile, the message-index array
// read varint by varint (protowire), the body with dynamicpb.
func readProto(t *testing.T, base string, files map[int]protoreflect.FileDescriptor, v []byte) (id int, indexes []int, m *dynamicpb.Message) {
	t.Helper()
	if len(v) < 6 || v[0] != 0 {
		t.Fatalf("value %q is not in the Schema Registry wire format", testkit.Tail(string(v), 80))
	}
	id = int(v[1])<<24 | int(v[2])<<16 | int(v[3])<<8 | int(v[4])
	fd, ok := files[id]
	if !ok {
		kind, text := testkit.SchemaByID(t, base, id)
		if kind != "PROTOBUF" {
			t.Fatalf("schema id %d is %s, want PROTOBUF", id, kind)
		}
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"schema.proto": text})})}
		fs, err := c.Compile(context.Background(), "schema.proto")
		if err != nil {
			t.Fatalf("compile schema %d: %v", id, err)
		}
		fd = fs[0]
		files[id] = fd
	}
	rest := v[5:]
	n, l := protowire.ConsumeVarint(rest)
	if l < 0 {
		t.Fatalf("message-index count: bad varint in % x", rest[:min(8, len(rest))])
	}
	rest = rest[l:]
	count := int(protowire.DecodeZigZag(n))
	if count == 0 { // Confluent's shorthand for [0]
		indexes = []int{0}
	}
	for range count {
		x, l := protowire.ConsumeVarint(rest)
		if l < 0 {
			t.Fatalf("message index: bad varint")
		}
		rest = rest[l:]
		indexes = append(indexes, int(protowire.DecodeZigZag(x)))
	}
	msgs := fd.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range indexes {
		if i >= msgs.Len() {
			t.Fatalf("message index %v not in schema %d", indexes, id)
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	m = dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(rest, m); err != nil {
		t.Fatalf("decode %s (schema %d, indexes %v): %v", md.FullName(), id, indexes, err)
	}
	return id, indexes, m
}

func field(m protoreflect.Message, name string) protoreflect.Value {
	return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name)))
}

func tsOf(m protoreflect.Message) time.Time {
	return time.Unix(field(m, "seconds").Int(), field(m, "nanos").Int()).UTC()
}

// A Protobuf topic under the record_name strategy (record_name
// "com.acme.{event_type}"): the subject is the message's full name, each
// record carries that subject's id and the message-index array of its
// message ([1] OrderPlaced, [2] OrderShipped, as varints 02 02 and 02 04),
// and decodes field by field (a nested repeated message, an enum, a
// google.protobuf.Timestamp, a message field). An event type without a
// subject and a payload with an unknown field are dead-lettered with
// schema_mismatch.
func TestFormatsProtobufRecordName(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "fpb")
	topic, dlq := e.Prefix+".order", e.Prefix+".dlq"
	ids := map[string]int{}
	for _, msg := range []string{"OrderPlaced", "OrderShipped"} {
		ids[msg] = testkit.RegisterSchema(t, url, "com.acme."+msg, "PROTOBUF", orderProto)
	}
	e.startRelay("--dlq-topic", dlq, "--schema-registry-url", url, "--serialization", "protobuf",
		"--schema-registry-subject-strategy", "record_name", "--schema-registry-record-name", "com.acme.{event_type}")

	want := map[int64]protoOrder{}
	types := map[int64]string{}
	base := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for i := range 30 {
		var o protoOrder
		typ := "OrderPlaced"
		if i%3 == 2 {
			typ = "OrderShipped"
			o = protoOrder{OrderID: fmt.Sprintf("o-%d", i), Status: "SHIPPED", ShippedAt: base.Add(time.Duration(i)*time.Second + 250*time.Millisecond).Format(time.RFC3339Nano)}
		} else {
			o = protoOrder{OrderID: fmt.Sprintf("o-%d \"ü\"", i), Status: "PLACED",
				Lines:    []protoLine{{Sku: "sku-a", Qty: int32(i)}, {Sku: fmt.Sprintf("sku-%d", i), Qty: -int32(i)}},
				PlacedAt: base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano)}
			o.Total = &struct {
				Currency string `json:"currency"`
				Cents    int64  `json:"cents"`
			}{"EUR", int64(i) * 1_000_000_007}
		}
		p, _ := json.Marshal(o)
		id := e.insertRow(t, "order", fmt.Sprintf("order-%d", i%4), typ, string(p), `{}`)
		want[id], types[id] = o, typ
	}
	bad := map[int64]string{
		e.insertRow(t, "order", "order-1", "OrderCancelled", `{"order_id": "o-x"}`, `{}`):             "com.acme.OrderCancelled",
		e.insertRow(t, "order", "order-1", "OrderPlaced", `{"order_id": "o-y", "smuggled": 1}`, `{}`): "smuggled",
	}

	rs := consume(t, []string{topic}, len(want), 90*time.Second, 3*time.Second)
	if len(rs) != len(want) {
		t.Fatalf("read %d records, want %d", len(rs), len(want))
	}
	files := map[int]protoreflect.FileDescriptor{}
	for _, rec := range rs {
		id := rowID(t, rec)
		w, ok := want[id]
		if !ok {
			t.Fatalf("record of row %d, not a good row", id)
		}
		typ := types[id]
		wantIdx := map[string][]int{"OrderPlaced": {1}, "OrderShipped": {2}}[typ]
		// The bytes after the id, as Confluent writes them: count 1, then
		// the index, zig-zag varints.
		if got, wantBytes := rec.Value[5:7], []byte{2, byte(2 * wantIdx[0])}; string(got) != string(wantBytes) {
			t.Errorf("row %d (%s): message-index bytes % x, want % x", id, typ, got, wantBytes)
		}
		schemaID, idx, m := readProto(t, url, files, rec.Value)
		if schemaID != ids[typ] {
			t.Errorf("row %d (%s): schema id %d, want %d (subject com.acme.%s)", id, typ, schemaID, ids[typ], typ)
		}
		if !slices.Equal(idx, wantIdx) || string(m.Descriptor().FullName()) != "com.acme."+typ {
			t.Errorf("row %d: message %s at %v, want com.acme.%s at %v", id, m.Descriptor().FullName(), idx, typ, wantIdx)
		}
		if got := field(m, "order_id").String(); got != w.OrderID {
			t.Errorf("row %d: order_id %q, want %q", id, got, w.OrderID)
		}
		st := field(m, "status").Enum()
		if name := string(m.Descriptor().Fields().ByName("status").Enum().Values().ByNumber(st).Name()); name != w.Status {
			t.Errorf("row %d: status %s (%d), want %s", id, name, st, w.Status)
		}
		if typ == "OrderShipped" {
			if ts, _ := time.Parse(time.RFC3339Nano, w.ShippedAt); !tsOf(field(m, "shipped_at").Message()).Equal(ts) {
				t.Errorf("row %d: shipped_at %s, want %s", id, tsOf(field(m, "shipped_at").Message()), ts)
			}
			continue
		}
		lines := field(m, "lines").List()
		if lines.Len() != len(w.Lines) {
			t.Fatalf("row %d: %d lines, want %d", id, lines.Len(), len(w.Lines))
		}
		for j, wl := range w.Lines {
			l := lines.Get(j).Message()
			if field(l, "sku").String() != wl.Sku || int32(field(l, "qty").Int()) != wl.Qty {
				t.Errorf("row %d: line %d = %s/%d, want %s/%d", id, j, field(l, "sku").String(), field(l, "qty").Int(), wl.Sku, wl.Qty)
			}
		}
		if ts, _ := time.Parse(time.RFC3339Nano, w.PlacedAt); !tsOf(field(m, "placed_at").Message()).Equal(ts) {
			t.Errorf("row %d: placed_at %s, want %s", id, tsOf(field(m, "placed_at").Message()), ts)
		}
		total := field(m, "total").Message()
		if field(total, "currency").String() != w.Total.Currency || field(total, "cents").Int() != w.Total.Cents {
			t.Errorf("row %d: total %s %d, want %s %d", id, field(total, "currency").String(), field(total, "cents").Int(), w.Total.Currency, w.Total.Cents)
		}
	}
	deadLetters(t, dlq, bad)
	if _, _, found := subjectVersion(t, url, "com.acme.OrderCancelled", "latest"); found {
		t.Errorf("subject com.acme.OrderCancelled exists: the relay registered it without auto_register")
	}
	t.Logf("%d Protobuf records decoded field by field (schema ids %v), %d dead-lettered", len(rs), ids, len(bad))
}

// --- b. version_header ----------------------------------------------------------

const versionedV1 = `{"type":"record","name":"Versioned","namespace":"com.acme","fields":[
 {"name":"order_id","type":"string"},{"name":"qty","type":"int"}]}`

const versionedV2 = `{"type":"record","name":"Versioned","namespace":"com.acme","fields":[
 {"name":"order_id","type":"string"},{"name":"qty","type":"int"},
 {"name":"currency","type":"string","default":"EUR"}]}`

// schema_registry.version_header schema_version: a row's schema_version
// header picks the subject's version; rows of version 1 and 2 carry those
// versions' ids and decode with them; no header is the latest; version 99
// is dead-lettered with schema_mismatch.
func TestFormatsVersionHeader(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "fver")
	topic, dlq := e.Prefix+".order", e.Prefix+".dlq"
	id1 := testkit.RegisterSchema(t, url, topic+"-value", "AVRO", versionedV1)
	id2 := testkit.RegisterSchema(t, url, topic+"-value", "AVRO", versionedV2)
	if id1 == id2 {
		t.Fatalf("both versions got schema id %d", id1)
	}
	if v1, _, _ := subjectVersion(t, url, topic+"-value", "1"); v1 != id1 {
		t.Fatalf("version 1 of %s-value is id %d, want %d", topic, v1, id1)
	}
	e.startRelay("--dlq-topic", dlq, "--schema-registry-url", url, "--serialization", "avro",
		"--schema-registry-version-header", "schema_version")

	wantID := map[int64]int{}
	payload := map[int64]string{}
	for i := range 30 {
		var p, h string
		switch i % 3 {
		case 0:
			p, h = fmt.Sprintf(`{"order_id": "o-%d", "qty": %d}`, i, i), `{"schema_version": "1"}`
		case 1:
			p, h = fmt.Sprintf(`{"order_id": "o-%d", "qty": %d, "currency": "USD"}`, i, i), `{"schema_version": 2}`
		case 2:
			p, h = fmt.Sprintf(`{"order_id": "o-%d", "qty": %d, "currency": "CHF"}`, i, i), `{}`
		}
		id := e.insertRow(t, "order", fmt.Sprintf("order-%d", i%5), "order.placed", p, h)
		payload[id] = p
		wantID[id] = map[int]int{0: id1, 1: id2, 2: id2}[i%3]
	}
	bad := map[int64]string{
		e.insertRow(t, "order", "order-1", "order.placed", `{"order_id": "o-99", "qty": 1}`, `{"schema_version": "99"}`): "99",
	}
	rs := consume(t, []string{topic}, len(payload), 90*time.Second, 3*time.Second)
	if len(rs) != len(payload) {
		t.Fatalf("read %d records, want %d", len(rs), len(payload))
	}
	ar := newAvroReader(url)
	seen := map[int]int{}
	for _, rec := range rs {
		id := rowID(t, rec)
		var got map[string]any
		sid := ar.decode(t, fmt.Sprintf("row %d", id), rec.Value, &got)
		seen[sid]++
		if sid != wantID[id] {
			t.Errorf("row %d (schema_version header %q): schema id %d, want %d", id, rec.Headers["schema_version"], sid, wantID[id])
		}
		var w map[string]any
		_ = json.Unmarshal([]byte(payload[id]), &w)
		if got["order_id"] != w["order_id"] || got["qty"] != int(w["qty"].(float64)) {
			t.Errorf("row %d: decoded %v, want %v", id, got, w)
		}
		if _, v2 := got["currency"]; v2 != (sid == id2) || (v2 && got["currency"] != w["currency"]) {
			t.Errorf("row %d: decoded %v with schema %d, want %v", id, got, sid, w)
		}
	}
	deadLetters(t, dlq, bad)
	t.Logf("records by schema id: %v (version 1 = %d, version 2 = %d); version 99 dead-lettered", seen, id1, id2)
}

// --- c. key string --------------------------------------------------------------

// schema_registry.key string: the key is the Avro string "string" under
// <topic>-key in the wire format and decodes to the aggregate id; all
// records of an aggregate on one partition (murmur2 of the key bytes as
// written, what a Java producer with the same serializer picks), in order.
func TestFormatsStringKey(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "fkey")
	topic := e.Prefix + ".order"
	if err := testkit.CreateTopics(brokers, 4, nil, topic); err != nil {
		t.Fatal(err)
	}
	testkit.RegisterSchema(t, url, topic+"-value", "AVRO", orderAvro)
	e.startRelay("--schema-registry-url", url, "--serialization", "avro", "--schema-registry-key", "string",
		"--schema-registry-auto-register=true")

	var ids []int64
	for i := range 80 {
		p := fmt.Sprintf(`{"order_id": "o-%d", "amount": 1.5, "qty": %d, "note": null, "tags": []}`, i, i)
		ids = append(ids, e.insertRow(t, "order", fmt.Sprintf("agg-%d-ü", i%9), "order.placed", p, `{}`))
	}
	rs := consume(t, []string{topic}, len(ids), 90*time.Second, 3*time.Second)
	if len(rs) != len(ids) {
		t.Fatalf("read %d records, want %d", len(rs), len(ids))
	}
	keyID, _, found := subjectVersion(t, url, topic+"-key", "latest")
	if !found {
		t.Fatalf("no subject %s-key in the registry", topic)
	}
	ar := newAvroReader(url)
	partOf := map[string]int32{}
	last := map[string]int64{}
	usedParts := map[int32]bool{}
	for _, rec := range rs {
		id := rowID(t, rec)
		var key string
		if kid := ar.decode(t, fmt.Sprintf("row %d key", id), []byte(rec.Key), &key); kid != keyID {
			t.Errorf("row %d: key schema id %d, want %d (%s-key)", id, kid, keyID, topic)
		}
		agg := rec.Headers["aggregate_id"]
		if key != agg || !strings.HasPrefix(key, "agg-") {
			t.Errorf("row %d: key decodes to %q, want the aggregate id %q", id, key, agg)
		}
		var v map[string]any
		ar.decode(t, fmt.Sprintf("row %d value", id), rec.Value, &v)
		if p, ok := partOf[agg]; ok && p != rec.Partition {
			t.Errorf("aggregate %s on partitions %d and %d", agg, p, rec.Partition)
		}
		partOf[agg] = rec.Partition
		usedParts[rec.Partition] = true
		if want := testkit.Partition([]byte(rec.Key), 4); want != rec.Partition {
			t.Errorf("row %d: partition %d, murmur2 of the key as written gives %d", id, rec.Partition, want)
		}
		if id <= last[agg] {
			t.Errorf("aggregate %s: row %d after row %d", agg, id, last[agg])
		}
		last[agg] = id
	}
	if len(usedParts) < 2 {
		t.Errorf("9 aggregates all on partition(s) %v: the partition check proves nothing", usedParts)
	}
	t.Logf("%d records, key schema id %d, %d aggregates over %d partitions", len(rs), keyID, len(partOf), len(usedParts))
}

// --- d. schemas + auto_register -------------------------------------------------

// schema_registry.schemas names a schema file for a subject the registry
// lacks: with auto_register the relay registers it (the subject's id is
// the records' id, its text the file's); without, the same config
// dead-letters every event with schema_mismatch naming the subject, and
// the subject stays absent.
func TestFormatsSchemasFileAutoRegister(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	file := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(file, []byte(orderAvro), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, auto := range []bool{true, false} {
		t.Run(fmt.Sprintf("auto_register=%v", auto), func(t *testing.T) {
			e := newEnv(t, fmt.Sprintf("fauto%v", auto))
			topic, dlq := e.Prefix+".order", e.Prefix+".dlq"
			subject := topic + "-value"
			if _, _, found := subjectVersion(t, url, subject, "latest"); found {
				t.Fatalf("subject %s exists before the relay ran", subject)
			}
			args := []string{"--dlq-topic", dlq, "--schema-registry-url", url, "--serialization-topics", topic + "=avro",
				"--schema-registry-schemas", subject + "=" + file}
			if auto {
				// Bare, like the other boolean flags (--kafka-auto-create-topics).
				args = append(args, "--schema-registry-auto-register")
			}
			e.startRelay(args...)
			payload := map[int64]string{}
			for i := range 10 {
				p := fmt.Sprintf(`{"order_id": "o-%d", "amount": %d.5, "qty": %d, "note": "n", "tags": ["t"]}`, i, i, i)
				payload[e.insertRow(t, "order", "order-1", "order.placed", p, `{}`)] = p
			}
			if !auto {
				want := map[int64]string{}
				for id := range payload {
					want[id] = subject
				}
				deadLetters(t, dlq, want)
				if rs, err := testkit.ReadUntil(brokers, []string{topic}, 1, 3*time.Second, time.Second); err == nil && len(rs) > 0 {
					t.Errorf("%d records on %s without auto_register", len(rs), topic)
				}
				if _, _, found := subjectVersion(t, url, subject, "latest"); found {
					t.Errorf("subject %s was registered without auto_register", subject)
				}
				return
			}
			rs := consume(t, []string{topic}, len(payload), 90*time.Second, 3*time.Second)
			if len(rs) != len(payload) {
				t.Fatalf("read %d records, want %d", len(rs), len(payload))
			}
			sid, text, found := subjectVersion(t, url, subject, "latest")
			if !found {
				t.Fatalf("subject %s not registered by the relay", subject)
			}
			if a, b := avro.MustParse(text), avro.MustParse(orderAvro); a.Fingerprint() != b.Fingerprint() {
				t.Errorf("subject %s holds %s, want the file's schema", subject, text)
			}
			ar := newAvroReader(url)
			for _, rec := range rs {
				id := rowID(t, rec)
				var got map[string]any
				if rid := ar.decode(t, fmt.Sprintf("row %d", id), rec.Value, &got); rid != sid {
					t.Errorf("row %d: schema id %d, want the registered %d", id, rid, sid)
				}
				var w map[string]any
				_ = json.Unmarshal([]byte(payload[id]), &w)
				if got["order_id"] != w["order_id"] || got["amount"] != w["amount"] {
					t.Errorf("row %d: decoded %v, want %v", id, got, w)
				}
			}
			t.Logf("subject %s registered by the relay as id %d; %d records decode with it", subject, sid, len(rs))
		})
	}
}

// --- e. exactly-once with Avro --------------------------------------------------

// The writer's payload (testkit.Writer) as an Avro record.
const writerAvro = `{"type":"record","name":"Written","namespace":"com.acme","fields":[
 {"name":"aggregate","type":"string"},{"name":"seq","type":"int"},{"name":"txn","type":"long"},
 {"name":"note","type":"string"},{"name":"amount","type":"double"}]}`

// delivery exactly_once with avro: 2,000 events in multi-event
// transactions, read with read_committed, decode with the schema by id;
// after decoding back to the payload's fields testkit.Check finds none
// lost, duplicated, out of order or in the wrong partition.
func TestFormatsExactlyOnceAvro(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "feos")
	for _, tp := range e.topics() {
		testkit.RegisterSchema(t, url, tp+"-value", "AVRO", writerAvro)
	}
	r := e.startRelay(e.eosFlags("--schema-registry-url", url, "--serialization", "avro")...)
	w := e.newWriter(391)
	if err := w.run(context.Background(), 2000, 20, 40, 0, ""); err != nil {
		t.Fatal(err)
	}
	ws := w.written()
	rs := consumeCommitted(t, e.topics(), len(ws), 90*time.Second, 3*time.Second)
	ar := newAvroReader(url)
	for i, rec := range rs {
		var v struct {
			Aggregate string  `avro:"aggregate" json:"aggregate"`
			Seq       int     `avro:"seq" json:"seq"`
			Txn       int64   `avro:"txn" json:"txn"`
			Note      string  `avro:"note" json:"note"`
			Amount    float64 `avro:"amount" json:"amount"`
		}
		ar.decode(t, fmt.Sprintf("%s/%d@%d", rec.Topic, rec.Partition, rec.Offset), rec.Value, &v)
		if v.Note != `café "quoted"` {
			t.Errorf("%s/%d@%d: note %q", rec.Topic, rec.Partition, rec.Offset, v.Note)
		}
		rs[i].Value, _ = json.Marshal(v) // what testkit.Check reads
	}
	requireClean(t, check(t, ws, rs, e.partitions(t)), false)
	if n := r.metric("outbox_relay_kafka_transactions_total"); n < 1 {
		t.Errorf("outbox_relay_kafka_transactions_total = %v: not exactly-once", n)
	}
	t.Logf("%d events exactly once through Avro in %v Kafka transactions", len(ws), r.metric("outbox_relay_kafka_transactions_total"))
}

// --- f. replay ------------------------------------------------------------------

// outbox-relay replay of an Avro topic's rows: the replayed copies are in
// the wire format with the same schema id, decode to the rows' payloads,
// and carry outbox_replay.
func TestFormatsReplayAvro(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "frep")
	topic := e.Prefix + ".order"
	testkit.RegisterSchema(t, url, topic+"-value", "AVRO", orderAvro)
	flags := []string{"--schema-registry-url", url, "--serialization-topics", topic + "=avro"}
	r := e.startRelay(flags...)
	payload := map[int64]string{}
	var first, last int64
	for i := range 20 {
		p := fmt.Sprintf(`{"order_id": "o-%d", "amount": %d.75, "qty": %d, "note": null, "tags": ["r"]}`, i, i, i)
		id := e.insertRow(t, "order", fmt.Sprintf("order-%d", i%3), "order.placed", p, `{}`)
		payload[id] = p
		if first == 0 {
			first = id
		}
		last = id
	}
	consume(t, []string{topic}, len(payload), 60*time.Second, 2*time.Second)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	if code, out := e.replay(2*time.Minute, append(flags, "--from-id", strconv.FormatInt(first, 10), "--to-id", strconv.FormatInt(last, 10))...); code != 0 {
		t.Fatalf("replay exit %d:\n%s", code, testkit.Tail(out, 3000))
	}
	rs := consume(t, []string{topic}, 2*len(payload), 60*time.Second, 2*time.Second)
	if len(rs) != 2*len(payload) {
		t.Fatalf("read %d records, want %d (each row by the relay and by the replay)", len(rs), 2*len(payload))
	}
	ar := newAvroReader(url)
	replayed, ids := 0, map[bool]int{}
	for _, rec := range rs {
		id := rowID(t, rec)
		var got map[string]any
		sid := ar.decode(t, fmt.Sprintf("row %d (outbox_replay %q)", id, rec.Headers["outbox_replay"]), rec.Value, &got)
		_, isReplay := rec.Headers["outbox_replay"]
		if isReplay {
			replayed++
		}
		if prev, ok := ids[isReplay]; ok && prev != sid {
			t.Errorf("row %d: schema id %d, other copies %d", id, sid, prev)
		}
		ids[isReplay] = sid
		var w map[string]any
		_ = json.Unmarshal([]byte(payload[id]), &w)
		if got["order_id"] != w["order_id"] || got["amount"] != w["amount"] || fmt.Sprint(got["tags"]) != fmt.Sprint(w["tags"]) {
			t.Errorf("row %d: decoded %v, want %v", id, got, w)
		}
	}
	if replayed != len(payload) {
		t.Errorf("%d records carry outbox_replay, want %d", replayed, len(payload))
	}
	t.Logf("%d rows replayed in the wire format (schema id %d, the relay's %d)", replayed, ids[true], ids[false])
}

// --- g. inbox -------------------------------------------------------------------

// The inbox library with Config.Decoder = a serialize.Serializer reads the
// relay's Avro topic: the handler gets each row's payload JSON (equal as a
// value: numbers, a null and a string in a union, an array) and the
// schema id, each event once.
func TestFormatsInboxDecodesAvro(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "finbox")
	topic := e.Prefix + ".order"
	sid := testkit.RegisterSchema(t, url, topic+"-value", "AVRO", orderAvro)
	e.startRelay("--schema-registry-url", url, "--serialization-topics", topic+"=avro")
	payload := map[string]string{} // event_id -> payload
	for i := range 30 {
		note := "null"
		if i%2 == 0 {
			note = fmt.Sprintf(`"note \"%d\" é"`, i)
		}
		p := fmt.Sprintf(`{"order_id": "o-%d", "amount": %d.125, "qty": %d, "note": %s, "tags": ["a", "t%d"]}`, i, i, -i, note, i)
		payload[e.eventIDOf(t, e.insertRow(t, "order", fmt.Sprintf("order-%d", i%4), "order.placed", p, `{}`))] = p
	}
	ser, err := serialize.New(serialize.Avro, nil, serialize.RegistryConfig{URL: url}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ser.Close()
	ie := newInboxEnv(t, e.DB, e.Schema)
	cfg := ie.config(topic)
	cfg.Decoder = ser
	var mu sync.Mutex
	got := map[string][]*inbox.Message{}
	c := startConsumer(t, cfg, e.DB, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		mu.Lock()
		got[m.EventID] = append(got[m.EventID], m)
		mu.Unlock()
		return ie.charge(ctx, tx, m)
	})
	c.waitConsumed(t, int64(len(payload)), 90*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for id, p := range payload {
		ms := got[id]
		if len(ms) != 1 {
			t.Errorf("event %s handled %d times, want once", id, len(ms))
			continue
		}
		m := ms[0]
		var a, b any
		_ = json.Unmarshal(m.Payload, &a)
		_ = json.Unmarshal([]byte(p), &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("event %s: handler payload %s, want the row's %s", id, m.Payload, p)
		}
		if m.SchemaID != sid || len(m.Value) < 5 || m.Value[0] != 0 {
			t.Errorf("event %s: schema id %d (want %d), value %q (want the wire format)", id, m.SchemaID, sid, testkit.Tail(string(m.Value), 40))
		}
	}
	t.Logf("%d events handled with their payload JSON (schema id %d)", len(got), sid)
}

// --- h. registry stopped --------------------------------------------------------

// The registry STOPPED (not paused: connection refused, storage lost) for
// 20 s while the relay runs, reached through a proxy the test closes while
// it is down and opens once the schemas are registered again (a registry
// with persistent storage comes back with them; Apicurio's in-memory one
// comes back empty). Events of a subject already cached keep flowing;
// events of a new subject wait (and, in commit order, the events after
// them), then arrive, readable through the restarted registry. The cached
// subject's records keep the old id after the restart (until cache_ttl):
// the test reads what that id means in the new registry.
//
// Not parallel: it stops the registry every test shares.
func TestFormatsRegistryStoppedCachedAndNewSubject(t *testing.T) {
	url := testkit.SchemaRegistryURL(t)
	e := newEnv(t, "fstop")
	cached, fresh := e.Prefix+".cached", e.Prefix+".fresh"
	freshAvro := `{"type":"record","name":"Fresh","namespace":"com.acme.fstop","fields":[{"name":"n","type":"int"},{"name":"s","type":"string"}]}`
	// An empty registry and three other schemas first: the cached
	// subject's id is one the restarted registry does not give out below.
	restartOnFailure(t, url)
	testkit.RegistryStop(t)
	testkit.RegistryStart(t)
	for i := range 3 {
		testkit.RegisterSchema(t, url, fmt.Sprintf("%s.other%d-value", e.Prefix, i), "AVRO",
			fmt.Sprintf(`{"type":"record","name":"Other%d","fields":[{"name":"x","type":"int"}]}`, i))
	}
	oldID := testkit.RegisterSchema(t, url, cached+"-value", "AVRO", orderAvro)
	u, err := neturlParse(url)
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, "127.0.0.1:0", u.Host)
	viaProxy := strings.Replace(url, u.Host, px.Addr(), 1)
	r := e.startRelay("--schema-registry-url", viaProxy, "--serialization", "avro", "--schema-registry-timeout", "2s")

	insert := func(agg string, n int, from int) []int64 {
		var ids []int64
		for i := from; i < from+n; i++ {
			p := fmt.Sprintf(`{"order_id": "o-%d", "amount": 1.5, "qty": %d, "note": null, "tags": []}`, i, i)
			if agg == "fresh" {
				p = fmt.Sprintf(`{"n": %d, "s": "s-%d"}`, i, i)
			}
			ids = append(ids, e.insertRow(t, agg, agg+"-1", agg+".happened", p, `{}`))
		}
		return ids
	}
	before := insert("cached", 5, 0)
	consume(t, []string{cached}, len(before), 60*time.Second, time.Second)

	testkit.RegistryStop(t)
	stopped := time.Now()
	if err := px.Refuse(); err != nil {
		t.Fatal(err)
	}
	px.Reset()
	during := insert("cached", 10, 5)
	rs := consume(t, []string{cached}, len(before)+len(during), 20*time.Second, time.Second)
	if len(rs) != len(before)+len(during) {
		t.Fatalf("cached subject: %d records with the registry stopped, want %d: the cache did not carry them", len(rs), len(before)+len(during))
	}
	flowed := time.Since(stopped)
	freshIDs := insert("fresh", 10, 0)
	after := insert("cached", 5, 15)
	waitFor(t, 20*time.Second, "the relay to say it waits for the registry", func() bool {
		code, body := r.get("/readyz")
		return code == 503 && strings.Contains(body, "schema registry") && r.metric("outbox_relay_schema_registry_up") == 0
	})
	time.Sleep(time.Until(stopped.Add(20 * time.Second)))
	if rs, err := testkit.ReadUntil(brokers, []string{fresh}, 1, 2*time.Second, time.Second); err == nil && len(rs) > 0 {
		t.Fatalf("%d records of the new subject published while the registry was stopped (first %q)", len(rs), rs[0].Value)
	}
	heldBack := len(consume(t, []string{cached}, 0, 2*time.Second, time.Second)) - len(before) - len(during)

	testkit.RegistryStart(t)
	downFor := time.Since(stopped)
	// Back empty: the schemas again before the relay can look. They get
	// ids below the cached one (TestFormatsRegistryResetReusedSchemaID is
	// the new subject getting the cached id).
	newCached := testkit.RegisterSchema(t, url, cached+"-value", "AVRO", orderAvro)
	newFresh := testkit.RegisterSchema(t, url, fresh+"-value", "AVRO", freshAvro)
	if newFresh == oldID {
		t.Fatalf("precondition: the new subject got id %d, the id the relay cached for %s", newFresh, cached)
	}
	if err := px.Heal(); err != nil {
		t.Fatal(err)
	}
	fs := consume(t, []string{fresh}, len(freshIDs), 60*time.Second, 2*time.Second)
	if len(fs) != len(freshIDs) {
		t.Fatalf("new subject: %d records after the registry came back, want %d", len(fs), len(freshIDs))
	}
	ar := newAvroReader(url)
	for i, rec := range fs {
		if rowID(t, rec) != freshIDs[i] {
			t.Fatalf("new subject: record %d is row %d, want %d", i, rowID(t, rec), freshIDs[i])
		}
		var v struct {
			N int    `avro:"n"`
			S string `avro:"s"`
		}
		if sid := ar.decode(t, fmt.Sprintf("row %d", freshIDs[i]), rec.Value, &v); sid != newFresh || v.N != i || v.S != fmt.Sprintf("s-%d", i) {
			t.Errorf("new subject row %d: schema %d (want %d) %+v", freshIDs[i], sid, newFresh, v)
		}
	}
	cs := consume(t, []string{cached}, len(before)+len(during)+len(after), 60*time.Second, 2*time.Second)
	if len(cs) != len(before)+len(during)+len(after) {
		t.Fatalf("cached subject: %d records, want %d", len(cs), len(before)+len(during)+len(after))
	}
	all := append(append(append([]int64{}, before...), during...), after...)
	var afterIDs []int // the ids of the cached subject's records after the restart
	for i, rec := range cs {
		if rowID(t, rec) != all[i] {
			t.Fatalf("cached subject: record %d is row %d, want %d (one key: commit order)", i, rowID(t, rec), all[i])
		}
		id, _ := wireOf(t, rec)
		switch {
		case i < len(before)+len(during) && id != oldID:
			t.Errorf("cached subject row %d: schema id %d, want the cached %d", all[i], id, oldID)
		case i >= len(before)+len(during):
			afterIDs = append(afterIDs, id)
		}
	}
	status, body := schemaIDStatus(t, url, oldID)
	t.Logf("registry stopped %s: %d cached-subject events flowed within %s; %d new-subject and %d later cached-subject events held back, then delivered",
		downFor.Round(100*time.Millisecond), len(during), flowed.Round(100*time.Millisecond), len(freshIDs), len(after)-heldBack)
	t.Logf("operator note: after the restart the cached subject's records carry ids %v (cached before: %d); the new registry gives the subject id %d, and GET /schemas/ids/%d answers %d %s",
		afterIDs, oldID, newCached, oldID, status, testkit.Tail(body, 200))
	if n := r.metric("outbox_relay_schema_registry_wait_seconds_total"); n < 5 {
		t.Errorf("outbox_relay_schema_registry_wait_seconds_total = %v, want the time the new subject waited", n)
	}
	waitFor(t, 30*time.Second, "ready again", func() bool { return r.readyStatus() == 200 })
}

// restartOnFailure starts the registry again at cleanup if the test left
// it stopped: the tests after it need it.
func restartOnFailure(t *testing.T, url string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if testkit.RegistryPing(ctx, url) != nil {
			testkit.RegistryStart(t)
		}
	})
}

func neturlParse(s string) (*url.URL, error) { return url.Parse(s) }

// A registry that lost its storage (Apicurio in memory, a Confluent
// registry whose _schemas topic was deleted) hands its ids out again from
// the start. The relay cached subject A's schema as id N; after the
// restart subject B is registered first and gets id N. B's events must go
// out with B's schema (not be refused because the relay's codec cache,
// keyed by id, still holds A's schema under N), and A's later events must
// not carry an id that now names B's schema. The registry is restarted
// while the relay is idle: it never sees it down.
//
// Not parallel: it restarts the registry every test shares.
func TestFormatsRegistryResetReusedSchemaID(t *testing.T) {
	url := testkit.SchemaRegistryURL(t)
	restartOnFailure(t, url)
	testkit.RegistryStop(t)
	testkit.RegistryStart(t) // empty: ids from the start
	e := newEnv(t, "freuse")
	a, b, dlq := e.Prefix+".a", e.Prefix+".b", e.Prefix+".dlq"
	bAvro := `{"type":"record","name":"B","namespace":"com.acme.freuse","fields":[{"name":"n","type":"int"},{"name":"s","type":"string"}]}`
	idA := testkit.RegisterSchema(t, url, a+"-value", "AVRO", orderAvro)
	e.startRelay("--dlq-topic", dlq, "--schema-registry-url", url, "--serialization", "avro")
	rowA := func(i int) int64 {
		return e.insertRow(t, "a", "a-1", "a.happened", fmt.Sprintf(`{"order_id": "o-%d", "amount": 1.5, "qty": %d, "note": null, "tags": []}`, i, i), `{}`)
	}
	for i := range 3 {
		rowA(i)
	}
	consume(t, []string{a}, 3, 60*time.Second, time.Second)

	testkit.RegistryStop(t)
	testkit.RegistryStart(t)
	idB := testkit.RegisterSchema(t, url, b+"-value", "AVRO", bAvro)
	idA2 := testkit.RegisterSchema(t, url, a+"-value", "AVRO", orderAvro)
	if idB != idA {
		t.Fatalf("precondition: B got id %d after the restart, A had %d before it (the registry did not reuse the id)", idB, idA)
	}
	var bIDs []int64
	for i := range 5 {
		bIDs = append(bIDs, e.insertRow(t, "b", "b-1", "b.happened", fmt.Sprintf(`{"n": %d, "s": "s-%d"}`, i, i), `{}`))
	}
	bs, err := testkit.ReadUntil(brokers, []string{b}, len(bIDs), 30*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ls, _ := testkit.ReadUntil(brokers, []string{dlq}, 1, 3*time.Second, time.Second); len(ls) > 0 {
		t.Errorf("%d of B's events dead-lettered after the registry reused id %d: %s = %q (the relay encoded them with A's schema, cached under the same id)",
			len(ls), idB, "dlq.error", ls[0].Headers["dlq.error"])
	}
	if len(bs) != len(bIDs) {
		t.Fatalf("B: %d records, want %d", len(bs), len(bIDs))
	}
	ar := newAvroReader(url)
	for i, rec := range bs {
		var v struct {
			N int    `avro:"n"`
			S string `avro:"s"`
		}
		if sid := ar.decode(t, fmt.Sprintf("B row %d", bIDs[i]), rec.Value, &v); sid != idB || v.N != i {
			t.Errorf("B row %d: schema %d, %+v", bIDs[i], sid, v)
		}
	}
	later := rowA(3)
	as := consume(t, []string{a}, 4, 30*time.Second, time.Second)
	rec := as[len(as)-1]
	if rowID(t, rec) != later {
		t.Fatalf("last A record is row %d, want %d", rowID(t, rec), later)
	}
	if id, _ := wireOf(t, rec); id != idA2 {
		kind, text := testkit.SchemaByID(t, url, id)
		t.Errorf("A's event after the reset carries id %d, which the registry now gives as %s %s (A is %d now)", id, kind, testkit.Tail(text, 120), idA2)
	}
}

// --- i. CloudEvents of message events -------------------------------------------

// envelope cloudevents with a table-less outbox (messages.prefix): a
// message event's ce_source renders {schema} and {table} empty, ce_id is
// the envelope's id, ce_subject its aggregate id; a row beside it gets its
// schema and table. Read by the CloudEvents SDK.
func TestFormatsCloudEventsMessageEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "fcemsg")
	topic := e.Prefix + ".order"
	e.startRelay("--messages-prefix", e.msgPrefix(), "--envelope", "cloudevents",
		"--cloudevents-source", "/shop/{schema}/{table}/{aggregate_type}")
	ids := map[string]string{} // envelope id -> aggregate id
	for i := range 10 {
		id := fmt.Sprintf("0193b5b8-7d3c-7c1e-9a51-%012d", i)
		env := fmt.Sprintf(`{"id": %q, "aggregate_type": "order", "aggregate_id": "o-%d", "event_type": "order.paid", "payload": {"n": %d}}`, id, i, i)
		if _, err := e.DB.Exec(context.Background(), "SELECT pg_logical_emit_message(true, $1, $2)", e.msgPrefix(), env); err != nil {
			t.Fatal(err)
		}
		ids[id] = fmt.Sprintf("o-%d", i)
	}
	row := e.insertRow(t, "order", "o-row", "order.paid", `{"n": 99}`, `{}`)
	rs := consume(t, []string{topic}, len(ids)+1, 60*time.Second, 2*time.Second)
	if len(rs) != len(ids)+1 {
		t.Fatalf("read %d records, want %d", len(rs), len(ids)+1)
	}
	schema, table, _ := strings.Cut(e.Table, ".")
	msgs := 0
	for _, rec := range rs {
		ev := testkit.ReadCloudEvent(t, consumerMessage(rec))
		if rec.Headers["outbox_id"] == strconv.FormatInt(row, 10) {
			if ev.Source() != "/shop/"+schema+"/"+table+"/order" || ev.ID() != rec.Headers["event_id"] {
				t.Errorf("row %d: source %q id %q", row, ev.Source(), ev.ID())
			}
			continue
		}
		msgs++
		agg, ok := ids[ev.ID()]
		if !ok {
			t.Errorf("message record: ce_id %q is not an envelope id (headers %v)", ev.ID(), rec.Headers)
			continue
		}
		if ev.Source() != "/shop///order" || ev.Subject() != agg || ev.Type() != "order.paid" || ev.ID() != rec.Headers["event_id"] {
			t.Errorf("message %s: source %q (want /shop///order), subject %q (want %s), type %q", ev.ID(), ev.Source(), ev.Subject(), agg, ev.Type())
		}
		if d := ev.Time().Sub(rec.Timestamp); d > time.Millisecond || d < -time.Millisecond {
			t.Errorf("message %s: time %s, want the commit time %s", ev.ID(), ev.Time(), rec.Timestamp)
		}
		if !sameJSON(ev.Data(), []byte(fmt.Sprintf(`{"n": %s}`, strings.TrimPrefix(agg, "o-")))) {
			t.Errorf("message %s: data %s", ev.ID(), ev.Data())
		}
	}
	if msgs != len(ids) {
		t.Errorf("%d message records, want %d", msgs, len(ids))
	}
	t.Logf("%d message events and a row read by the SDK: message source /shop///order", msgs)
}
