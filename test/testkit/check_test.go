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
