package main

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// The forwarder confirms the slot only up to the end of the last transaction
// whose events are all acked, in commit order: an ack of a later
// transaction does not move it past an earlier one still pending, and a
// transaction still being decoded (no Commit yet) holds it too.
func TestForwarderWatermark(t *testing.T) {
	a := &fwdAcks{}
	txA, txB, txC := &fwdTxn{end: 100, pending: 2, committed: true}, &fwdTxn{end: 200, pending: 1, committed: true}, &fwdTxn{pending: 1}
	a.txns = []*fwdTxn{txA, txB, txC}
	steps := []struct {
		name string
		do   func()
		want pglogrepl.LSN
	}{
		{"nothing acked", func() {}, 0},
		{"later transaction acked first", func() { txB.pending-- }, 0},
		{"first of two events of the first", func() { txA.pending-- }, 0},
		{"second of the first: both committed transactions done", func() { txA.pending-- }, 200},
		{"event of a transaction not committed yet", func() { txC.pending-- }, 200},
		{"its commit", func() { txC.end, txC.committed = 300, true }, 300},
	}
	for _, s := range steps {
		a.mu.Lock()
		s.do()
		a.advance()
		a.mu.Unlock()
		if got := pglogrepl.LSN(a.confirmed.Load()); got != s.want {
			t.Fatalf("%s: confirmed %s, want %s", s.name, got, s.want)
		}
	}
	if len(a.txns) != 0 {
		t.Fatalf("%d transactions left in the queue, want 0", len(a.txns))
	}
}

func TestPayloadSeq(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{`{"order_id": "agg-1", "seq": 1234, "x": 1}`, 1234, true}, // jsonb's spacing
		{`{"seq":7}`, 7, true},
		{`{"seq": "x"}`, 0, false},
		{`{"order_id": "agg-1"}`, 0, false},
	} {
		got, ok := payloadSeq([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("payloadSeq(%s) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// The extra 1-row phase at 1k events/s is reported but never stands in for
// the mix phase of the same rate (targets, figure, exactly-once table).
func TestOneRowPhaseNotTheTargetPhase(t *testing.T) {
	oneRow := &latPhase{Rate: 1000, Shapes: []int{1}, OneRow: true}
	mix := &latPhase{Rate: 1000, Shapes: []int{1, 10}}
	l := &latencyRun{Phases: []*latPhase{oneRow, mix}}
	if got := phaseOf(l, 1000); got != mix {
		t.Fatalf("phaseOf(1000) = %+v, want the mix phase", got)
	}
	if oneRow.label() != "1000 (1-row)" || mix.label() != "1000" {
		t.Fatalf("labels %q, %q", oneRow.label(), mix.label())
	}
}
