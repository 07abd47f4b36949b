package decoder_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// TestEventsShareSlabs: the events of transactions decoded one after the
// other (one of them in chunks, with a message event and a bad row among the
// rows) come out exactly as decoded alone, they stay so while later
// transactions are decoded (the decoder never writes bytes it handed out),
// an append to one event's payload, header values or headers never changes
// another event, and a transaction of 100 rows takes a few allocations, not
// some per event.
func TestEventsShareSlabs(t *testing.T) { // not parallel: AllocsPerRun
	d, err := decoder.New("public.outbox")
	if err != nil {
		t.Fatal(err)
	}
	d.SetMessagePrefix("outbox", 0)
	d.SetChunk(7, 0)
	hdr := func(i int) tv {
		switch i % 4 {
		case 0:
			return null
		case 1:
			return text(`{}`)
		}
		return text(fmt.Sprintf(`{"n": %d, "trace": "t-%d"}`, i, i))
	}
	payload := func(i int) string {
		if i%5 == 0 {
			return `""` // short
		}
		return fmt.Sprintf(`{"i": %d, "pad": "%s"}`, i, bytes.Repeat([]byte{'x'}, i*97%3000))
	}
	var got []decoder.Event
	var want []decoder.Event
	lsn := pglogrepl.LSN(0x10000)
	decode := func(m []byte) *decoder.Txn {
		lsn += 0x100
		txn, err := d.Decode(lsn, m)
		if err != nil {
			t.Fatal(err)
		}
		return txn
	}
	decode(outboxRelation())
	for x := range 5 {
		base := x * 20
		commitAt := pglogrepl.LSN(0x100000 * (x + 1))
		decode(begin(commitAt, uint32(x+1)))
		rows := 20
		if x == 2 {
			rows = 1
		}
		for i := base; i < base+rows; i++ {
			id := fmt.Sprint(i + 1)
			if i == 13 {
				id = "not a number" // a poison row: Err, own allocations
			}
			r := row(id, "order", fmt.Sprintf("agg-%d", i), "E", payload(i), hdr(i))
			m := insert(outboxID, r...)
			if txn := decode(m); txn != nil {
				got = append(got, txn.Events...)
			}
			// The same row decoded alone (its own allocations).
			alone, err := decoder.New("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range [][]byte{outboxRelation(), begin(1, 1), m, commit(1, 2)} {
				txn, err := alone.Decode(lsn, a)
				if err != nil {
					t.Fatal(err)
				}
				if txn != nil {
					want = append(want, txn.Events...)
				}
			}
			if i == 4 {
				msg := message(true, lsn, "outbox", `{"id": "m-1", "aggregate_type": "order", "aggregate_id": "agg-m", "event_type": "E", "payload": {"a": 1}, "headers": {"k": "v", "n": 2}}`)
				if txn := decode(msg); txn != nil {
					got = append(got, txn.Events...)
				}
				wantMsg, err := decoder.New("public.outbox")
				if err != nil {
					t.Fatal(err)
				}
				wantMsg.SetMessagePrefix("outbox", 0)
				for _, a := range [][]byte{begin(1, 1), msg, commit(1, 2)} {
					txn, err := wantMsg.Decode(lsn, a)
					if err != nil {
						t.Fatal(err)
					}
					if txn != nil {
						want = append(want, txn.Events...)
					}
				}
			}
		}
		if txn := decode(commit(commitAt, commitAt+0x10)); txn != nil {
			got = append(got, txn.Events...)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d", len(got), len(want))
	}
	same := func(i int) {
		t.Helper()
		g, w := got[i], want[i]
		g.LSN, w.LSN = 0, 0
		if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w) || (g.Payload == nil) != (w.Payload == nil) || (g.Headers == nil) != (w.Headers == nil) {
			t.Fatalf("event %d:\n%+v\nwant\n%+v", i, g, w)
		}
		if (g.Err == nil) != (w.Err == nil) || g.Err != nil && g.Err.Error() != w.Err.Error() {
			t.Fatalf("event %d: Err %v, want %v", i, g.Err, w.Err)
		}
	}
	for i := range got {
		same(i)
	}
	// Scribble past the end of every event's slices: no other event
	// changes.
	for i := range got {
		ev := &got[i]
		_ = append(ev.Payload, 'X')
		_ = append(ev.Headers, decoder.Header{Key: "x", Value: []byte("y")})
		for _, h := range ev.Headers {
			_ = append(h.Value, 'X')
		}
	}
	for i := range got {
		same(i)
	}

	// A 100-row transaction: its events, the Txn, the AggregateIDs' string
	// and now and then a new block.
	var msgs [][]byte
	for i := range 100 {
		msgs = append(msgs, insert(outboxID, row(fmt.Sprint(i+1), "order", fmt.Sprintf("agg-%d", i), "E", payload(i%50+1), hdr(2))...))
	}
	d.SetChunk(0, 0)
	next := pglogrepl.LSN(0x1000000)
	allocs := testing.AllocsPerRun(20, func() {
		next += 0x1000
		if _, err := d.Decode(next, begin(next, 1)); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if _, err := d.Decode(next, m); err != nil {
				t.Fatal(err)
			}
		}
		if txn, err := d.Decode(next, commit(next, next+1)); err != nil || len(txn.Events) != 100 {
			t.Fatalf("%v, %v", txn, err)
		}
	})
	// begin and commit allocate their messages: 2 of these.
	if allocs > 12 {
		t.Errorf("a 100-row transaction takes %.0f allocations, want at most 12", allocs)
	}

	// The same for 100 message events.
	msgs = msgs[:0]
	for i := range 100 {
		msgs = append(msgs, message(true, 0x10, "outbox", fmt.Sprintf(`{"id":"m-%d","aggregate_type":"order","aggregate_id":"agg-%d","event_type":"E","payload":%s,"headers":{"n":%d,"trace":"t-%d"}}`, i, i, payload(i%50+1), i, i)))
	}
	allocs = testing.AllocsPerRun(20, func() {
		next += 0x1000
		if _, err := d.Decode(next, begin(next, 1)); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if _, err := d.Decode(next, m); err != nil {
				t.Fatal(err)
			}
		}
		if txn, err := d.Decode(next, commit(next, next+1)); err != nil || len(txn.Events) != 100 || txn.Events[99].Err != nil {
			t.Fatalf("%v, %v", txn, err)
		}
	})
	if allocs > 12 {
		t.Errorf("a transaction of 100 message events takes %.0f allocations, want at most 12", allocs)
	}
}
