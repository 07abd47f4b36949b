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
		{name: "smaller, then larger", sizes: []int{100, 10, 20}, wantCaps: []int{-1, 100, grown(10)}},
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

// grown is the capacity append gives an Events slice of capacity n that
// needs one more: twice n, rounded up to the allocator's size class of
// Events.
func grown(n int) int { return cap(append(make([]decoder.Event, n), decoder.Event{})) }

// TestRecycledEventsReused: the Events slice handed back with Recycle is
// where the next transaction's events are built; the payloads and headers
// the recycled events referred to stay as they were.
func TestRecycledEventsReused(t *testing.T) {
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Decode(lsnAt(0), pt.OutboxRelation()); err != nil {
		t.Fatal(err)
	}
	next := 1
	txn := func(n int) *decoder.Txn {
		t.Helper()
		msgs := [][]byte{pt.Begin(0x100000, uint32(next))}
		for i := 0; i < n; i++ {
			id := strconv.Itoa(next + i)
			msgs = append(msgs, pt.Insert(pt.OutboxID, pt.Row(id, "order", "o-"+id, "created", `{"n":`+id+`}`, pt.Text(`{"k":"v`+id+`"}`))...))
		}
		msgs = append(msgs, pt.Commit(0x100000, 0x100100))
		var out *decoder.Txn
		for i, m := range msgs {
			got, err := d.Decode(lsnAt(i+1), m)
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				out = got
			}
		}
		next += n
		return out
	}
	first := txn(5)
	array := &first.Events[:1][0]
	payloads, headers := make([][]byte, 5), make([][]decoder.Header, 5)
	for i := range first.Events {
		payloads[i], headers[i] = first.Events[i].Payload, first.Events[i].Headers
	}
	d.Recycle(first.Events)
	second := txn(5)
	if &second.Events[0] != array {
		t.Errorf("the next transaction's Events is a new slice, want the recycled one")
	}
	for i := range second.Events {
		if id := int64(6 + i); second.Events[i].ID != id || second.Events[i].AggregateID != "o-"+strconv.FormatInt(id, 10) {
			t.Errorf("event %d of the second transaction: %+v, want id %d", i, second.Events[i], id)
		}
	}
	for i := range payloads {
		want := `{"n":` + strconv.Itoa(1+i) + `}`
		if string(payloads[i]) != want || len(headers[i]) != 1 || string(headers[i][0].Value) != "v"+strconv.Itoa(1+i) {
			t.Errorf("event %d of the recycled transaction now has payload %s headers %v, want %s", i, payloads[i], headers[i], want)
		}
	}
	d.Recycle(second.Events)
	big := txn(1100) // larger than an Events slice is kept
	d.Recycle(big.Events)
	if small := txn(2); &small.Events[0] == &big.Events[:1][0] {
		t.Errorf("a slice of %d events was kept for reuse", cap(big.Events))
	}
}
