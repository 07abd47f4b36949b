package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rec is the record the relay would publish for ev, in partition p.
func rec(ev Event, p int32, off int64) Record {
	return Record{Topic: "t." + ev.Type, Partition: p, Offset: off, Key: ev.Agg,
		Value: []byte(fmt.Sprintf(`{"aggregate":%q,"seq":%d}`, ev.Agg, ev.Seq)),
		Headers: map[string]string{"event_id": fmt.Sprint(ev.ID), "event_type": ev.Type + ".updated", "aggregate_type": ev.Type,
			"aggregate_id": ev.Agg, "trace_id": fmt.Sprintf("trace-%s-%d", ev.Agg, ev.Seq), "tenant_id": TenantID,
			"schema_version": "2", "traceparent": Traceparent, "pg_lsn": "0/16B3748"}}
}

func TestCheck(t *testing.T) {
	a1 := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1}
	a2 := Event{ID: 2, Type: "order", Agg: "order-1", Seq: 2}
	parts := map[string]int{"t.order": 4}
	p := Partition([]byte("order-1"), 4)
	wrongP := (p + 1) % 4
	for _, c := range []struct {
		name                               string
		parts                              map[string]int
		recs                               []Record
		lost, dups, order, partition, prob int
	}{
		{"clean", parts, []Record{rec(a1, p, 0), rec(a2, p, 1)}, 0, 0, 0, 0, 0},
		{"lost", parts, []Record{rec(a1, p, 0)}, 1, 0, 0, 0, 1},
		{"duplicate", parts, []Record{rec(a1, p, 0), rec(a2, p, 1), rec(a1, p, 2)}, 0, 1, 0, 0, 0},
		{"out of order", parts, []Record{rec(a2, p, 0), rec(a1, p, 1)}, 0, 0, 1, 0, 1},
		{"wrong partition", parts, []Record{rec(a1, wrongP, 0), rec(a2, wrongP, 1)}, 0, 0, 0, 2, 2},
		{"unknown partition count", nil, []Record{rec(a1, p, 0), rec(a2, p, 1)}, 0, 0, 0, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := Check([]Event{a1, a2}, c.recs, c.parts, "t")
			if rep.Lost != c.lost || rep.Duplicates != c.dups || rep.OrderViolations != c.order ||
				rep.PartitionViolations != c.partition || len(rep.Problems) < c.prob || (c.prob == 0 && len(rep.Problems) > 0) {
				t.Fatalf("got %+v", rep)
			}
		})
	}
}

func TestCheckHeaderMismatch(t *testing.T) {
	ev := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1}
	r := rec(ev, Partition([]byte("order-1"), 4), 0)
	r.Headers["traceparent"] = "00-wrong"
	rep := Check([]Event{ev}, []Record{r}, map[string]int{"t.order": 4}, "t")
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "traceparent") {
		t.Fatalf("problems %q, want one about traceparent", rep.Problems)
	}
}

// Records of rows carry the row id in outbox_id and the identity in
// event_id: a copy under another event_id, two events under one, or an
// event_id that is neither a UUID nor the row id are found.
func TestCheckIdentity(t *testing.T) {
	a1 := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1}
	a2 := Event{ID: 2, Type: "order", Agg: "order-1", Seq: 2}
	p := Partition([]byte("order-1"), 4)
	row := func(ev Event, off int64, eventID string) Record {
		r := rec(ev, p, off)
		r.Headers["outbox_id"], r.Headers["event_id"] = fmt.Sprint(ev.ID), eventID
		return r
	}
	const u1, u2 = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a21", "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a22"
	for _, c := range []struct {
		name       string
		recs       []Record
		violations int
		problems   int
	}{
		{"uuids, a redelivery under the same one", []Record{row(a1, 0, u1), row(a2, 1, u2), row(a1, 2, u1)}, 0, 0},
		{"a row older than the migration: its id", []Record{row(a1, 0, "1"), row(a2, 1, u2)}, 0, 0},
		{"a redelivery under a new event_id", []Record{row(a1, 0, u1), row(a2, 1, u2), row(a1, 2, u2)}, 1, 1},
		{"two events under one event_id", []Record{row(a1, 0, u1), row(a2, 1, u1)}, 1, 1},
		{"an event_id that is another row's id", []Record{row(a1, 0, "2"), row(a2, 1, u2)}, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := Check([]Event{a1, a2}, c.recs, map[string]int{"t.order": 4}, "t")
			if rep.IdentityViolations != c.violations || len(rep.Problems) != c.problems || rep.Lost != 0 {
				t.Fatalf("got %+v", rep)
			}
		})
	}
}

