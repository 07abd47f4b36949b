package relay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// The lag is the age of the oldest emitted heartbeat the ack watermark has
// not passed, or of the oldest unacked event in memory if that is older.
func TestLag(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type op struct {
		emit   pglogrepl.LSN // emitted heartbeat ending here, sent at `at`
		decode pglogrepl.LSN // heartbeat sent at `at` decoded at this position
		at     float64
	}
	tests := []struct {
		name      string
		max       int
		ops       []op
		watermark pglogrepl.LSN
		unacked   float64 // add time of the oldest unacked event; <0: none
		now       float64
		want      float64 // seconds
	}{
		{name: "nothing emitted, nothing in flight", unacked: -1, now: 10, want: 0},
		{name: "in-memory event only (heartbeats off)", unacked: 4, now: 10, want: 6},
		{name: "all passed", ops: []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}}, watermark: 0x200, unacked: -1, now: 10, want: 0},
		{name: "watermark between: the oldest not passed counts",
			ops: []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}, {emit: 0x300, at: 3}}, watermark: 0x1ff, unacked: -1, now: 10, want: 8},
		{name: "stuck: none passed", ops: []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}}, watermark: 0x50, unacked: -1, now: 41, want: 40},
		{name: "in-memory event older than every unpassed heartbeat",
			ops: []op{{emit: 0x100, at: 5}}, watermark: 0x50, unacked: 2, now: 10, want: 8},
		{name: "decoded: passed at the record's start",
			ops: []op{{emit: 0x160, at: 1}, {decode: 0x100, at: 1}, {emit: 0x260, at: 2}}, watermark: 0x100, unacked: -1, now: 10, want: 8},
		{name: "decoded heartbeat not emitted by this term: ignored",
			ops: []op{{decode: 0x100, at: 0.5}, {emit: 0x260, at: 2}}, watermark: 0x100, unacked: -1, now: 10, want: 8},
		{name: "decoded after it passed: nothing to do",
			ops: []op{{emit: 0x160, at: 1}, {emit: 0x260, at: 2}, {decode: 0x100, at: 1}}, watermark: 0x1000, unacked: -1, now: 10, want: 0},
		{name: "full: merging keeps the oldest time",
			max: 4, ops: []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}, {emit: 0x300, at: 3}, {emit: 0x400, at: 4}, {emit: 0x500, at: 5}},
			watermark: 0x50, unacked: -1, now: 10, want: 9},
		{name: "full: a merged entry passes only with its newest heartbeat (never under)",
			max: 4, ops: []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}, {emit: 0x300, at: 3}, {emit: 0x400, at: 4}, {emit: 0x500, at: 5}},
			watermark: 0x100, unacked: -1, now: 10, want: 9},
		{name: "full: merged entries pass", max: 4,
			ops:       []op{{emit: 0x100, at: 1}, {emit: 0x200, at: 2}, {emit: 0x300, at: 3}, {emit: 0x400, at: 4}, {emit: 0x500, at: 5}},
			watermark: 0x200, unacked: -1, now: 10, want: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0
			b := newBeats(tt.max, func() time.Time { return now })
			for _, o := range tt.ops {
				if o.emit != 0 {
					b.emitted(o.emit, at(o.at), 0)
				}
				if o.decode != 0 {
					b.decoded(decoder.Heartbeat{LSN: o.decode, Sent: at(o.at).UnixNano()})
				}
			}
			var oldest time.Time
			if tt.unacked >= 0 {
				oldest = at(tt.unacked)
			}
			now = at(tt.now)
			if got := b.lag(tt.watermark, oldest, tt.unacked >= 0); got != time.Duration(tt.want*float64(time.Second)) {
				t.Errorf("lag = %s, want %vs", got, tt.want)
			}
			if tt.max > 0 && b.len() > tt.max {
				t.Errorf("%d heartbeats kept, over the bound %d", b.len(), tt.max)
			}
		})
	}
}

// Heartbeats the watermark passed are forgotten: the list stays short in a
// healthy relay, and bounded in a stuck one.
func TestLagBounded(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBeats(0, func() time.Time { return now })
	for i := 1; i <= 3*maxBeats; i++ {
		now = now.Add(time.Second)
		b.emitted(pglogrepl.LSN(i*0x60), now, 0)
	}
	if b.len() > maxBeats {
		t.Fatalf("%d heartbeats kept, want at most %d", b.len(), maxBeats)
	}
	if got, want := b.lag(0, time.Time{}, false), time.Duration(3*maxBeats-1)*time.Second; got != want {
		t.Errorf("lag = %s after a long stall, want %s (the oldest heartbeat's age)", got, want)
	}
	// A healthy relay: each heartbeat passes before the next is emitted.
	h := newBeats(0, func() time.Time { return now })
	for i := 1; i <= 3*maxBeats; i++ {
		h.emitted(pglogrepl.LSN(i*0x60), now, pglogrepl.LSN((i-1)*0x60))
	}
	if h.len() != 1 {
		t.Errorf("%d heartbeats kept by a relay that keeps up, want 1", h.len())
	}
	if got := b.lag(pglogrepl.LSN(3*maxBeats*0x60), time.Time{}, false); got != 0 || b.len() != 0 {
		t.Errorf("lag = %s with %d kept after the watermark passed all, want 0 and none", got, b.len())
	}
}

// A standby (no leadership term) exports outbox_relay_lag_seconds as 0,
// and the heartbeat counters, from the process's registry.
func TestStandbyExportsZeroLag(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Postgres.URL = "postgres://relay@db:5432/app"
	cfg.Kafka.Brokers = []string{"k1:9092"}
	cfg.MetricsAddr = ""
	r, err := New(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"outbox_relay_lag_seconds": false, "outbox_relay_heartbeats_total": false, "outbox_relay_heartbeat_errors_total": false}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; !ok {
			continue
		}
		want[mf.GetName()] = true
		m := mf.GetMetric()[0]
		if v := m.GetGauge().GetValue() + m.GetCounter().GetValue(); v != 0 {
			t.Errorf("%s = %v without a term, want 0", mf.GetName(), v)
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("%s is not exported without a term", name)
		}
	}
}
