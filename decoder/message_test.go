package decoder_test

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The relay's heartbeats are pgoutput Message records with its prefix,
// written outside any transaction; every other Message (other prefixes,
// transactional ones, malformed ones) is ignored and never breaks decoding.
func TestHeartbeatMessages(t *testing.T) {
	const prefix = "outbox-relay/outbox_relay"
	huge := strings.Repeat("\x00\xff", 1<<20) // 2 MiB of odd bytes
	type beat struct {
		at   int // message index
		lsn  pglogrepl.LSN
		sent int64
	}
	tests := []struct {
		name   string
		prefix string // "" = heartbeats off
		msgs   [][]byte
		beats  []beat
		txns   int
		events int
		other  uint64
	}{
		{name: "ours outside a transaction", prefix: prefix,
			msgs:  [][]byte{message(false, 0x1000, prefix, "1796078412345678901")},
			beats: []beat{{0, 0x1000, 1796078412345678901}}},
		{name: "ours, content not a number: a heartbeat without a time", prefix: prefix,
			msgs:  [][]byte{message(false, 0x1000, prefix, "not-a-number"), message(false, 0x1100, prefix, huge)},
			beats: []beat{{0, 0x1000, 0}, {1, 0x1100, 0}}},
		{name: "heartbeats off: ours ignored", msgs: [][]byte{message(false, 0x1000, prefix, "1")}, other: 1},
		{name: "other prefixes ignored", prefix: prefix, other: 5, msgs: [][]byte{
			message(false, 0x1000, "outbox-relay/other_slot", "1"),
			message(false, 0x1008, prefix+"x", "1"),
			message(false, 0x1010, "outbox-relay/outbox_rela", "1"),
			message(false, 0x1018, "", ""),
			message(false, 0x1020, "app", huge),
		}},
		{name: "transactional messages inside a transaction keep it whole", prefix: prefix, txns: 1, events: 2, other: 2, msgs: [][]byte{
			begin(0x2000, 7), outboxRelation(),
			insert(outboxID, row("1", "order", "o-1", "E", `{}`, null)...),
			message(true, 0x2010, "app", huge),
			message(true, 0x2018, prefix, "1796078412345678901"), // ours, but transactional: not a heartbeat
			insert(outboxID, row("2", "order", "o-1", "E", `{}`, null)...),
			commit(0x2000, 0x2030),
		}},
		{name: "ours between transactions", prefix: prefix, txns: 2, events: 2, msgs: [][]byte{
			begin(0x2000, 7), outboxRelation(), insert(outboxID, row("1", "order", "o-1", "E", `{}`, null)...), commit(0x2000, 0x2030),
			message(false, 0x2040, prefix, "5"),
			begin(0x3000, 8), insert(outboxID, row("2", "order", "o-1", "E", `{}`, null)...), commit(0x3000, 0x3030),
		}, beats: []beat{{4, 0x2040, 5}}},
		{name: "malformed messages ignored", prefix: prefix, other: 5, msgs: [][]byte{
			{'M'},
			{'M', 0, 0, 0},
			[]byte("M\x00\x00\x00\x00\x00\x00\x00\x10\x00outbox-relay/outbox_relay"), // prefix without NUL
			append(message(false, 0x1000, prefix, "12")[:40], 0xff),                  // length past the end
			append(message(false, 0x1000, prefix, "12"), 'x'),                        // bytes after the content
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := decoder.New("public.outbox")
			if err != nil {
				t.Fatal(err)
			}
			d.SetHeartbeatPrefix(tt.prefix)
			var beats []beat
			txns, events := 0, 0
			for i, m := range tt.msgs {
				txn, err := d.Decode(lsnAt(i), append([]byte(nil), m...))
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if txn != nil {
					txns++
					events += len(txn.Events)
				}
				if hb, ok := d.Heartbeat(); ok {
					beats = append(beats, beat{i, hb.LSN, hb.Sent})
				}
			}
			if len(beats) != len(tt.beats) {
				t.Fatalf("heartbeats %+v, want %+v", beats, tt.beats)
			}
			for i := range beats {
				if beats[i] != tt.beats[i] {
					t.Errorf("heartbeat %d = %+v, want %+v", i, beats[i], tt.beats[i])
				}
			}
			c := d.Counts()
			if txns != tt.txns || events != tt.events || c.Events != uint64(tt.events) {
				t.Errorf("%d txns, %d events (counted %d), want %d, %d", txns, events, c.Events, tt.txns, tt.events)
			}
			if c.OtherMessages != tt.other || c.Heartbeats != uint64(len(tt.beats)) {
				t.Errorf("counts %+v, want OtherMessages %d, Heartbeats %d", c, tt.other, len(tt.beats))
			}
			if d.InTxn() {
				t.Error("a transaction is left open")
			}
		})
	}
}

// A heartbeat is reported by the Decode call that decoded it only.
func TestHeartbeatIsReportedOnce(t *testing.T) {
	d, _ := decoder.New("public.outbox")
	d.SetHeartbeatPrefix("outbox-relay/s")
	if _, err := d.Decode(0x10, message(false, 0x10, "outbox-relay/s", "1")); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Heartbeat(); !ok {
		t.Fatal("no heartbeat after the Message")
	}
	if _, err := d.Decode(0x20, begin(0x30, 1)); err != nil {
		t.Fatal(err)
	}
	if hb, ok := d.Heartbeat(); ok {
		t.Fatalf("heartbeat %+v reported again after a Begin", hb)
	}
}

// Decoding a foreign Message allocates nothing, whatever its size, also
// with message events on.
func TestForeignMessageDoesNotAllocate(t *testing.T) {
	d, _ := decoder.New("public.outbox")
	d.SetHeartbeatPrefix("outbox-relay/s")
	d.SetMessagePrefix("orders-outbox", 1<<20)
	big := message(false, 0x10, "app", strings.Repeat("x", 1<<20))
	ours := message(false, 0x10, "outbox-relay/s", strings.Repeat("9", 1<<20))
	for _, m := range [][]byte{big, ours} {
		if n := testing.AllocsPerRun(10, func() { _, _ = d.Decode(0x10, m) }); n != 0 {
			t.Errorf("%d allocations per Message, want 0", int(n))
		}
	}
}
