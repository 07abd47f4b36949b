package exactlyonce

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// step is one call on the batcher: a PostgreSQL transaction (or chunk)
// before/after, a tick, or a commit the caller made.
type step struct {
	op      string // "txn" (before, published, after unless partial), "chunk" (before only), "tick", "commit"
	lsn     pglogrepl.LSN
	n       int
	b       int64
	partial bool
	at      time.Duration // since the start, for opening and tick
	// want
	commitFirst bool   // before: commit the open Kafka transaction first
	commitNow   bool   // after: the Kafka transaction is full
	due         bool   // tick
	err         string // before: refused, naming this
}

func TestBatcher(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name  string
		steps []step
	}{
		{"whole transactions share a Kafka transaction up to max events", []step{
			{op: "txn", lsn: 10, n: 2, b: 20},
			{op: "txn", lsn: 20, n: 3, b: 30},
			{op: "txn", lsn: 30, n: 5, b: 50, commitNow: true}, // 10 == max: full
			{op: "commit"},
			{op: "txn", lsn: 40, n: 1, b: 10},
		}},
		{"the next transaction would pass max events: commit first, never split", []step{
			{op: "txn", lsn: 10, n: 6, b: 60},
			{op: "txn", lsn: 20, n: 6, b: 60, commitFirst: true},
		}},
		{"a transaction larger than max events is a Kafka transaction of its own", []step{
			{op: "txn", lsn: 10, n: 2, b: 20},
			{op: "txn", lsn: 20, n: 50, b: 500, commitFirst: true, commitNow: true},
			{op: "commit"},
			{op: "txn", lsn: 30, n: 1, b: 10},
		}},
		{"a chunked transaction starts its own Kafka transaction and is never cut by the interval", []step{
			{op: "txn", lsn: 10, n: 2, b: 20},
			{op: "chunk", lsn: 20, n: 40, b: 400, partial: true, commitFirst: true},
			{op: "commit"},
			{op: "tick", at: time.Second, due: false}, // inside the chunked transaction
			{op: "chunk", lsn: 20, n: 40, b: 400, partial: true},
			{op: "txn", lsn: 20, n: 10, b: 100, commitNow: true}, // last chunk: 90 events >= 10
		}},
		{"a chunked transaction past inflight.max_events is refused with the keys to raise", []step{
			{op: "chunk", lsn: 20, n: 60, b: 10, partial: true},
			{op: "chunk", lsn: 20, n: 60, b: 10, partial: true, err: "0/14"},
		}},
		{"a transaction past inflight.max_bytes is refused", []step{
			{op: "chunk", lsn: 30, n: 1, b: 5000, err: "inflight.max_bytes"},
		}},
		{"the batch bytes would pass inflight.max_bytes: commit first", []step{
			{op: "txn", lsn: 10, n: 1, b: 600},
			{op: "txn", lsn: 20, n: 1, b: 600, commitFirst: true},
		}},
		{"the interval closes a Kafka transaction between PostgreSQL transactions only", []step{
			{op: "txn", lsn: 10, n: 1, b: 10},
			{op: "tick", at: 50 * time.Millisecond, due: false},
			{op: "tick", at: 100 * time.Millisecond, due: true},
		}},
		{"nothing open: nothing due", []step{
			{op: "tick", at: time.Hour, due: false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bt := &batcher{maxEvents: 10, inflightEvents: 100, inflightBytes: 1000, interval: 100 * time.Millisecond}
			for i, s := range tc.steps {
				switch s.op {
				case "txn", "chunk":
					first, err := bt.before(s.lsn, s.n, s.b, s.partial)
					if s.err != "" {
						if err == nil || !strings.Contains(err.Error(), s.err) || !strings.Contains(err.Error(), "inflight.max_events") {
							t.Fatalf("step %d: err %v, want one naming %q and the keys to raise", i, err, s.err)
						}
						return
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if first != s.commitFirst {
						t.Fatalf("step %d: commitFirst %v, want %v", i, first, s.commitFirst)
					}
					if first {
						bt.closed(false)
					}
					bt.added(s.n, s.b)
					bt.opening(t0.Add(s.at))
					if s.op == "txn" {
						if now := bt.after(s.lsn, s.lsn+1); now != s.commitNow {
							t.Fatalf("step %d: commitNow %v, want %v", i, now, s.commitNow)
						}
						if bt.commitLSN != s.lsn || bt.endLSN != s.lsn+1 {
							t.Fatalf("step %d: checkpoint %s/%s, want %s/%s", i, bt.commitLSN, bt.endLSN, s.lsn, s.lsn+1)
						}
					}
				case "tick":
					if got := bt.due(t0.Add(s.at)); got != s.due {
						t.Fatalf("step %d: due %v, want %v", i, got, s.due)
					}
				case "commit":
					bt.closed(false)
				}
			}
		})
	}
}

// An abort forgets a PostgreSQL transaction in progress: it is sent again
// after the rewind and starts a new Kafka transaction.
func TestBatcherAbortForgetsPartialTransaction(t *testing.T) {
	bt := &batcher{maxEvents: 10, inflightEvents: 100, inflightBytes: 1000, interval: time.Millisecond}
	if _, err := bt.before(10, 60, 10, true); err != nil {
		t.Fatal(err)
	}
	bt.added(60, 10)
	bt.opening(time.Now())
	bt.closed(true)
	if bt.inPG || bt.open || bt.events != 0 || bt.endLSN != 0 {
		t.Fatalf("after abort: %+v", bt)
	}
	// The same transaction again, whole: not refused for the 60 before.
	if _, err := bt.before(10, 60, 10, true); err != nil {
		t.Fatal(err)
	}
	if _, err := bt.before(10, 30, 10, false); err != nil {
		t.Fatal(err)
	}
}
