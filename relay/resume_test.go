package relay

import (
	"errors"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A new session resumes from the pipeline's own position only when the
// server is on the same history and the stream shows the kept transaction
// again; everything else republishes from the slot. Each case acks three
// transactions (xids 1-3), reconnects with the slot confirmed after the
// first, and sends what the server would stream then.
func TestSessionResumesOnlyOnTheSameHistory(t *testing.T) {
	mark := history.Mark{SystemID: "sys", Timeline: 1, Slot: "s", SlotLSN: 0x10, SlotXid: 5, Generation: 3}
	type wal struct {
		commit, end pglogrepl.LSN
		xid         uint32
		id          string
	}
	old := []wal{{100, 110, 1, "1"}, {200, 210, 2, "2"}, {300, 310, 3, "3"}}
	cases := []struct {
		name    string
		now     history.Now
		resent  []wal
		restart bool     // the stream refutes the kept position: the session restarts
		want    []string // published after the reconnect, in order
		// idle, when set, is a keepalive after the resent transactions
		// (the server's WAL past them holds no outbox transaction).
		idle pglogrepl.LSN
	}{
		{"same history: nothing twice", history.Now{Mark: mark, Raised: 3},
			[]wal{old[1], old[2], {400, 410, 4, "4"}}, false, []string{"4"}, 0},
		{"restored: the generation went back", history.Now{Mark: mark, Raised: 2},
			[]wal{{200, 210, 2, "12"}, {300, 310, 3, "13"}}, false, []string{"12", "13"}, 0},
		{"failed over: another timeline", history.Now{Mark: history.Mark{SystemID: "sys", Timeline: 2, Slot: "s", SlotLSN: 0x10, SlotXid: 5, Generation: 4}, Raised: 3},
			[]wal{{200, 210, 9, "22"}}, false, []string{"22"}, 0},
		{"slot created again", history.Now{Mark: history.Mark{SystemID: "sys", Timeline: 1, Slot: "s", SlotLSN: 0x150, SlotXid: 9, Generation: 1}},
			[]wal{{200, 210, 2, "32"}}, false, []string{"32"}, 0},
		{"restored within a generation: another transaction at the kept LSN", history.Now{Mark: mark, Raised: 3},
			[]wal{{200, 210, 2, "42"}, {300, 310, 7, "43"}}, true, []string{"42", "43"}, 0},
		{"restored within a generation: the stream passes the kept LSN", history.Now{Mark: mark, Raised: 3},
			[]wal{{250, 260, 2, "52"}, {350, 360, 3, "53"}}, true, []string{"52", "53"}, 0},
		{"restored within a generation: nothing but other tables' WAL past the kept LSN", history.Now{Mark: mark, Raised: 3},
			[]wal{{200, 210, 2, "62"}}, true, []string{"62"}, 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, fastPolicy, func(string, int) error { return nil })
			if err := h.reconnect(history.Now{Mark: mark, Raised: 2}); err != nil {
				t.Fatal(err)
			}
			for _, w := range old {
				if err := h.txnXid(h.ctx, w.commit, w.end, w.xid, order(w.id, "a")); err != nil {
					t.Fatal(err)
				}
			}
			h.waitFlushed(310)
			before, _ := h.pub.snapshot()
			now := c.now
			now.Confirmed, now.ServerEnd = 110, 1000 // the slot kept only the first confirmation
			if err := h.reconnect(now); err != nil {
				t.Fatal(err)
			}
			restarted := false
			for i, w := range c.resent {
				err := h.txnXid(h.ctx, w.commit, w.end, w.xid, order(w.id, "a"))
				if errors.Is(err, replication.ErrRestart) && c.restart && !restarted {
					// As the stream: a new session from the slot, which
					// has not moved; the server sends it all again.
					restarted = true
					if h.p.Flushed() != 110 {
						t.Fatalf("watermark %s after the refuted resume, want the slot's 0/6E", h.p.Flushed())
					}
					if err := h.reconnect(now); err != nil {
						t.Fatal(err)
					}
					for _, w := range c.resent[:i+1] {
						if err := h.txnXid(h.ctx, w.commit, w.end, w.xid, order(w.id, "a")); err != nil {
							t.Fatal(err)
						}
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !restarted && i == 0 && c.restart {
					// Skipped, not verified yet: a keepalive before the
					// kept transaction must not confirm it.
					h.keepalive(250)
					if h.p.Flushed() != 110 {
						t.Fatalf("watermark %s after a keepalive while the resume is not verified, want the slot's 0/6E", h.p.Flushed())
					}
				}
			}
			if c.idle != 0 {
				h.keepalive(c.idle)
				if !h.p.Restarting() {
					t.Fatalf("a keepalive at %s past the kept transaction without it: no restart", c.idle)
				}
				if h.p.Flushed() != 110 {
					t.Fatalf("watermark %s, want the slot's 0/6E", h.p.Flushed())
				}
				restarted = true
				if err := h.reconnect(now); err != nil {
					t.Fatal(err)
				}
				for _, w := range c.resent {
					if err := h.txnXid(h.ctx, w.commit, w.end, w.xid, order(w.id, "a")); err != nil {
						t.Fatal(err)
					}
				}
			}
			if restarted != c.restart {
				t.Fatalf("restarted %v, want %v", restarted, c.restart)
			}
			last := c.resent[len(c.resent)-1].end
			h.waitFlushed(last)
			after, _ := h.pub.snapshot()
			var got []string
			for _, m := range after[len(before):] {
				got = append(got, headerMap(m)["event_id"])
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("published after the reconnect %v, want %v", got, c.want)
			}
		})
	}
}

// A dead letter finished on one history says nothing about the event at
// its position on another: after a failover to a standby that lacked it,
// a new event at the same position is published, not skipped as
// dead-lettered already.
func TestSessionForgetsDeadLettersOfAnotherHistory(t *testing.T) {
	mark := history.Mark{SystemID: "sys", Timeline: 1, Slot: "s", SlotLSN: 0x10, SlotXid: 5, Generation: 3}
	h := newHarness(t, fastPolicy, func(topic string, attempt int) error {
		if topic != testDLQ && attempt == 1 { // the first event is refused for good
			return &sink.SoleError{Err: sarama.ErrInvalidRecord}
		}
		return nil
	})
	if err := h.reconnect(history.Now{Mark: mark, Raised: 2}); err != nil {
		t.Fatal(err)
	}
	if err := h.txnXid(h.ctx, 100, 110, 1, order("1", "a")); err != nil {
		t.Fatal(err)
	}
	if m := h.waitMark(); m != "dead 1 attempts=1" {
		t.Fatalf("row mark %q, want dead 1 attempts=1", m)
	}
	h.waitFlushed(110)
	before, _ := h.pub.snapshot()
	// Failed over to a standby whose slot is before that transaction: its
	// timeline wrote another transaction at the same LSNs.
	now := history.Now{Mark: history.Mark{SystemID: "sys", Timeline: 2, Slot: "s", SlotLSN: 0x10, SlotXid: 5, Generation: 4}, Raised: 3,
		Confirmed: 50, ServerEnd: 1000}
	if err := h.reconnect(now); err != nil {
		t.Fatal(err)
	}
	if err := h.txnXid(h.ctx, 100, 110, 9, order("21", "b")); err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(110)
	after, _ := h.pub.snapshot()
	var got []string
	for _, m := range after[len(before):] {
		got = append(got, headerMap(m)["event_id"])
	}
	if !slices.Equal(got, []string{"21"}) {
		t.Fatalf("published after the failover %v, want the new history's event 21", got)
	}
}