// After a failover the new history hands out a row id again: a record of
// the lost history's event under that id is not the written event, whose
// event_id the writer read back.
func TestCheckReusedRowID(t *testing.T) {
	const mine, lost = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a21", "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1aff"
	ev := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1, EventID: mine}
	p := Partition([]byte("order-1"), 4)
	r1, r2 := rec(ev, p, 0), rec(ev, p, 1)
	r1.Headers["outbox_id"], r1.Headers["event_id"] = "1", lost
	r2.Headers["outbox_id"], r2.Headers["event_id"] = "1", mine
	rep := Check([]Event{ev}, []Record{r1, r2}, map[string]int{"t.order": 4}, "t")
	if rep.Delivered != 1 || rep.Duplicates != 0 || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "not written by this test") {
		t.Fatalf("got %+v", rep)
	}
	if ev.Identity() != mine || (Event{ID: 7}).Identity() != "7" {
		t.Errorf("Identity: %q, %q", ev.Identity(), (Event{ID: 7}).Identity())
	}
}

func TestReadServicesRequire(t *testing.T) {
	for _, c := range []struct {
		name, file string
		ok         bool
	}{
		{"complete", "# comment\nOUTBOX_TEST_PG_URL=postgres://x@h:1/db?a=b\nOUTBOX_TEST_KAFKA_BROKERS=h:2,h:3\nOUTBOX_TEST_SERVICES=/s.sh\n", true},
		{"no brokers", "OUTBOX_TEST_PG_URL=postgres://x\nOUTBOX_TEST_SERVICES=/s.sh\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "env")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := ReadServices(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Require(); (err == nil) != c.ok {
				t.Fatalf("Require: %v, want ok=%v", err, c.ok)
			}
			if c.ok && (s.PGURL != "postgres://x@h:1/db?a=b" || len(s.Brokers) != 2) {
				t.Fatalf("parsed %+v", s)
			}
		})
	}
	if _, err := ReadServices(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing env file must be an error")
	}
}

// TestCheckExactlyOnce: each way exactly-once delivery can fail is detected
// (counted, and a problem in ExactlyOnce mode); checkpoint records are never
// events.
func TestCheckExactlyOnce(t *testing.T) {
	// One partition: commit order across aggregates is visible in offsets.
	parts := map[string]int{"t.order": 1}
	// Transaction 1: order-1 seq 1 and order-2 seq 1; transaction 2: order-1 seq 2.
	x1 := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1, Txn: 1}
	y1 := Event{ID: 2, Type: "order", Agg: "order-2", Seq: 1, Txn: 1}
	x2 := Event{ID: 3, Type: "order", Agg: "order-1", Seq: 2, Txn: 2}
	// Transaction 3: order-3 seq 1, alone.
	z1 := Event{ID: 4, Type: "order", Agg: "order-3", Seq: 1, Txn: 3}
	events := []Event{x1, y1, x2, z1}
	ckpt := Record{Topic: CheckpointTopic, Key: "outbox-relay-slot", Value: []byte(`{"slot":"slot","commit_lsn":"0/16B3748"}`)}
	own := Record{Topic: "t.checkpoints", Key: "outbox-relay-slot", Value: []byte(`{}`)}
	for _, c := range []struct {
		name                       string
		recs                       []Record
		skip                       []string
		lost, dups, partial, ckpts int
		problem                    string // in ExactlyOnce mode; "" = none
	}{
		{"clean", []Record{rec(x1, 0, 0), rec(y1, 0, 1), rec(x2, 0, 2), rec(z1, 0, 3)}, nil, 0, 0, 0, 0, ""},
		{"checkpoint records are not events", []Record{rec(x1, 0, 0), rec(y1, 0, 1), ckpt, rec(x2, 0, 2), ckpt, rec(z1, 0, 3), ckpt},
			nil, 0, 0, 0, 3, ""},
		{"checkpoint topic configured elsewhere", []Record{rec(x1, 0, 0), rec(y1, 0, 1), rec(x2, 0, 2), rec(z1, 0, 3), own},
			[]string{"t.checkpoints"}, 0, 0, 0, 1, ""},
		{"an unknown checkpoint topic is not skipped", []Record{rec(x1, 0, 0), rec(y1, 0, 1), rec(x2, 0, 2), rec(z1, 0, 3), own},
			nil, 0, 0, 0, 0, "was not written by this test"},
		{"duplicate", []Record{rec(x1, 0, 0), rec(y1, 0, 1), rec(x2, 0, 2), rec(z1, 0, 3), rec(z1, 0, 4)}, nil, 0, 1, 0, 0,
			"exactly-once allows one copy"},
		{"whole transaction resent", []Record{rec(x1, 0, 0), rec(y1, 0, 1), rec(x1, 0, 2), rec(y1, 0, 3), rec(x2, 0, 4), rec(z1, 0, 5)},
			nil, 0, 2, 0, 0, "exactly-once allows one copy"},
		{"transaction seen in part", []Record{rec(x1, 0, 0), rec(x2, 0, 1), rec(z1, 0, 2)}, nil, 1, 0, 1, 0,
			"transaction 1 visible in part: 1 of its 2 events"},
		{"transactions interleaved", []Record{rec(x1, 0, 0), rec(z1, 0, 1), rec(y1, 0, 2), rec(x2, 0, 3)}, nil, 0, 0, 2, 0,
			"transaction 1 out of commit order: event_id=2"},
		{"later transaction first", []Record{rec(z1, 0, 0), rec(x1, 0, 1), rec(y1, 0, 2), rec(x2, 0, 3)}, nil, 0, 0, 2, 0,
			"out of commit order"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, eos := range []bool{false, true} {
				rep := CheckWith(CheckOptions{ExactlyOnce: eos, SkipTopics: c.skip}, events, c.recs, parts, "t")
				if rep.Lost != c.lost || rep.Duplicates != c.dups || rep.PartialTxns != c.partial || rep.Checkpoints != c.ckpts ||
					rep.OrderViolations != 0 || rep.PartitionViolations != 0 {
					t.Fatalf("exactly-once %v: lost %d dups %d partial %d checkpoints %d order %d partition %d, want %d %d %d %d 0 0; problems %q",
						eos, rep.Lost, rep.Duplicates, rep.PartialTxns, rep.Checkpoints, rep.OrderViolations, rep.PartitionViolations,
						c.lost, c.dups, c.partial, c.ckpts, rep.Problems)
				}
				found := false
				for _, p := range rep.Problems {
					found = found || (c.problem != "" && strings.Contains(p, c.problem))
				}
				switch {
				case eos && c.problem != "" && !found:
					t.Fatalf("exactly-once: problems %q, want one containing %q", rep.Problems, c.problem)
				case c.problem == "" && len(rep.Problems) > 0:
					t.Fatalf("exactly-once %v: problems %q, want none", eos, rep.Problems)
				case !eos && c.lost == 0 && !strings.Contains(c.problem, "not written") && len(rep.Problems) > 0:
					t.Fatalf("at-least-once: problems %q: duplicates and partial transactions are only counted", rep.Problems)
				}
			}
		})
	}
}

