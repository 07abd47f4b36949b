package history

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestDecide(t *testing.T) {
	mark := Mark{SystemID: "7", Timeline: 1, Slot: "s", SlotLSN: 0x100, SlotXid: 50, Generation: 4}
	point := Point{Mark: mark, CommitLSN: 0x2000, EndLSN: 0x2040, Xid: 900, CommitTime: time.Unix(10, 0)}
	now := Now{Mark: mark, Raised: 4, Confirmed: 0x1000, ServerEnd: 0x9000}
	with := func(f func(p *Point, n *Now)) (Point, Now) {
		p, n := point, now
		f(&p, &n)
		return p, n
	}
	cases := []struct {
		name string
		edit func(p *Point, n *Now)
		want Verdict
	}{
		{"same history", func(*Point, *Now) {}, Apply},
		{"generation raised by another relay since", func(_ *Point, n *Now) { n.Raised = 9 }, Apply},
		{"unknown generation: the filter still verifies", func(_ *Point, n *Now) { n.Raised = 0 }, Apply},
		{"old record without history fields", func(p *Point, _ *Now) { p.Mark = Mark{SystemID: "7", Slot: "s"}; p.Xid = 0; p.CommitTime = time.Time{} }, Apply},
		{"another database", func(_ *Point, n *Now) { n.Mark.SystemID = "8" }, Refuse},
		{"another slot (a shared transactional id)", func(_ *Point, n *Now) { n.Mark.Slot = "t" }, Refuse},
		{"slot created again: other LSN", func(_ *Point, n *Now) { n.Mark.SlotLSN = 0x5000 }, Republish},
		{"slot created again: other xid", func(_ *Point, n *Now) { n.Mark.SlotXid = 51 }, Republish},
		{"failover: another timeline", func(_ *Point, n *Now) { n.Mark.Timeline = 2 }, Republish},
		{"restore: generation went back", func(_ *Point, n *Now) { n.Raised = 3 }, Republish},
		{"restore: WAL ends before the point", func(_ *Point, n *Now) { n.ServerEnd = 0x2000 }, Republish},
		{"slot confirmed at the point", func(_ *Point, n *Now) { n.Confirmed = 0x2040 }, Behind},
		{"slot confirmed past the point", func(_ *Point, n *Now) { n.Confirmed = 0x3000; n.ServerEnd = 0x1000 }, Behind},
		{"no end LSN", func(p *Point, _ *Now) { p.EndLSN = 0 }, Republish},
		{"restored and recreated: the slot answers first", func(p *Point, n *Now) { n.Raised = 1; n.Mark.SlotXid = 70 }, Republish},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, n := with(c.edit)
			d := Decide(p, n)
			if d.Verdict != c.want {
				t.Fatalf("Decide = %s (%s), want %s", d.Verdict, d.Reason, c.want)
			}
			if d.Reason == "" {
				t.Fatal("no reason")
			}
		})
	}
}

func TestFilter(t *testing.T) {
	at := time.Unix(10, 500)
	point := Point{CommitLSN: 0x2000, EndLSN: 0x2040, Xid: 900, CommitTime: at}
	txn := func(commit, end pglogrepl.LSN, xid uint32, ts time.Time) Txn {
		return Txn{CommitLSN: commit, EndLSN: end, Xid: xid, CommitTime: ts}
	}
	cases := []struct {
		name  string
		point Point
		txns  []Txn
		want  []Step
	}{
		{"skips, then verifies, then passes", point,
			[]Txn{txn(0x1000, 0x1040, 800, at), txn(0x2000, 0x2040, 900, at), txn(0x3000, 0x3040, 901, at)},
			[]Step{Skip, Verified, Pass}},
		{"the stream passes the point without it", point,
			[]Txn{txn(0x1000, 0x1040, 800, at), txn(0x2100, 0x2140, 900, at), txn(0x3000, 0x3040, 901, at)},
			[]Step{Skip, Mismatch, Pass}},
		{"another transaction at the commit LSN: xid", point,
			[]Txn{txn(0x2000, 0x2040, 901, at)}, []Step{Mismatch}},
		{"another transaction at the commit LSN: commit time", point,
			[]Txn{txn(0x2000, 0x2040, 900, at.Add(time.Microsecond))}, []Step{Mismatch}},
		{"another transaction at the commit LSN: end LSN", point,
			[]Txn{txn(0x2000, 0x2048, 900, at)}, []Step{Mismatch}},
		{"an old checkpoint compares LSNs only", Point{CommitLSN: 0x2000, EndLSN: 0x2040},
			[]Txn{txn(0x2000, 0x2040, 5, at)}, []Step{Verified}},
		{"chunks of the point's transaction skip until its last", point,
			[]Txn{{CommitLSN: 0x2000, Xid: 900, Partial: true}, {CommitLSN: 0x2000, Xid: 900, Partial: true}, txn(0x2000, 0x2040, 900, at)},
			[]Step{Skip, Skip, Verified}},
		{"a chunk of another transaction at the commit LSN", point,
			[]Txn{{CommitLSN: 0x2000, Xid: 7, Partial: true}}, []Step{Mismatch}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f Filter
			f.Set(c.point)
			for i, tx := range c.txns {
				if got := f.Check(tx); got != c.want[i] {
					t.Fatalf("txn %d: Check = %s, want %s", i, got, c.want[i])
				}
			}
			if f.Active() {
				t.Fatal("still active after the point")
			}
		})
	}
	var zero Filter
	if zero.Check(txn(1, 2, 3, at)) != Pass {
		t.Fatal("the zero Filter must pass")
	}
}
