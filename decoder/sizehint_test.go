package decoder_test

import (
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/decoder"
	pt "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// TestEventsSizedLikeLastTxn: a transaction's Events slice starts with the
// capacity of the last one handed out (bounded by the chunk limit), so
// decoding it does not grow and copy the slice again and again; the
// events are the same either way.
func TestEventsSizedLikeLastTxn(t *testing.T) {
	txn := func(first, n int) [][]byte {
		msgs := [][]byte{pt.Begin(0x100000, uint32(first))}
		for i := 0; i < n; i++ {
			id := strconv.Itoa(first + i)
			msgs = append(msgs, pt.Insert(pt.OutboxID, pt.Row(id, "order", "o-"+id, "created", `{"n":`+id+`}`, pt.Null)...))
		}
		return append(msgs, pt.Commit(0x100000, 0x100100))
	}
	for _, tc := range []struct {
		name     string
		chunk    int
		sizes    []int
		wantCaps []int // of each transaction's (or chunk's) Events; -1: any (the first grows)
	}{
		{name: "same size", sizes: []int{100, 100, 100}, wantCaps: []int{-1, 100, 100}},
		{name: "smaller, then larger", sizes: []int{100, 10, 20}, wantCaps: []int{-1, 100, 20}},
		{name: "one row each", sizes: []int{1, 1}, wantCaps: []int{1, 1}},
		{name: "an empty transaction keeps the size", sizes: []int{50, 0, 50}, wantCaps: []int{-1, 0, 50}},
		{name: "bounded by the chunk limit", chunk: 30, sizes: []int{90, 30}, wantCaps: []int{-1, 30, 30, 0, 30, 0}},
		{name: "bounded to 1024", sizes: []int{3000, 10}, wantCaps: []int{-1, 1024}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := decoder.New("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			d.SetChunk(tc.chunk, 0)
			msgs := [][]byte{pt.OutboxRelation()}
			next := 1
			for _, n := range tc.sizes {
				msgs = append(msgs, txn(next, n)...)
				next += n
			}
			var caps []int
			id := int64(1)
			for i, m := range msgs {
				txn, err := d.Decode(lsnAt(i), m)
				for err == nil && txn != nil {
					caps = append(caps, cap(txn.Events))
					for _, ev := range txn.Events {
						if ev.ID != id || ev.AggregateID != "o-"+strconv.FormatInt(id, 10) {
							t.Fatalf("event %+v, want id %d", ev, id)
						}
						id++
					}
					txn, err = d.Next()
				}
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			if len(caps) != len(tc.wantCaps) {
				t.Fatalf("capacities %v, want %v", caps, tc.wantCaps)
			}
			for i := range caps {
				if tc.wantCaps[i] >= 0 && caps[i] != tc.wantCaps[i] {
					t.Errorf("capacities %v, want %v", caps, tc.wantCaps)
					break
				}
			}
		})
	}
}
