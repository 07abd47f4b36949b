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
	PartialTxns         int                     // writer transactions seen in part, or out of commit order (PartialTxns)
	Checkpoints         int                     // records of the checkpoint topic, skipped: not events
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

// CheckpointTopic is the relay's default exactly-once checkpoint topic
// (exactly_once.checkpoint_topic). Its records are the relay's own
// bookkeeping, never events: every check skips them.
const CheckpointTopic = "outbox-relay.checkpoints"

// CheckOptions select the stricter checks of exactly-once delivery.
type CheckOptions struct {
	// ExactlyOnce: every duplicate and every partial PostgreSQL
	// transaction (PartialTxns) is a problem, not only counted.
	ExactlyOnce bool
	// SkipTopics are more topics whose records are not events (besides
	// CheckpointTopic), e.g. a checkpoint topic configured under the prefix.
	SkipTopics []string
}

// Check compares what a consumer read with what a Writer committed: every
// event at least once (distinct event_id), in topic prefix+"."+type, keyed by
// its aggregate, with the payload and every header the relay promises; the
// first delivery of each aggregate's events in commit order, within the one
// partition murmur2(key) picks of partitions[topic] (a topic missing from
// partitions is a violation). Duplicates and partial transactions are
// counted; CheckWith with ExactlyOnce makes them problems.
func Check(events []Event, recs []Record, partitions map[string]int, prefix string) Report {
	return CheckWith(CheckOptions{}, events, recs, partitions, prefix)
}

// CheckWith is Check with options. Records of CheckpointTopic and of
// opt.SkipTopics are counted in Checkpoints and otherwise ignored.
func CheckWith(opt CheckOptions, events []Event, recs []Record, partitions map[string]int, prefix string) Report {
	rep := Report{Written: len(events), Extra: map[int64]int{}, CommitLSN: map[int64]pglogrepl.LSN{}}
	recs = skipCheckpoints(&rep, recs, opt.SkipTopics)
	rep.Records = len(recs)
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
			if opt.ExactlyOnce {
				rep.problem("event_id=%d (%s seq %d) delivered again at %s/%d@%d: exactly-once allows one copy", id, ev.Agg, ev.Seq, r.Topic, r.Partition, r.Offset)
			}
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
	var partial []string
	rep.PartialTxns, partial = PartialTxns(events, recs)
	if opt.ExactlyOnce {
		for _, p := range partial {
			rep.problem("%s", p)
		}
	}
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

func skipCheckpoints(rep *Report, recs []Record, more []string) []Record {
	out := recs[:0:0]
	for _, r := range recs {
		if r.Topic == CheckpointTopic || slices.Contains(more, r.Topic) {
			rep.Checkpoints++
			continue
		}
		out = append(out, r)
	}
	return out
}

// PartialTxns finds the writer transactions (Event.Txn) that recs, read
// at one read point, show in part: some but not all of the transaction's
// events were read; or whose events interleave out of commit order: in a
// partition, by offset, the first delivery of an event of transaction T
// comes after one of a later transaction. It returns how many transactions
// are affected (each counted once) and a description of the first 20.
// Events without a transaction number (Txn 0) are not looked at.
// Duplicates (an event's later copies) are not looked at: Check counts
// them. Records of events not in events, and of the checkpoint topic,
// are ignored, so recs may be read while the writer goes on.
func PartialTxns(events []Event, recs []Record) (int, []string) {
	size := map[int64]int{}
	byID := make(map[int64]Event, len(events))
	for _, ev := range events {
		if ev.Txn != 0 { // 0: not written by a Writer, transaction unknown
			byID[ev.ID] = ev
			size[ev.Txn]++
		}
	}
	type pos struct {
		topic     string
		partition int32
	}
	firsts := map[pos][]Record{}
	seen := map[int64]bool{}
	got := map[int64]int{} // txn -> distinct events read
	for _, r := range recs {
		id, err := strconv.ParseInt(r.Headers["event_id"], 10, 64)
		ev, ok := byID[id]
		if err != nil || !ok || r.Topic == CheckpointTopic || seen[id] {
			continue
		}
		seen[id] = true
		got[ev.Txn]++
		firsts[pos{r.Topic, r.Partition}] = append(firsts[pos{r.Topic, r.Partition}], r)
	}
	bad := map[int64]string{}
	for _, txn := range slices.Sorted(maps.Keys(got)) {
		if got[txn] < size[txn] {
			bad[txn] = fmt.Sprintf("PostgreSQL transaction %d visible in part: %d of its %d events read", txn, got[txn], size[txn])
		}
	}
	ps := slices.SortedFunc(maps.Keys(firsts), func(a, b pos) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	for _, p := range ps {
		rs := firsts[p]
		slices.SortFunc(rs, func(a, b Record) int { return cmp.Compare(a.Offset, b.Offset) })
		var maxTxn int64
		var maxAt int64
		for _, r := range rs {
			id, _ := strconv.ParseInt(r.Headers["event_id"], 10, 64)
			txn := byID[id].Txn
			if txn < maxTxn {
				if _, dup := bad[txn]; !dup {
					bad[txn] = fmt.Sprintf("PostgreSQL transaction %d out of commit order: event_id=%d at %s/%d@%d after transaction %d at offset %d",
						txn, id, p.topic, p.partition, r.Offset, maxTxn, maxAt)
				}
			} else if txn > maxTxn {
				maxTxn, maxAt = txn, r.Offset
			}
		}
	}
	var out []string
	for _, txn := range slices.Sorted(maps.Keys(bad)) {
		if len(out) == 20 {
			break
		}
		out = append(out, bad[txn])
	}
	return len(bad), out
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
