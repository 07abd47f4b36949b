package relay

import (
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/sink"
)

// rwEvent is an outbox row of TestRewindRepublishesOnlyWhatItMust: its
// aggregate type (the topic, outbox.event.<typ>; "" is order), aggregate
// id (the record key) and the partition the test's producer puts it on.
type rwEvent struct {
	id, typ, agg string
	part         int32
}

// rwSession is what one session hands over, in order, and which of those
// fail (after the others are acked); "?" after an id: it fails before a
// partition was chosen. Every event of the last session is acked.
type rwSession struct {
	sent []string
	fail []string
}

// A rewind publishes again the failed event and every later event of its
// partition, and of its key (a partition count change moves an aggregate),
// or of its whole topic when the failure's partition is unknown; an event
// acked before the rewind with none of those before it is settled without
// a record. Every event handed over again counts as republished, every
// event settled so as skipped; an event never handed over before (it came
// while the rewind waited) counts as neither.
func TestRewindRepublishesOnlyWhatItMust(t *testing.T) {
	ev := func(id, agg string, part int32) rwEvent { return rwEvent{id: id, agg: agg, part: part} }
	tests := []struct {
		name string
		txns [][]rwEvent // committed at 100, 200, ... each ending 10 later
		late []rwEvent   // a transaction that comes after the first session's verdicts
		sess []rwSession
		// republished and skipped are the counters at the end.
		republished, skipped uint64
	}{
		{
			name: "acked events of a partition without a failure are not published again",
			txns: [][]rwEvent{{ev("1", "a", 0)}, {ev("2", "b", 1)}, {ev("3", "a", 0), ev("4", "b", 1)}},
			late: []rwEvent{ev("5", "b", 1)},
			sess: []rwSession{
				{sent: []string{"1", "2", "3", "4"}, fail: []string{"1"}},
				{sent: []string{"1", "3", "5"}}, // 3: written before 1 came again; 5: never handed over
			},
			republished: 2, skipped: 2,
		},
		{
			name: "a failure makes every later event of its partition go again",
			txns: [][]rwEvent{{ev("1", "a", 0)}, {ev("2", "b", 1)}, {ev("3", "c", 1)}, {ev("4", "a", 0)}},
			sess: []rwSession{
				{sent: []string{"1", "2", "3", "4"}, fail: []string{"2"}},
				{sent: []string{"2", "3"}}, // 1 acked below the watermark; 4 skipped
			},
			republished: 2, skipped: 1,
		},
		{
			name: "an event not acked is always published again",
			txns: [][]rwEvent{{ev("1", "a", 0), ev("2", "b", 1)}, {ev("3", "b", 1)}, {ev("4", "d", 2)}},
			sess: []rwSession{
				{sent: []string{"1", "2", "3", "4"}, fail: []string{"1", "2"}},
				{sent: []string{"1", "2", "3"}},
			},
			republished: 3, skipped: 1,
		},
		{
			name: "a failure makes every later event of its key go again, on any partition",
			// The partition count changed between 1 and 2: aggregate a moved to partition 1.
			txns: [][]rwEvent{{ev("1", "a", 0)}, {ev("2", "a", 1)}, {ev("3", "b", 1)}, {ev("4", "c", 2)}},
			sess: []rwSession{
				{sent: []string{"1", "2", "3", "4"}, fail: []string{"1"}},
				{sent: []string{"1", "2", "3"}}, // 3: after 2, which goes again, on its partition
			},
			republished: 3, skipped: 1,
		},
		{
			name: "a failure before a partition was chosen counts for its whole topic",
			txns: [][]rwEvent{{ev("1", "a", 0)}, {ev("2", "b", 1)}, {{id: "3", typ: "invoice", agg: "c", part: 1}}},
			sess: []rwSession{
				{sent: []string{"1", "2", "3"}, fail: []string{"1?"}},
				{sent: []string{"1", "2"}}, // 3: another topic
			},
			republished: 2, skipped: 1,
		},
		{
			name: "a skip holds over the next rewind, and a second failure adds to it",
			txns: [][]rwEvent{{ev("1", "a", 0)}, {ev("2", "b", 1)}, {ev("3", "a", 0)}, {ev("4", "c", 2)}, {ev("5", "a", 0)}},
			sess: []rwSession{
				{sent: []string{"1", "2", "3", "4", "5"}, fail: []string{"1", "4"}},
				{sent: []string{"1", "3", "4", "5"}, fail: []string{"3"}}, // 2 skipped
				{sent: []string{"3", "5"}},                                // 4 skipped; 1 and 2 below the watermark
			},
			republished: 6, skipped: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fastPolicy, nil)
			parts := map[string]int32{}
			for _, txn := range append(tc.txns, tc.late) {
				for _, e := range txn {
					parts[e.id] = e.part
				}
			}
			h.pub.partition = func(m *sink.Message) int32 { return parts[string(m.Headers[0].Value)] }
			send := func(i int, txn []rwEvent) {
				t.Helper()
				var rows [][]pg.Col
				for _, e := range txn {
					typ := e.typ
					if typ == "" {
						typ = "order"
					}
					rows = append(rows, pg.Row(e.id, typ, e.agg, typ+".paid", `{"a":1}`, pg.Null))
				}
				commit := pglogrepl.LSN(100 * (i + 1))
				if err := h.txn(commit, commit+10, rows...); err != nil {
					t.Fatal(err)
				}
			}
			for i, txn := range tc.txns {
				send(i, txn)
			}
			for s, sess := range tc.sess {
				held := map[string]*sink.Message{}
				var got []string
				for range sess.sent {
					m := h.held()
					id := string(m.Headers[0].Value)
					got, held[id] = append(got, id), m
				}
				if strings.Join(got, ",") != strings.Join(sess.sent, ",") {
					t.Fatalf("session %d handed over %v, want %v", s+1, got, sess.sent)
				}
				failing := map[string]bool{}
				for _, id := range sess.fail {
					failing[strings.TrimSuffix(id, "?")] = true
				}
				for _, id := range got {
					if !failing[id] {
						held[id].Done(nil)
					}
				}
				for _, id := range sess.fail {
					m := held[strings.TrimSuffix(id, "?")]
					if strings.HasSuffix(id, "?") {
						m.Partition = -1 // refused before the partitioner ran
					}
					m.Done(sarama.ErrNotEnoughReplicas)
				}
				if s == 0 && tc.late != nil {
					send(len(tc.txns), tc.late)
				}
			}
			n := len(tc.txns)
			if tc.late != nil {
				n++
			}
			h.waitFlushed(pglogrepl.LSN(100*n + 10))
			select {
			case m := <-h.pub.held:
				t.Errorf("event %s published once more after the last session", m.Headers[0].Value)
			default:
			}
			if got := h.restarts.Load(); int(got) != len(tc.sess)-1 {
				t.Errorf("%d restarts, want %d", got, len(tc.sess)-1)
			}
			if got := h.p.resend.republished.Load(); got != tc.republished {
				t.Errorf("republished = %d, want %d", got, tc.republished)
			}
			if got := h.p.resend.skipped.Load(); got != tc.skipped {
				t.Errorf("skipped = %d, want %d", got, tc.skipped)
			}
			if e, _ := h.p.InFlight(); e != 0 {
				t.Errorf("%d events in flight after every ack", e)
			}
		})
	}
}

