//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/hamba/avro/v2"

	"github.com/outbox-relay/outbox-relay/preflight"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Schema Registry serialisation and CloudEvents (issue 39), checked the
// way a consumer of another stack would: the schema fetched from the
// registry by the id in the record, the value decoded with hamba/avro (not
// the relay's own code), CloudEvents read by the official Go SDK.

const orderAvro = `{"type":"record","name":"Order","namespace":"com.acme","fields":[
 {"name":"order_id","type":"string"},
 {"name":"amount","type":"double"},
 {"name":"qty","type":"int"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"tags","type":{"type":"array","items":"string"},"default":[]}]}`

const paymentJSONSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
 "required":["payment_id","cents"],"additionalProperties":false,
 "properties":{"payment_id":{"type":"string"},"cents":{"type":"integer","minimum":0}}}`

// wireOf splits a record value in the Confluent wire format.
func wireOf(t *testing.T, r record) (id int, body []byte) {
	t.Helper()
	if len(r.Value) < 5 || r.Value[0] != 0 {
		t.Fatalf("%s/%d@%d: value %q is not in the Schema Registry wire format (magic byte 0, 4-byte id)", r.Topic, r.Partition, r.Offset, testkit.Tail(string(r.Value), 80))
	}
	return int(binary.BigEndian.Uint32(r.Value[1:5])), r.Value[5:]
}

// sameJSON compares two JSON documents as values.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// An Avro topic and a JSON Schema topic: every record decodes through the
// registry to exactly its row's payload, field by field; a payload that
// does not fit is dead-lettered with reason schema_mismatch and the
// registry's words, and its neighbours go on.
func TestSchemaRegistryAvroAndJSONSchema(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sravro")
	url := testkit.SchemaRegistryURL(t)
	order, payment, dlq := e.Prefix+".order", e.Prefix+".payment", e.Prefix+".dlq"
	testkit.RegisterSchema(t, url, order+"-value", "AVRO", orderAvro)
	testkit.RegisterSchema(t, url, payment+"-value", "JSON", paymentJSONSchema)
	r := e.startRelay("--dlq-topic", dlq, "--schema-registry-url", url,
		"--serialization-topics", order+"=avro,"+payment+"=json_schema")

	good := map[int64]string{} // id -> payload
	bad := map[int64]string{}  // id -> a word the dead letter's error must hold
	for i := range 40 {
		note := `null`
		if i%3 == 0 {
			note = fmt.Sprintf(`"gift \"%d\" ünïcode"`, i)
		}
		p := fmt.Sprintf(`{"order_id": "o-%d", "amount": %d.25, "qty": %d, "note": %s, "tags": ["a", "b%d"]}`, i, i, i, note, i)
		good[e.insertRow(t, "order", fmt.Sprintf("order-%d", i%7), "order.placed", p, `{}`)] = p
		p = fmt.Sprintf(`{"payment_id": "p-%d", "cents": %d}`, i, i*100)
		good[e.insertRow(t, "payment", fmt.Sprintf("order-%d", i%7), "payment.captured", p, `{}`)] = p
		if i%10 == 5 {
			bad[e.insertRow(t, "order", "order-1", "order.placed", `{"order_id": "o-bad", "amount": "ten", "qty": 1}`, `{}`)] = "amount"
			bad[e.insertRow(t, "order", "order-1", "order.placed", `{"order_id": "o-extra", "amount": 1, "qty": 1, "smuggled": true}`, `{}`)] = "smuggled"
			bad[e.insertRow(t, "payment", "order-1", "payment.captured", `{"payment_id": "p-bad", "cents": -5}`, `{}`)] = "minimum"
		}
	}
	rs := consume(t, []string{order, payment}, len(good), 90*time.Second, 3*time.Second)
	if len(rs) != len(good) {
		t.Fatalf("read %d records, want %d", len(rs), len(good))
	}
	codecs := map[int]avro.Schema{}
	for _, rec := range rs {
		id, _ := strconv.ParseInt(rec.Headers["outbox_id"], 10, 64)
		want, ok := good[id]
		if !ok {
			t.Errorf("%s: record of row %d, which is not a good row (headers %v)", rec.Topic, id, rec.Headers)
			continue
		}
		schemaID, body := wireOf(t, rec)
		kind, text := testkit.SchemaByID(t, url, schemaID)
		switch rec.Topic {
		case order:
			if kind != "AVRO" && kind != "" {
				t.Fatalf("%s: schema %d is %s, want AVRO", order, schemaID, kind)
			}
			sc, ok := codecs[schemaID]
			if !ok {
				sc = avro.MustParse(text)
				codecs[schemaID] = sc
			}
			var got map[string]any
			if err := avro.Unmarshal(sc, body, &got); err != nil {
				t.Fatalf("row %d: Avro decode with schema %d: %v", id, schemaID, err)
			}
			var w map[string]any
			if err := json.Unmarshal([]byte(want), &w); err != nil {
				t.Fatal(err)
			}
			// Field by field, in Avro's types.
			if got["order_id"] != w["order_id"] || got["amount"] != w["amount"] || got["qty"] != int(w["qty"].(float64)) {
				t.Errorf("row %d: decoded %v, want %v", id, got, w)
			}
			if n, _ := w["note"].(string); (w["note"] == nil) != (got["note"] == nil) || (n != "" && fmt.Sprint(got["note"]) != n && fmt.Sprint(got["note"]) != fmt.Sprint(map[string]any{"string": n})) {
				t.Errorf("row %d: note %#v, want %#v", id, got["note"], w["note"])
			}
			if fmt.Sprint(got["tags"]) != fmt.Sprint(w["tags"]) {
				t.Errorf("row %d: tags %v, want %v", id, got["tags"], w["tags"])
			}
		case payment:
			if kind != "JSON" {
				t.Fatalf("%s: schema %d is %q, want JSON", payment, schemaID, kind)
			}
			if !sameJSON(body, []byte(want)) {
				t.Errorf("row %d: JSON Schema record body %s, want %s", id, body, want)
			}
		}
		if rec.Key == "" || !strings.HasPrefix(rec.Key, "order-") {
			t.Errorf("row %d: key %q, want the aggregate id (schema_registry.key raw)", id, rec.Key)
		}
	}
	letters := consume(t, []string{dlq}, len(bad), 60*time.Second, 2*time.Second)
	if len(letters) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(letters), len(bad))
	}
	for _, l := range letters {
		id, _ := strconv.ParseInt(l.Headers["dlq.event_id"], 10, 64)
		word, ok := bad[id]
		if !ok || l.Headers["dlq.reason"] != "schema_mismatch" || !strings.Contains(l.Headers["dlq.error"], word) {
			t.Errorf("dead letter of row %d: reason %q error %q, want schema_mismatch naming %q", id, l.Headers["dlq.reason"], l.Headers["dlq.error"], word)
		}
		if bytes.HasPrefix(l.Value, []byte{0}) {
			t.Errorf("dead letter of row %d holds the wire format; want the row's payload as written", id)
		}
	}
	ss, err := r.Scrape()
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := testkit.SumMetric(ss, "outbox_relay_dead_lettered_total", map[string]string{"reason": "schema_mismatch"}); n != float64(len(bad)) {
		t.Errorf("outbox_relay_dead_lettered_total{reason=schema_mismatch} = %v, want %d", n, len(bad))
	}
	if err := e.WaitConfirmed(context.Background(), e.currentLSN(t), 30*time.Second); err != nil {
		t.Errorf("slot not confirmed past every event: %v", err)
	}
}

// The registry frozen for 20 s before a subject's first lookup: events wait
// (none published in another format, none lost), /readyz and
// outbox_relay_schema_registry_up say why, and everything arrives in order
// once it answers again.
func TestSchemaRegistryDownDelaysEvents(t *testing.T) {
	e := newEnv(t, "srdown")
	url := testkit.SchemaRegistryURL(t)
	order := e.Prefix + ".order"
	testkit.RegisterSchema(t, url, order+"-value", "AVRO", orderAvro)
	r := e.startRelay("--schema-registry-url", url, "--serialization", "avro", "--schema-registry-timeout", "2s",
		"--topic-template", order)

	testkit.RegistryPause(t)
	paused := true
	defer func() {
		if paused {
			testkit.RegistryResume(t)
		}
	}()
	var ids []int64
	for i := range 30 {
		p := fmt.Sprintf(`{"order_id": "o-%d", "amount": 1.5, "qty": %d, "note": null, "tags": []}`, i, i)
		ids = append(ids, e.insertRow(t, "order", "order-1", "order.placed", p, `{}`))
	}
	waitFor(t, 30*time.Second, "the relay to say it waits for the registry", func() bool {
		code, body := r.get("/readyz")
		return code == 503 && strings.Contains(body, "schema registry") && r.metric("outbox_relay_schema_registry_up") == 0
	})
	time.Sleep(20 * time.Second)
	if rs, err := testkit.ReadUntil(brokers, []string{order}, 1, 3*time.Second, time.Second); err == nil && len(rs) > 0 {
		t.Fatalf("%d records published while the registry was down (first %q): nothing may go out in another format", len(rs), rs[0].Value)
	}
	testkit.RegistryResume(t)
	paused = false
	rs := consume(t, []string{order}, len(ids), 90*time.Second, 3*time.Second)
	if len(rs) != len(ids) {
		t.Fatalf("read %d records after the registry came back, want %d", len(rs), len(ids))
	}
	for i, rec := range rs { // one key, one partition: in commit order
		wireOf(t, rec)
		if rec.Headers["outbox_id"] != strconv.FormatInt(ids[i], 10) {
			t.Fatalf("record %d is row %s, want row %d: order lost", i, rec.Headers["outbox_id"], ids[i])
		}
	}
	waitFor(t, 30*time.Second, "ready again", func() bool { return r.readyStatus() == 200 })
	if n := r.metric("outbox_relay_schema_registry_wait_seconds_total"); n < 15 {
		t.Errorf("outbox_relay_schema_registry_wait_seconds_total = %v, want about 20", n)
	}
	if r.metric("outbox_relay_schema_registry_up") != 1 {
		t.Errorf("outbox_relay_schema_registry_up is not 1 once it answers")
	}
}

// consumerMessage is rec as sarama hands it to a consumer, for the SDK.
func consumerMessage(rec record) *sarama.ConsumerMessage {
	m := &sarama.ConsumerMessage{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: []byte(rec.Key), Value: rec.Value, Timestamp: rec.Timestamp}
	for k, v := range rec.Headers {
		m.Headers = append(m.Headers, &sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	return m
}

// CloudEvents in both modes, read by the CloudEvents Go SDK: id is the
// event's identity, type its event type, subject its aggregate id, time
// its commit time, source the template's; the data is the payload. Binary
// mode with Avro carries the wire format and ce_dataschema.
func TestCloudEventsBinaryAndStructured(t *testing.T) {
	t.Parallel()
	url := testkit.SchemaRegistryURL(t)
	for _, mode := range []string{"binary", "structured", "binary+avro"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, "ce"+strings.ReplaceAll(mode, "+", ""))
			order := e.Prefix + ".order"
			args := []string{"--envelope", "cloudevents", "--cloudevents-source", "/shop/{table}/{aggregate_type}"}
			if mode == "structured" {
				args = append(args, "--cloudevents-mode", "structured")
			}
			if mode == "binary+avro" {
				testkit.RegisterSchema(t, url, order+"-value", "AVRO", orderAvro)
				args = append(args, "--schema-registry-url", url, "--serialization", "avro")
			}
			e.startRelay(append(args, "--topic-template", order)...)
			payloads := map[int64]string{}
			for i := range 10 {
				p := fmt.Sprintf(`{"order_id": "o-%d", "amount": 2.5, "qty": %d, "note": "q\"uote", "tags": ["x"]}`, i, i)
				payloads[e.insertRow(t, "order", fmt.Sprintf("order-%d", i%3), "order.placed", p, `{"tenant_id": "acme"}`)] = p
			}
			rs := consume(t, []string{order}, len(payloads), 60*time.Second, 2*time.Second)
			if len(rs) != len(payloads) {
				t.Fatalf("read %d records, want %d", len(rs), len(payloads))
			}
			_, table, _ := strings.Cut(e.Table, ".")
			for _, rec := range rs {
				ev := testkit.ReadCloudEvent(t, consumerMessage(rec))
				id, _ := strconv.ParseInt(rec.Headers["outbox_id"], 10, 64)
				if ev.ID() != rec.Headers["event_id"] || ev.ID() == "" {
					t.Errorf("row %d: id %q, want the event_id %q", id, ev.ID(), rec.Headers["event_id"])
				}
				if ev.Type() != "order.placed" || ev.Subject() != rec.Key || ev.Source() != "/shop/"+table+"/order" || ev.SpecVersion() != "1.0" {
					t.Errorf("row %d: type %q subject %q source %q specversion %q", id, ev.Type(), ev.Subject(), ev.Source(), ev.SpecVersion())
				}
				if d := ev.Time().Sub(rec.Timestamp); d > time.Millisecond || d < -time.Millisecond {
					t.Errorf("row %d: time %s, want the commit time %s", id, ev.Time(), rec.Timestamp)
				}
				switch mode {
				case "binary+avro":
					if ev.DataContentType() != "application/avro" || !strings.Contains(ev.DataSchema(), "/schemas/ids/") {
						t.Errorf("row %d: datacontenttype %q dataschema %q", id, ev.DataContentType(), ev.DataSchema())
					}
					if len(ev.Data()) < 5 || ev.Data()[0] != 0 {
						t.Errorf("row %d: data is not the wire format: %q", id, ev.Data())
					}
				default:
					if !sameJSON(ev.Data(), []byte(payloads[id])) {
						t.Errorf("row %d: data %s, want %s", id, ev.Data(), payloads[id])
					}
				}
			}
		})
	}
}

// `outbox-relay check` asks the registry as the relay would and names each
// topic the rows route to whose subject is missing; it fails when the
// registry does not answer, without printing the password.
func TestCheckSchemaRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "srcheck")
	url := testkit.SchemaRegistryURL(t)
	order := e.Prefix + ".order"
	e.insertRow(t, "order", "o-1", "order.placed", `{"order_id": "o-1", "amount": 1, "qty": 1}`, `{}`)
	args := []string{"--serialization", "avro", "--schema-registry-url", url}
	r, out := e.runCheck(t, "", args...)
	if c := checkNamed(t, r, "schema_registry"); c.Verdict != preflight.OK {
		t.Errorf("schema_registry: %s %s\n%s", c.Verdict, c.Value, out)
	}
	if c := checkNamed(t, r, "schema_registry.subjects"); c.Verdict != preflight.Warn || !strings.Contains(c.Value, order+"-value") {
		t.Errorf("schema_registry.subjects before registering: %s %q, want warn naming %s-value", c.Verdict, c.Value, order)
	}
	testkit.RegisterSchema(t, url, order+"-value", "AVRO", orderAvro)
	r, out = e.runCheck(t, "", args...)
	if c := checkNamed(t, r, "schema_registry.subjects"); c.Verdict != preflight.OK {
		t.Errorf("schema_registry.subjects once registered: %s %q\n%s", c.Verdict, c.Value, out)
	}
	// A registry nobody listens on, with credentials: a failure naming it, no password.
	dead := "http://relay:s3cret-pw@" + freePort(t) + "/apis/ccompat/v7"
	r, out = e.runCheck(t, "", "--serialization", "avro", "--schema-registry-url", dead)
	if c := checkNamed(t, r, "schema_registry"); c.Verdict != preflight.Fail {
		t.Errorf("schema_registry with nothing listening: %s %q", c.Verdict, c.Value)
	}
	if strings.Contains(out, "s3cret-pw") {
		t.Errorf("check printed the registry password:\n%s", out)
	}
}
