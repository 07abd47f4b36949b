package decoder

import (
	"bufio"
	"bytes"
	"reflect"
	"testing"
)

// A streamed transaction's events go through the spool: the mapped fields
// (text id, table, a null value, a null header value) must come back as
// they went in, and so must the identity columns.
func TestSpoolKeepsMappedFields(t *testing.T) {
	for _, ev := range []Event{
		{IDText: "8b1d3a4e-0000-4000-8000-000000000001", TableIndex: 3, AggregateID: "k", Payload: nil,
			Headers: []Header{{Key: "trace", Value: nil}, {Key: "type", Value: []byte("Created")}, {Key: "empty", Value: []byte{}}}},
		{ID: 42, AggregateID: "k", Payload: []byte{}, Err: &RowError{Table: "s.t", IDText: "ev-1", Column: "key", Reason: "is NULL"}},
		{ID: 43, AggregateID: "k", Payload: []byte("{}"), EventID: "0190a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b", ReplayOf: 41},
	} {
		rec := encodeEvent(nil, &ev)
		got, _, err := readEvent(bufio.NewReader(bytes.NewReader(rec)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Errorf("spool round trip:\n got %+v\nwant %+v", got, ev)
		}
	}
}
