package testkit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// Report is what a delivery check found; tests assert on it.
type Report struct {
	Written             int                     // events committed
	Delivered           int                     // distinct events read
	Records             int                     // records read
	Lost                int                     // committed, never read
	Duplicates          int                     // records beyond an event's first
	OrderViolations     int                     // per aggregate, a seq read after a later one
	PartitionViolations int                     // not in the partition murmur2(key) picks, or an aggregate over several
	DuplicateIDs        []int64                 // event id of each duplicate record
	Extra               map[int64]int           // event id -> copies beyond the first
	CommitLSN           map[int64]pglogrepl.LSN // pg_lsn header of each duplicated event
	Problems            []string                // the first 20 findings, readable
}

func (r *Report) problem(format string, a ...any) {
	if len(r.Problems) < 20 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, a...))
	}
}

// Check compares what a consumer read with what a Writer committed: every
// event at least once (distinct event_id), in topic prefix+"."+type, keyed by
// its aggregate, with the payload and every header the relay promises; the
// first delivery of each aggregate's events in commit order, within the one
// partition murmur2(key) picks of partitions[topic] (a topic missing from
// partitions is a violation).
func Check(events []Event, recs []Record, partitions map[string]int, prefix string) Report {
	rep := Report{Written: len(events), Records: len(recs), Extra: map[int64]int{}, CommitLSN: map[int64]pglogrepl.LSN{}}
	byID := make(map[int64]Event, len(events))
	for _, ev := range events {
		byID[ev.ID] = ev
	}
	seen := make(map[int64]int, len(events))
	type first struct {
		partition int32
		offset    int64
		seq       int
	}
	firsts := map[string][]first{}
	for _, r := range recs {
		id, err := strconv.ParseInt(r.Headers["event_id"], 10, 64)
		ev, ok := byID[id]
		if err != nil || !ok {
			rep.problem("record %s/%d@%d: event_id %q was not written by this test", r.Topic, r.Partition, r.Offset, r.Headers["event_id"])
			continue
		}
		if seen[id]++; seen[id] > 1 {
			rep.Duplicates++
			rep.DuplicateIDs = append(rep.DuplicateIDs, id)
			rep.Extra[id]++
			rep.CommitLSN[id], _ = pglogrepl.ParseLSN(r.Headers["pg_lsn"])
			continue
		}
		checkRecord(&rep, r, ev, prefix)
		if p := Partition([]byte(r.Key), partitions[r.Topic]); p != r.Partition {
			rep.PartitionViolations++
			rep.problem("event_id=%d key %q in partition %d; murmur2 picks %d of %d", id, r.Key, r.Partition, p, partitions[r.Topic])
		}
		firsts[ev.Agg] = append(firsts[ev.Agg], first{r.Partition, r.Offset, ev.Seq})
	}
	rep.Delivered = len(seen)
	for _, ev := range events {
		if seen[ev.ID] == 0 {
			rep.Lost++
			rep.problem("event_id=%d (%s seq %d, written #%d) never arrived", ev.ID, ev.Agg, ev.Seq, ev.Written)
		}
	}
	for agg, fs := range firsts {
		// One partition consumer delivers in offset order, but be exact.
		slices.SortFunc(fs, func(a, b first) int { return cmp.Compare(a.offset, b.offset) })
		for i := 1; i < len(fs); i++ {
			if fs[i].partition != fs[0].partition {
				rep.PartitionViolations++
				rep.problem("aggregate %s in partitions %d and %d", agg, fs[0].partition, fs[i].partition)
			} else if fs[i].seq < fs[i-1].seq {
				rep.OrderViolations++
				rep.problem("aggregate %s: seq %d delivered after seq %d", agg, fs[i].seq, fs[i-1].seq)
			}
		}
	}
	return rep
}

// checkRecord compares the first delivery of ev with what was written.
func checkRecord(rep *Report, r Record, ev Event, prefix string) {
	var body struct {
		Aggregate string `json:"aggregate"`
		Seq       int    `json:"seq"`
	}
	if err := json.Unmarshal(r.Value, &body); err != nil || body.Aggregate != ev.Agg || body.Seq != ev.Seq {
		rep.problem("event_id=%d: payload %s does not match the row (aggregate %s seq %d)", ev.ID, r.Value, ev.Agg, ev.Seq)
	}
	if want := prefix + "." + ev.Type; r.Topic != want {
		rep.problem("event_id=%d in topic %s, want %s", ev.ID, r.Topic, want)
	}
	if r.Key != ev.Agg {
		rep.problem("event_id=%d: key %q, want aggregate_id %q", ev.ID, r.Key, ev.Agg)
	}
	want := map[string]string{
		"event_type": ev.Type + ".updated", "aggregate_type": ev.Type, "aggregate_id": ev.Agg,
		"trace_id": fmt.Sprintf("trace-%s-%d", ev.Agg, ev.Seq), "tenant_id": TenantID, "schema_version": "2",
		"traceparent": Traceparent,
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if r.Headers[k] != want[k] {
			rep.problem("event_id=%d: header %s = %q, want %q", ev.ID, k, r.Headers[k], want[k])
		}
	}
	if _, err := pglogrepl.ParseLSN(r.Headers["pg_lsn"]); err != nil {
		rep.problem("event_id=%d: header pg_lsn %q is not an LSN", ev.ID, r.Headers["pg_lsn"])
	}
}
