package record

import (
	"bytes"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestRecordsFromOneSlab: the records of a transaction take their headers
// from one slab (two allocations per transaction, not two per event), are
// the same records Own builds, and an append to one record's headers or
// header values never writes into the next record's.
func TestRecordsFromOneSlab(t *testing.T) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	evs := make([]decoder.Event, 100)
	for i := range evs {
		id := strconv.Itoa(i + 1)
		evs[i] = decoder.Event{ID: int64(i + 1), AggregateType: "order", AggregateID: "o-" + id, EventType: "created",
			Payload: []byte(`{"n":` + id + `}`), LSN: pglogrepl.LSN(0x1000 + 0x40*i)}
		switch i % 3 {
		case 1:
			evs[i].Headers = []decoder.Header{{Key: "trace", Value: []byte("t-" + id)}, {Key: "tenant", Value: []byte("x")}}
		case 2:
			evs[i].IDText, evs[i].ID = "3f6c-"+id, 0
			evs[i].Headers = []decoder.Header{}
		}
	}
	evs[99].Source, evs[99].MessageID = decoder.SourceMessage, "m-100"
	const commit = "0/16B3F48"

	sl := newSlab(evs, commit)
	recs := make([]struct {
		h   []sink.Header
		key []byte
	}, len(evs))
	for i := range evs {
		var m sink.Message
		To(&m, sl, &evs[i], commit, at)
		want := Own(&evs[i], commit, at)
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("event %d: record %+v, want %+v", i, m, want)
		}
		recs[i].h, recs[i].key = m.Headers, m.Key
	}
	// Scribble past the end of every record's slices: the next record
	// must not change.
	for i := range recs {
		before := Own(&evs[min(i+1, len(evs)-1)], commit, at)
		_ = append(recs[i].h, sink.Header{Key: []byte("x"), Value: []byte("y")})
		for _, h := range recs[i].h {
			_ = append(h.Key, "XXXXXXXX"...)
			_ = append(h.Value, "XXXXXXXX"...)
		}
		_ = append(recs[i].key, "XXXXXXXX"...)
		if i+1 < len(recs) {
			if !reflect.DeepEqual(recs[i+1].h, before.Headers) || !bytes.Equal(recs[i+1].key, before.Key) {
				t.Fatalf("appending to record %d's headers changed record %d's: %q", i, i+1, recs[i+1].h)
			}
		}
	}

	allocs := testing.AllocsPerRun(20, func() {
		sl := newSlab(evs, commit)
		for i := range evs {
			var m sink.Message
			To(&m, sl, &evs[i], commit, at)
		}
	})
	if allocs > 3 {
		t.Errorf("the records of a %d-event transaction take %.0f allocations, want at most 3 (the slab)", len(evs), allocs)
	}
}

// LSNText renders an LSN exactly as pglogrepl (and PostgreSQL) do.
func TestLSNText(t *testing.T) {
	for _, l := range []pglogrepl.LSN{0, 1, 0xA, 0x16B3F48, 0xFFFFFFFF, 0x1_00000000, 0xABCDEF01_23456789, 0xFFFFFFFF_FFFFFFFF} {
		if got, want := LSNText(l), l.String(); got != want {
			t.Errorf("LSNText(%d) = %q, want %q", uint64(l), got, want)
		}
	}
	x := uint64(1)
	for range 1000 {
		x = x*6364136223846793005 + 1442695040888963407 // an LCG: spread over all 64 bits
		if l := pglogrepl.LSN(x); LSNText(l) != l.String() {
			t.Fatalf("LSNText(%d) = %q, want %q", x, LSNText(l), l.String())
		}
	}
}

// newSlab sizes a slab of its own for the records of evs, as the pipeline
// does with a transaction's memory (txnMem.slab).
func newSlab(evs []decoder.Event, commitLSN string) *Slab {
	nh, nb := SlabSize(evs, commitLSN)
	s := NewSlab(make([]sink.Header, nh), make([]byte, nb))
	return &s
}
