package decoder_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// A transaction larger than the chunk limits comes out in pieces, in log
// order, every piece but the last marked Partial with the Begin's final LSN
// as CommitLSN and no EndLSN, so memory stays bounded.
func TestChunkedTransaction(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		events, bytes int
		rows          int
		wantChunks    []int // events per returned Txn; the last is the Commit
	}{
		{"by events", 3, 0, 8, []int{3, 3, 2}},
		{"exact multiple", 4, 0, 8, []int{4, 4, 0}},
		{"by bytes", 0, 20, 5, []int{2, 2, 1}}, // payloads are 10-11 bytes
		{"off", 0, 0, 5, []int{5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, _ := decoder.New("public.outbox")
			d.SetChunk(tt.events, tt.bytes)
			msgs := [][]byte{begin(0x5000, 7), outboxRelation()}
			for i := 1; i <= tt.rows; i++ {
				msgs = append(msgs, insert(outboxID, row(fmt.Sprint(i), "order", "o-1", "E", fmt.Sprintf(`{"n": %03d}`, i), null)...))
			}
			msgs = append(msgs, commit(0x5000, 0x5040))
			var got []*decoder.Txn
			for i, m := range msgs {
				txn, err := d.Decode(pglogrepl.LSN(0x4000+i), m)
				if err != nil {
					t.Fatal(err)
				}
				if txn != nil {
					got = append(got, txn)
				}
			}
			if len(got) != len(tt.wantChunks) {
				t.Fatalf("%d chunks, want %d", len(got), len(tt.wantChunks))
			}
			next := int64(1)
			for i, txn := range got {
				last := i == len(got)-1
				if len(txn.Events) != tt.wantChunks[i] || txn.Partial == last || txn.CommitLSN != 0x5000 {
					t.Fatalf("chunk %d: %d events partial=%v commit=%s, want %d events partial=%v commit 0/5000",
						i, len(txn.Events), txn.Partial, txn.CommitLSN, tt.wantChunks[i], !last)
				}
				if (txn.EndLSN != 0) != last {
					t.Fatalf("chunk %d: EndLSN %s; only the last chunk carries it", i, txn.EndLSN)
				}
				for _, ev := range txn.Events {
					if ev.ID != next {
						t.Fatalf("event id %d, want %d: chunks out of order", ev.ID, next)
					}
					next++
				}
			}
			if c := d.Counts(); c.Events != uint64(tt.rows) || c.Txns != 1 {
				t.Fatalf("counts %+v, want %d events in 1 txn", c, tt.rows)
			}
		})
	}
}
