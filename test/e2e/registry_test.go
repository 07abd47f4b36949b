//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// TestSchemaRegistryService proves the test services' Schema Registry
// (test/services-registry.sh) is a Confluent-compatible one and that its
// fault commands do what docs/testing.md says: Avro, JSON Schema and Protobuf
// (importing google/protobuf/timestamp.proto) register and read back by id;
// one schema under two subjects has one id; registry-pause makes a request
// time out (the port still accepts connections) and registry-resume brings
// it back with its schemas; registry-stop refuses connections and
// registry-start serves the same URL again, empty.
//
// Not parallel: it pauses and restarts the registry every test shares (Go
// runs the parallel tests only after the sequential ones).
func TestSchemaRegistryService(t *testing.T) {
	base := testkit.SchemaRegistryURL(t)
	// the registry lives as long as the services: names of this run only
	run := fmt.Sprintf("r%d", time.Now().UnixNano())

	avro := fmt.Sprintf(`{"type":"record","name":"OrderCreated","namespace":"e2e.%s","fields":[{"name":"id","type":"long"},{"name":"total","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}}]}`, run)
	jsonSchema := fmt.Sprintf(`{"$schema":"http://json-schema.org/draft-07/schema#","title":"%s","type":"object","properties":{"id":{"type":"integer"},"note":{"type":"string"}},"required":["id"]}`, run)
	proto := fmt.Sprintf("syntax = \"proto3\";\npackage e2e.%s;\n\nimport \"google/protobuf/timestamp.proto\";\n\nmessage OrderShipped {\n  int64 id = 1;\n  google.protobuf.Timestamp shipped_at = 2;\n}\n", run)

	cases := []struct{ typ, subject, schema string }{
		{"AVRO", run + ".orders-value", avro},
		{"JSON", run + ".notes-value", jsonSchema},
		{"PROTOBUF", run + ".shipments-value", proto},
	}
	ids := map[int]string{}
	for _, c := range cases {
		id := testkit.RegisterSchema(t, base, c.subject, c.typ, c.schema)
		if prev, dup := ids[id]; dup {
			t.Fatalf("%s schema got id %d, already the %s schema's", c.typ, id, prev)
		}
		ids[id] = c.typ
		typ, got := testkit.SchemaByID(t, base, id)
		if typ != c.typ || got != c.schema {
			t.Fatalf("schema id %d read back as %s %q, registered as %s %q", id, typ, got, c.typ, c.schema)
		}
		t.Logf("%s schema: subject %s, id %d, read back identical", c.typ, c.subject, id)
	}

	avroID := testkit.RegisterSchema(t, base, cases[0].subject, "AVRO", avro)
	other := testkit.RegisterSchema(t, base, run+".orders-archive-value", "AVRO", avro)
	if other != avroID || ids[avroID] != "AVRO" {
		t.Fatalf("the Avro schema again under its subject: id %d, under a second subject: id %d; registered first as %d", avroID, other, firstID(ids, "AVRO"))
	}

	// Paused: connections are accepted (the kernel's backlog), nothing answers.
	testkit.RegistryPause(t)
	t.Cleanup(func() { testkit.RegistryResume(t) }) // a no-op once resumed; never leave it stopped for later tests
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		t.Fatalf("paused registry: connect to %s: %v (a paused process's port still accepts)", u.Host, err)
	}
	conn.Close()
	client := &http.Client{Timeout: 2 * time.Second}
	start := time.Now()
	resp, err := client.Get(base + "/subjects")
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("paused registry answered HTTP %d in %v", resp.StatusCode, took)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || took > 3*time.Second {
		t.Fatalf("paused registry: want a client timeout after 2 s, got %v after %v", err, took)
	}
	t.Logf("paused: GET /subjects timed out after %v", took.Round(time.Millisecond))

	testkit.RegistryResume(t)
	start = time.Now()
	if typ, got := testkit.SchemaByID(t, base, avroID); typ != "AVRO" || got != avro {
		t.Fatalf("after resume, schema id %d is %s %q", avroID, typ, got)
	}
	t.Logf("resumed: schema id %d still there, answered in %v", avroID, time.Since(start).Round(time.Millisecond))

	// Stopped: refused. Started again: the same URL serves, without the old schemas (in-memory storage).
	testkit.RegistryStop(t)
	t.Cleanup(func() { testkit.RegistryStart(t) }) // a no-op when it already serves
	if c, err := net.DialTimeout("tcp", u.Host, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("stopped registry: %s still accepts connections", u.Host)
	}
	start = time.Now()
	testkit.RegistryStart(t)
	t.Logf("registry-start: serving again after %v", time.Since(start).Round(time.Millisecond))
	if base2 := testkit.SchemaRegistryURL(t); base2 != base {
		t.Fatalf("registry-start moved the registry: %s, was %s", base2, base)
	}
	code, errCode := getErrorCode(t, fmt.Sprintf("%s/schemas/ids/%d", base, avroID))
	if code != http.StatusNotFound || errCode != 40403 {
		t.Fatalf("after registry-stop/start schema id %d: HTTP %d error_code %d, want 404 and 40403 (storage is in memory)", avroID, code, errCode)
	}
	if id := testkit.RegisterSchema(t, base, cases[0].subject, "AVRO", avro); id <= 0 {
		t.Fatalf("registered again after the restart: id %d", id)
	}
}

func firstID(ids map[int]string, typ string) int {
	for id, t := range ids {
		if t == typ {
			return id
		}
	}
	return 0
}

// getErrorCode GETs u and returns the HTTP status and the Confluent error_code
// of its body (0 when it has none).
func getErrorCode(t *testing.T, u string) (int, int) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Code int `json:"error_code"`
	}
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Code
}
