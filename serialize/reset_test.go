package serialize

import (
	"context"
	"strings"
	"testing"
)

// A registry that lost its storage hands out the ids again, for other
// schemas: the relay must not encode a new subject with the schema it
// cached for that id before, nor keep writing a subject's old id.
func TestRegistryResetReusedSchemaID(t *testing.T) {
	f := newFakeRegistry(t)
	a := `{"type":"record","name":"A","fields":[{"name":"order_id","type":"string"}]}`
	b := `{"type":"record","name":"B","fields":[{"name":"n","type":"int"}]}`
	if id := f.add("a-value", "AVRO", a); id != 1 {
		t.Fatalf("first id %d", id)
	}
	s := newTestSer(t, Avro, nil, RegistryConfig{URL: f.url(), CacheTTL: DefaultCacheTTL})
	ctx := context.Background()
	if _, err := s.Encode(ctx, Input{Topic: "a", Payload: []byte(`{"order_id": "o-1"}`)}); err != nil {
		t.Fatal(err)
	}
	// The registry restarts empty: B first gets id 1, then A id 2.
	f.mu.Lock()
	f.schemas, f.subjects = nil, map[string][]int{}
	f.mu.Unlock()
	if id := f.add("b-value", "AVRO", b); id != 1 {
		t.Fatalf("B's id %d, want the reused 1", id)
	}
	f.add("a-value", "AVRO", a)
	out, err := s.Encode(ctx, Input{Topic: "b", Payload: []byte(`{"n": 5}`)})
	if err != nil {
		t.Fatalf("B encoded with A's cached schema: %v", err)
	}
	if wireID(t, out.Value) != 1 {
		t.Errorf("B's record names id %d, want 1", wireID(t, out.Value))
	}
	out, err = s.Encode(ctx, Input{Topic: "a", Payload: []byte(`{"order_id": "o-2"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if id := wireID(t, out.Value); id != 2 {
		t.Errorf("A's next record names id %d, want its new id 2 (id 1 is B's now)", id)
	}
	if !strings.Contains(s.log.String(), "another schema than before") {
		t.Errorf("no error logged about the reused id:\n%s", s.log.String())
	}
}