// The rule the sweep keeps, checked on random sessions: an event is
// skipped only if it was acked, and no event before it (commit order) that
// is published again shares its partition or its key, nor failed on its
// topic before a partition was chosen. Otherwise a consumer would see the
// skipped event before a copy of an earlier one.
func TestResendLogSkipsAreClosedDownwards(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		l := resendLog{on: true, seed: maphash.MakeSeed(), flushed: func() pglogrepl.LSN { return 0 }, limit: 1 << 16}
		var entries []resent
		for i := range 1 + rng.IntN(30) {
			e := resent{commit: pglogrepl.LSN(100 * (1 + rng.IntN(8))), pos: pglogrepl.LSN(1 + i),
				key: uint64(rng.IntN(4)), topic: []string{"t1", "t2"}[rng.IntN(2)], partition: int32(rng.IntN(3))}
			switch rng.IntN(6) {
			case 0:
				e.failed = true
			case 1:
				e.failed, e.partition = true, -1
			}
			entries = append(entries, e)
		}
		l.cur = append(l.cur, entries...)
		l.rewound()
		republished := func(e resent) bool { _, ok := l.skip[e.pos]; return !ok }
		for _, x := range entries {
			if _, ok := l.skip[x.pos]; !ok {
				continue
			}
			if x.failed {
				t.Fatalf("round %d: failed event %v skipped", round, x)
			}
			for _, y := range entries {
				if !y.before(&x) || !republished(y) {
					continue
				}
				same := y.key == x.key || y.topic == x.topic && (y.partition == x.partition || y.partition < 0)
				if same {
					t.Fatalf("round %d: %v skipped though %v before it goes again", round, x, y)
				}
			}
		}
	}
}

