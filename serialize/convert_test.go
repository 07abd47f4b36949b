package serialize

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

func TestJSONSchemaValidate(t *testing.T) {
	draft7 := `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"n":{"type":"integer"}},"dependencies":{"n":["m"]}}`
	c, err := newJSONSchemaCodec(itemJSONSchema, nil)
	if err != nil {
		t.Fatal(err)
	}
	c7, err := newJSONSchemaCodec(draft7, nil)
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	for _, tc := range []struct {
		name    string
		codec   *jsonSchemaCodec
		payload string
		err     string
		path    string
	}{
		{"valid", c, `{"sku":"a","qty":1}`, "", ""},
		{"wrong type", c, `{"sku":"a","qty":"1"}`, "got string, want integer", "/qty"},
		{"fraction", c, `{"sku":"a","qty":1.5}`, "want integer", "/qty"},
		{"minimum", c, `{"sku":"a","qty":0}`, "minimum", "/qty"},
		{"missing", c, `{"sku":"a"}`, "missing property 'qty'", ""},
		{"unknown field", c, `{"sku":"a","qty":1,"x":1}`, "additional properties 'x' not allowed", ""},
		{"huge number is still an integer", c, `{"sku":"a","qty":1e400}`, "", ""},
		{"not JSON", c, `{"sku":`, "payload is not JSON", ""},
		{"invalid UTF-8", c, "{\"sku\":\"\xff\",\"qty\":1}", "not valid UTF-8", ""},
		{"trailing data", c, `{"sku":"a","qty":1} 1`, "data after its JSON value", ""},
		{"deep nesting", c, deep, "additional properties 'a' not allowed", ""},
		{"draft 7 from $schema", c7, `{"n":1}`, "properties 'm' required, if 'n' exists", ""},
		{"draft 7 valid", c7, `{"n":1,"m":2}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.codec.validate([]byte(tc.payload))
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var fe *fieldError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error = %v, want %q", err, tc.err)
			}
			if tc.path != "" && fe.path != tc.path {
				t.Fatalf("path %q, want %q", fe.path, tc.path)
			}
		})
	}
	// A $ref to anything not given is refused, not fetched.
	if _, err := newJSONSchemaCodec(`{"$ref":"file:///etc/passwd"}`, nil); err == nil {
		t.Fatal("a file $ref compiled")
	}
	if _, err := newJSONSchemaCodec(`{"$ref":"https://example.com/s.json"}`, nil); err == nil {
		t.Fatal("an https $ref compiled")
	}
	// References given by the registry are used.
	rc, err := newJSONSchemaCodec(`{"type":"object","properties":{"item":{"$ref":"item.json"}}}`, map[string]string{"item.json": itemJSONSchema})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.validate([]byte(`{"item":{"sku":"a","qty":0}}`)); err == nil || !strings.Contains(err.Error(), "minimum") {
		t.Fatalf("referenced schema not applied: %v", err)
	}
}

func TestProtobufConvert(t *testing.T) {
	first, err := newProtoCodec(itemProto, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	nested, err := newProtoCodec(itemProto, nil, "com.acme.Envelope.ItemRemoved")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newProtoCodec(`syntax = "proto3"; message A { B b = 1; }`, nil, ""); err == nil {
		t.Fatal("unknown type compiled")
	}
	if _, err := newProtoCodec(`syntax = "proto3";`, nil, ""); err == nil || !strings.Contains(err.Error(), "no message") {
		t.Fatalf("file without messages: %v", err)
	}
	refd, err := newProtoCodec(`syntax = "proto3"; package x; import "item.proto"; message Order { com.acme.Item item = 1; }`,
		map[string]string{"item.proto": itemProto}, "")
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	deep := `{"item":` + strings.Repeat(`{"sku":`, 3000) + `"a"` + strings.Repeat("}", 3000) + "}"
	for _, tc := range []struct {
		name    string
		codec   *protoCodec
		payload string
		idx     []byte
		err     string
		check   func(t *testing.T, m *dynamicpb.Message)
	}{
		{"first message", first, `{"sku":"a","qty":2,"at":"2024-01-02T03:04:05.5Z"}`, []byte{0}, "", func(t *testing.T, m *dynamicpb.Message) {
			fd := m.Descriptor().Fields()
			if m.Get(fd.ByName("sku")).String() != "a" || m.Get(fd.ByName("qty")).Int() != 2 {
				t.Fatalf("fields: %v", m)
			}
			at := m.Get(fd.ByName("at")).Message()
			if at.Get(at.Descriptor().Fields().ByName("seconds")).Int() != 1704164645 {
				t.Fatalf("timestamp: %v", at)
			}
		}},
		{"nested message indexes (Envelope=1, ItemRemoved=1)", nested, `{"sku":"b"}`, []byte{4, 2, 2}, "", nil},
		{"referenced import", refd, `{"item":{"sku":"c"}}`, []byte{0}, "", nil},
		{"unknown field", first, `{"sku":"a","x":1}`, nil, `unknown field "x"`, nil},
		{"wrong type", first, `{"qty":"many"}`, nil, "invalid value for int32 field qty", nil},
		{"int32 out of range", first, `{"qty":2147483648}`, nil, "qty", nil},
		{"fraction", first, `{"qty":1.5}`, nil, "qty", nil},
		{"NaN string for int", first, `{"qty":"NaN"}`, nil, "qty", nil},
		{"bad timestamp", first, `{"at":"yesterday"}`, nil, "Timestamp", nil},
		{"invalid UTF-8", first, "{\"sku\":\"\xff\"}", nil, "not valid UTF-8", nil},
		{"not an object", first, `[1]`, nil, "unexpected token", nil},
		{"deep nesting", refd, deep, nil, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.codec.encode(nil, []byte(tc.payload))
			if tc.err != "" || tc.idx == nil {
				var fe *fieldError
				if err == nil || !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want a mismatch %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(b[:len(tc.idx)]) != string(tc.idx) {
				t.Fatalf("indexes % x, want % x", b[:len(tc.idx)], tc.idx)
			}
			// Independent read: dynamicpb on the message the indexes name.
			m := dynamicpb.NewMessage(tc.codec.msg)
			if err := proto.Unmarshal(b[len(tc.idx):], m); err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, m)
			}
			if _, err := tc.codec.decode(b); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if tc.idx[0] == 0 { // [0] written in full (count 1, index 0), as some producers do
				long := append([]byte{2, 0}, b[1:]...)
				if j, err := tc.codec.decode(long); err != nil || !strings.Contains(string(j), "sku") && tc.codec == first {
					t.Fatalf("decode of the long form of [0]: %s %v", j, err)
				}
			}
		})
	}
}
