package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// SchemaRegistryKey is the env file's line with the Confluent API base URL of
// the Schema Registry test/services.sh starts (Apicurio Registry,
// test/services-registry.sh): http://127.0.0.1:<port>/apis/ccompat/v7.
const SchemaRegistryKey = "OUTBOX_TEST_SCHEMA_REGISTRY_URL"

// SchemaRegistryContentType is what the Confluent API wants on a POST (else 415).
const SchemaRegistryContentType = "application/vnd.schemaregistry.v1+json"

// registryClient bounds every helper's request: a paused registry must fail a
// test, not hang it.
var registryClient = &http.Client{Timeout: 10 * time.Second}

// SchemaRegistryURL returns the registry's Confluent API base URL (append
// /subjects/..., /schemas/ids/N to it). It fails t when the services' env
// file (or the environment, as LoadServices reads them) has no
// OUTBOX_TEST_SCHEMA_REGISTRY_URL, or when the registry does not answer
// GET <url>/subjects with 200 within 10 s: call it before pausing the
// registry. From the test's goroutine only; blocks for at most 10 s.
func SchemaRegistryURL(t testing.TB) string {
	t.Helper()
	s := registryServices(t)
	u := s.Get(SchemaRegistryKey)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := RegistryPing(ctx, u); err != nil {
		t.Fatalf("schema registry %s does not answer (bash test/services.sh status; registry-resume or registry-start if a test left it down): %v", u, err)
	}
	return u
}

func registryServices(t testing.TB) *Services {
	t.Helper()
	s, err := LoadServices(SchemaRegistryKey)
	if err != nil {
		t.Fatalf("no schema registry: %v (test/services.sh start starts one unless OUTBOX_TEST_REGISTRY=0)", err)
	}
	return s
}

// RegistryPing is nil once GET <base>/subjects answers 200 (a registry that
// serves), else the error or status; bounded by ctx and 10 s. Any goroutine.
func RegistryPing(ctx context.Context, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/subjects", nil)
	if err != nil {
		return err
	}
	resp, err := registryClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/subjects: HTTP %d: %s", base, resp.StatusCode, body)
	}
	return nil
}

// registryError is the Confluent API's error body.
type registryError struct {
	Code    int    `json:"error_code"`
	Message string `json:"message"`
}

// registryDo sends one request to base+path and decodes a 200's JSON body into
// out; another status is an error with the registry's error_code and message.
func registryDo(method, base, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	target := strings.TrimSuffix(base, "/") + path
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", SchemaRegistryContentType)
	if in != nil {
		req.Header.Set("Content-Type", SchemaRegistryContentType)
	}
	resp, err := registryClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, target, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e registryError
		_ = json.Unmarshal(b, &e)
		return fmt.Errorf("%s %s: HTTP %d, error_code %d: %s", method, target, resp.StatusCode, e.Code, strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode %q: %w", method, target, b, err)
	}
	return nil
}

// RegisterSchema registers schema under subject (POST
// <base>/subjects/<subject>/versions) and returns its id: the same schema gets
// the same id, under any subject. schemaType is "AVRO", "JSON" or "PROTOBUF"
// ("" is AVRO). Ids may skip numbers: use the one returned. It fails t on any
// error. From the test's goroutine only.
func RegisterSchema(t testing.TB, base, subject, schemaType, schema string) int {
	t.Helper()
	in := map[string]string{"schema": schema}
	if schemaType != "" && schemaType != "AVRO" {
		in["schemaType"] = schemaType
	}
	var out struct {
		ID *int `json:"id"`
	}
	if err := registryDo(http.MethodPost, base, "/subjects/"+url.PathEscape(subject)+"/versions", in, &out); err != nil {
		t.Fatalf("register %s schema under subject %q: %v", schemaTypeOrAvro(schemaType), subject, err)
	}
	if out.ID == nil {
		t.Fatalf("register %s schema under subject %q: the answer has no id", schemaTypeOrAvro(schemaType), subject)
	}
	return *out.ID
}

// SchemaByID reads a schema back by id (GET <base>/schemas/ids/<id>): its type
// ("AVRO" when the registry leaves the field out, as the Confluent API does
// for Avro) and text. It fails t on any error, an unknown id included
// (error_code 40403). From the test's goroutine only.
func SchemaByID(t testing.TB, base string, id int) (schemaType, schema string) {
	t.Helper()
	var out struct {
		SchemaType string  `json:"schemaType"`
		Schema     *string `json:"schema"`
	}
	if err := registryDo(http.MethodGet, base, fmt.Sprintf("/schemas/ids/%d", id), nil, &out); err != nil {
		t.Fatalf("schema id %d: %v", id, err)
	}
	if out.Schema == nil {
		t.Fatalf("schema id %d: the answer has no schema", id)
	}
	return schemaTypeOrAvro(out.SchemaType), *out.Schema
}

func schemaTypeOrAvro(s string) string {
	if s == "" {
		return "AVRO"
	}
	return s
}

// RegistryStop stops the registry (services.sh registry-stop): clients get
// "connection refused". Its storage is in memory: every schema is lost, and
// after RegistryStart the old ids are unknown. RegistryPause keeps them.
// From the test's goroutine only (elsewhere: Services.Run(ctx, "registry-stop")).
func RegistryStop(t testing.TB) { t.Helper(); registryCmd(t, "registry-stop") }

// RegistryStart starts it again on the same port (the URL stays valid) and
// returns once it serves, empty.
func RegistryStart(t testing.TB) { t.Helper(); registryCmd(t, "registry-start") }

// RegistryPause SIGSTOPs the registry (services.sh registry-pause): its port
// still accepts connections but nothing answers, so requests run into the
// client's timeout, as with a hung registry; the schemas are kept. Returns
// once every thread is stopped.
func RegistryPause(t testing.TB) { t.Helper(); registryCmd(t, "registry-pause") }

// RegistryResume SIGCONTs it: it answers again with every schema it had.
func RegistryResume(t testing.TB) { t.Helper(); registryCmd(t, "registry-resume") }

func registryCmd(t testing.TB, cmd string) {
	t.Helper()
	s := registryServices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.Run(ctx, cmd); err != nil {
		t.Fatal(err)
	}
}