// TestPartialTxnsReadPoint: a read point taken while the writer goes on
// (events not in the list, transactions not read at all) finds only
// transactions seen in part.
func TestPartialTxnsReadPoint(t *testing.T) {
	a := Event{ID: 1, Type: "order", Agg: "order-1", Seq: 1, Txn: 1}
	b := Event{ID: 2, Type: "order", Agg: "order-2", Seq: 1, Txn: 1}
	c := Event{ID: 3, Type: "order", Agg: "order-1", Seq: 2, Txn: 2}
	later := Event{ID: 9, Type: "order", Agg: "order-9", Seq: 1, Txn: 9}
	noTxn := Event{ID: 5, Type: "order", Agg: "order-5", Seq: 1}
	noTxn2 := Event{ID: 6, Type: "order", Agg: "order-5", Seq: 2}
	events := []Event{a, b, c, noTxn, noTxn2}
	for _, tc := range []struct {
		name    string
		recs    []Record
		partial int
	}{
		{"nothing read yet", nil, 0},
		{"first transaction whole, second not yet", []Record{rec(a, 0, 0), rec(b, 1, 0)}, 0},
		{"first transaction in part", []Record{rec(a, 0, 0)}, 1},
		{"event of a transaction not yet in the list", []Record{rec(a, 0, 0), rec(b, 1, 0), rec(later, 0, 1)}, 0},
		{"events without a transaction number", []Record{rec(noTxn, 0, 0)}, 0},
		{"duplicate of an earlier transaction after a later one", []Record{rec(a, 0, 0), rec(b, 1, 0), rec(c, 0, 1), rec(a, 0, 2)}, 0},
		{"across partitions, commit order per partition", []Record{rec(c, 0, 0), rec(b, 1, 0), rec(a, 1, 1)}, 0},
		{"checkpoint records", []Record{{Topic: CheckpointTopic, Headers: map[string]string{"event_id": "1"}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n, probs := PartialTxns(events, tc.recs); n != tc.partial || len(probs) != n {
				t.Fatalf("PartialTxns = %d %q, want %d", n, probs, tc.partial)
			}
		})
	}
}