// The log is bounded: entries the watermark passed are dropped as it
// grows, and a session that acks more than the limit above its watermark
// skips nothing after its rewind. A position that turns out to hold
// another event drops every skip.
func TestResendLogBounded(t *testing.T) {
	var w pglogrepl.LSN
	l := resendLog{on: true, seed: maphash.MakeSeed(), flushed: func() pglogrepl.LSN { return w }, limit: 5000}
	d := &delivery{}
	msg := &sink.Message{Topic: "t", Key: []byte("k"), Ref: d}
	ack := func(commit pglogrepl.LSN) {
		d.txnLSN, d.pos, d.gen = commit, commit-1, l.gen
		l.acked([]*sink.Message{msg})
	}
	for i := range 100000 { // the watermark follows: the log stays small
		ack(pglogrepl.LSN(10 * (i + 1)))
		w = pglogrepl.LSN(10 * (i + 1))
	}
	if len(l.cur) > 2048 {
		t.Fatalf("%d entries kept with the watermark right behind the acks", len(l.cur))
	}
	base := w + 10
	for i := range 10000 { // stuck watermark: past the limit the session's log is lost
		ack(base + pglogrepl.LSN(10*i))
	}
	if !l.lost || len(l.cur) != 0 {
		t.Fatalf("lost = %v with %d entries above a stuck watermark, want the log lost", l.lost, len(l.cur))
	}
	l.rewound()
	if len(l.skip) != 0 || l.lost {
		t.Fatalf("%d skips after a lost session (lost still %v)", len(l.skip), l.lost)
	}
	// A fresh session: its acks are skips after the rewind.
	ack(base + 100000)
	l.rewound()
	if len(l.skip) != 1 || !l.skips(base+100000-1, base+100000, "t", []byte("k")) {
		t.Fatalf("skips %v, want the one event acked", l.skip)
	}
	if l.skips(base+100000-1, base+100000, "t", []byte("other key")) || l.anySkip.Load() != 0 || !l.lost {
		t.Fatal("a position holding another event did not drop every skip")
	}
	l.forget()
	if l.lost || len(l.cur) != 0 || l.anySkip.Load() != 0 {
		t.Fatal("forget left state behind")
	}
}

// After a Reset of the watermark to the slot's position the skips hold
// only if the session's history has the pipeline's own kept position
// (Session: apply or behind); without a Reset they hold as they are.
func TestResendLogAfterReset(t *testing.T) {
	for _, tc := range []struct {
		name             string
		reset, onHistory bool
		kept             bool
	}{
		{name: "no reset", reset: false, onHistory: false, kept: true},
		{name: "reset on the same history", reset: true, onHistory: true, kept: true},
		{name: "reset on another history", reset: true, onHistory: false, kept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := resendLog{on: true, seed: maphash.MakeSeed(), flushed: func() pglogrepl.LSN { return 0 }, limit: 1 << 16}
			l.cur = append(l.cur, resent{commit: 100, pos: 90, key: maphash.Bytes(l.seed, []byte("k")), topic: "t", partition: 1})
			l.rewound()
			l.reset = tc.reset
			l.resumed(tc.onHistory)
			if got := l.skips(90, 100, "t", []byte("k")); got != tc.kept {
				t.Errorf("skips = %v, want %v", got, tc.kept)
			}
			if l.reset {
				t.Error("reset still set after the session started")
			}
		})
	}
}
