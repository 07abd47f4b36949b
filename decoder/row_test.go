package decoder_test

import (
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// Row must give the Event Decode gives for the same row sent by pgoutput:
// replay republishes rows read with SQL as the very events the relay
// streams (same checks, same bytes, same errors).
func TestRowMatchesDecode(t *testing.T) {
	null := "\x00null"
	tests := []struct {
		name string
		cols [6]string // id, aggregate_type, aggregate_id, event_type, payload, headers; null = SQL NULL
	}{
		{"plain", [6]string{"7", "order", "o-1", "order.paid", `{"a": 1, "b": "café"}`, `{"trace_id": "t-1", "n": 2, "x": {"y": [1, 2]}}`}},
		{"no headers", [6]string{"8", "order", "o-1", "order.paid", `{"a": 1}`, null}},
		{"empty headers", [6]string{"9", "order", "o-1", "order.paid", `{}`, `{}`}},
		{"escaped header", [6]string{"10", "order", "o-1", "order.paid", `[]`, `{"k\"q": "v\u00e9\n"}`}},
		{"null aggregate_id", [6]string{"11", "order", null, "order.paid", `{}`, null}},
		{"empty aggregate_id", [6]string{"12", "order", "", "order.paid", `{}`, null}},
		{"null payload", [6]string{"13", "order", "o-1", "order.paid", null, null}},
		{"headers not an object", [6]string{"14", "order", "o-1", "order.paid", `{}`, `[1, 2]`}},
		{"reserved header", [6]string{"15", "order", "o-1", "order.paid", `{}`, `{"Event_ID": "x"}`}},
		{"bad id", [6]string{"x1", "order", "o-1", "order.paid", `{}`, null}},
	}
	lsn := pglogrepl.LSN(0x16B3F28)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pg []pgoutputtest.Col
			var rt [6][]byte
			for i, c := range tt.cols {
				if c == null {
					pg = append(pg, pgoutputtest.Null)
					continue
				}
				pg = append(pg, pgoutputtest.Text(c))
				rt[i] = []byte(c)
			}
			d, _ := decoder.New("public.outbox")
			msgs := [][]byte{
				pgoutputtest.Begin(0x16B4000, 1),
				pgoutputtest.Relation(1, "public", "outbox", "id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"),
			}
			for _, m := range msgs {
				if _, err := d.Decode(lsn, m); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := d.Decode(lsn, pgoutputtest.Insert(1, pg...)); err != nil {
				t.Fatal(err)
			}
			txn, err := d.Decode(lsn, pgoutputtest.Commit(0x16B4000, 0x16B4100))
			if err != nil || txn == nil || len(txn.Events) != 1 {
				t.Fatalf("decode: %v %+v", err, txn)
			}
			want := txn.Events[0]
			r, _ := decoder.New("public.outbox")
			got := r.Row(decoder.RowText{ID: rt[0], AggregateType: rt[1], AggregateID: rt[2], EventType: rt[3], Payload: rt[4], Headers: rt[5]}, lsn)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Row:\n got %+v (err %v)\nwant %+v (err %v)", got, got.Err, want, want.Err)
			}
		})
	}
}
