package serialize

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

const orderAvsc = `{"type":"record","name":"Order","namespace":"com.acme","fields":[
 {"name":"id","type":"long"},
 {"name":"qty","type":"int"},
 {"name":"price","type":"double"},
 {"name":"ratio","type":"float","default":0.5},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"paid","type":"boolean"},
 {"name":"raw","type":"bytes","default":""},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
 {"name":"tags","type":{"type":"array","items":"string"},"default":[]},
 {"name":"attrs","type":{"type":"map","values":"long"},"default":{}},
 {"name":"hash","type":{"type":"fixed","name":"Hash","size":4},"default":"abcd"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
   {"name":"sku","type":"string"},{"name":"qty","type":"int"}]}},"default":[]},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"},"default":0},
 {"name":"atu","type":{"type":"long","logicalType":"timestamp-micros"},"default":0},
 {"name":"day","type":{"type":"int","logicalType":"date"},"default":0},
 {"name":"uid","type":{"type":"string","logicalType":"uuid"},"default":"00000000-0000-0000-0000-000000000000"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2},"default":"\u0000"},
 {"name":"choice","type":["null","long","string"],"default":null},
 {"name":"either","type":["int","long"],"default":1},
 {"name":"nothing","type":"null","default":null}
]}`

const minimal = `{"id":1,"qty":2,"price":3.5,"paid":true,"status":"NEW"}`

// withField returns the minimal order with one field set (raw JSON value)
// or, with value "", removed.
func withField(name, value string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(minimal), &m); err != nil {
		panic(err)
	}
	if value == "" {
		delete(m, name)
	} else {
		m[name] = json.RawMessage(value)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestAvroConvert(t *testing.T) {
	c, err := newAvroCodec(orderAvsc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	cases := []struct {
		name, payload string
		want          map[string]any // fields checked after hamba decodes the bytes
		err           string         // substring of the mismatch, "" = success
		path          string
	}{
		{name: "minimal with defaults", payload: minimal, want: map[string]any{"id": int64(1), "qty": 2, "price": 3.5,
			"ratio": float32(0.5), "note": nil, "tags": []any{}, "hash": [4]byte{'a', 'b', 'c', 'd'}, "nothing": nil}},
		{name: "int as 2.0 and 1e3", payload: withField("qty", "1e3"), want: map[string]any{"qty": 1000}},
		{name: "long max", payload: withField("id", "9223372036854775807"), want: map[string]any{"id": int64(9223372036854775807)}},
		{name: "long over max", payload: withField("id", "9223372036854775808"), err: "out of range of an Avro long", path: "id"},
		{name: "int over max", payload: withField("qty", "2147483648"), err: "out of range of an Avro int", path: "qty"},
		{name: "int fraction", payload: withField("qty", "1.5"), err: "1.5 is not an Avro int", path: "qty"},
		{name: "huge exponent", payload: withField("qty", "1e400"), err: "out of range", path: "qty"},
		{name: "double huge", payload: withField("price", "1e400"), err: "out of range of an Avro double", path: "price"},
		{name: "NaN string for double", payload: withField("price", `"NaN"`), err: `"NaN" is not an Avro double`, path: "price"},
		{name: "float", payload: withField("ratio", "0.25"), want: map[string]any{"ratio": float32(0.25)}},
		{name: "string for int", payload: withField("qty", `"2"`), err: `"2" is not an Avro int`, path: "qty"},
		{name: "bool wrong", payload: withField("paid", "1"), err: "1 is not an Avro boolean", path: "paid"},
		{name: "missing without default", payload: withField("id", ""), err: "missing, and the field has no default", path: "id"},
		{name: "unknown field", payload: withField("extra", "1"), err: "unknown field: record com.acme.Order has no such field", path: "extra"},
		{name: "unknown nested field", payload: withField("items", `[{"sku":"a","qty":1},{"sku":"b","qty":1,"x":2}]`), err: "unknown field", path: "items[1].x"},
		{name: "nested path", payload: withField("items", `[{"sku":"a","qty":1},{"sku":"b","qty":1},{"sku":"c","qty":1.5}]`), err: "items[2].qty: 1.5 is not an Avro int", path: "items[2].qty"},
		{name: "items ok", payload: withField("items", `[{"sku":"a","qty":1}]`), want: map[string]any{"items": []any{map[string]any{"sku": "a", "qty": 1}}}},
		{name: "enum", payload: withField("status", `"PAID"`), want: map[string]any{"status": "PAID"}},
		{name: "enum unknown symbol", payload: withField("status", `"LOST"`), err: "is not a symbol of enum com.acme.Status", path: "status"},
		{name: "map", payload: withField("attrs", `{"a":1,"b":2}`), want: map[string]any{"attrs": map[string]any{"a": int64(1), "b": int64(2)}}},
		{name: "map wrong value", payload: withField("attrs", `{"a":"x"}`), err: `attrs["a"]: "x" is not an Avro long`, path: `attrs["a"]`},
		{name: "fixed wrong size", payload: withField("hash", `"abc"`), err: "3 bytes do not fit fixed com.acme.Hash of 4 bytes", path: "hash"},
		{name: "bytes latin1", payload: withField("raw", `"\u00ff\u0001"`), want: map[string]any{"raw": []byte{0xff, 1}}},
		{name: "bytes above 255", payload: withField("raw", `"\u0100"`), err: "is not a byte", path: "raw"},
		{name: "nullable union null", payload: withField("note", "null"), want: map[string]any{"note": nil}},
		{name: "nullable union plain string", payload: withField("note", `"hi"`), want: map[string]any{"note": "hi"}},
		{name: "nullable union wrapped", payload: withField("note", `{"string":"hi"}`), want: map[string]any{"note": "hi"}},
		{name: "nullable union wrong type", payload: withField("note", "5"), err: "5 is not an Avro string", path: "note"},
		{name: "union plain long", payload: withField("choice", "5"), want: map[string]any{"choice": int64(5)}},
		{name: "union plain string", payload: withField("choice", `"x"`), want: map[string]any{"choice": "x"}},
		{name: "union wrapped", payload: withField("choice", `{"long":7}`), want: map[string]any{"choice": int64(7)}},
		{name: "union wrapped wrong", payload: withField("choice", `{"long":"7"}`), err: `"7" is not an Avro long`, path: "choice"},
		{name: "union unknown branch name", payload: withField("choice", `{"double":1.5}`), err: "fits no branch of union [null,long,string]", path: "choice"},
		{name: "union two keys", payload: withField("choice", `{"long":1,"string":"x"}`), err: "fits no branch", path: "choice"},
		{name: "union ambiguous", payload: withField("either", "3"), err: `fits several branches of union [int,long] (int, long): write it as {"int": value}`, path: "either"},
		{name: "union ambiguous resolved", payload: withField("either", `{"long":3}`), want: map[string]any{"either": int64(3)}},
		{name: "timestamp millis int", payload: withField("at", "1700000000123")},
		{name: "timestamp RFC 3339", payload: withField("at", `"2023-11-14T22:13:20.123Z"`), want: map[string]any{"at": "2023-11-14T22:13:20.123Z"}},
		{name: "timestamp micros RFC 3339", payload: withField("atu", `"2023-11-14T22:13:20.123456Z"`), want: map[string]any{"atu": "2023-11-14T22:13:20.123456Z"}},
		{name: "timestamp bad", payload: withField("at", `"yesterday"`), err: "is not an RFC 3339 time", path: "at"},
		{name: "date string", payload: withField("day", `"2024-02-29"`), want: map[string]any{"day": "2024-02-29"}},
		{name: "date int", payload: withField("day", `19782`), want: map[string]any{"day": "2024-02-29"}},
		{name: "uuid", payload: withField("uid", `"7d444840-9dc0-11d1-b245-5ffdce74fad2"`), want: map[string]any{"uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2"}},
		{name: "decimal number", payload: withField("amount", "12.34"), want: map[string]any{"amount": 12.34}},
		{name: "decimal string", payload: withField("amount", `"-0.5"`), want: map[string]any{"amount": -0.5}},
		{name: "decimal too many places", payload: withField("amount", "1.234"), err: "more than 2 decimal places", path: "amount"},
		{name: "decimal too many digits", payload: withField("amount", "12345678.9"), err: "more than 9 digits", path: "amount"},
		{name: "decimal hostile exponent", payload: withField("amount", `"1e999999999"`), err: "is not a decimal of precision 9", path: "amount"},
		{name: "decimal hex float (big.Rat would expand it)", payload: withField("amount", `"0x1p999999999"`), err: "is not a decimal number", path: "amount"},
		{name: "decimal fraction syntax", payload: withField("amount", `"1/4"`), err: "is not a decimal number", path: "amount"},
		{name: "null field of type null", payload: withField("nothing", "1"), err: "1 is not null", path: "nothing"},
		{name: "not an object", payload: `[1]`, err: "an array is not an object (record com.acme.Order)"},
		{name: "not JSON", payload: `{"id":`, err: "payload is not JSON"},
		{name: "trailing data", payload: minimal + ` {}`, err: "data after its JSON value"},
		{name: "invalid UTF-8", payload: `{"id":1,"note":"` + "\xff" + `"}`, err: "not valid UTF-8 (byte 16)"},
		{name: "deep nesting", payload: withField("attrs", deep), err: `attrs["a"]: an object is not an Avro long`},
		{name: "too deep for encoding/json", payload: strings.Repeat("[", 20000) + strings.Repeat("]", 20000), err: "payload is not JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := c.encode(nil, []byte(tc.payload))
			if tc.err != "" {
				var fe *fieldError
				if err == nil || !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want a field error containing %q", err, tc.err)
				}
				if tc.path != "" && fe.path != tc.path {
					t.Fatalf("path = %q, want %q", fe.path, tc.path)
				}
				return
			}
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			// Independent check: hamba decodes the bytes.
			var got map[string]any
			if err := avro.Unmarshal(c.schema, b, &got); err != nil {
				t.Fatalf("hamba cannot read what we wrote: %v", err)
			}
			// Our decode must give back JSON that encodes to the same bytes.
			j, err := c.decode(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			b2, err := c.encode(nil, j)
			var again map[string]any
			if err == nil {
				err = avro.Unmarshal(c.schema, b2, &again)
			}
			if err != nil || !reflect.DeepEqual(again, got) { // maps encode in any order: compare values
				t.Fatalf("round trip through %s: %v\n got %v\nwant %v", j, err, again, got)
			}
			var asJSON map[string]any
			_ = json.Unmarshal(j, &asJSON)
			for k, want := range tc.want {
				g := got[k]
				if k == "at" || k == "atu" || k == "day" || k == "amount" {
					g = asJSON[k] // logical types compared in their JSON form
				}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("%s = %#v, want %#v", k, g, want)
				}
			}
		})
	}
}
