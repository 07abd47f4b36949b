package testkit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
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
	IdentityViolations  int                     // an event under two event_ids, or one event_id on two events
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
	identity := make(map[int64]string, len(events)) // id -> the event_id of its first record
	owner := make(map[string]int64, len(events))    // event_id -> id
	type first struct {
		partition int32
		offset    int64
		seq       int
	}
	firsts := map[string][]first{}
	for _, r := range recs {
		id, ev, ok := writtenEvent(byID, r)
		if !ok {
			rep.problem("record %s/%d@%d: event_id %q (outbox_id %q) was not written by this test", r.Topic, r.Partition, r.Offset, r.Headers["event_id"], r.Headers["outbox_id"])
			continue
		}
		// Every copy of an event carries one identity, and no two events
		// share one: what consumers deduplicate on.
		eid := r.Headers["event_id"]
		if prev, ok := identity[id]; ok && prev != eid {
			rep.IdentityViolations++
			rep.problem("event %d (%s seq %d) delivered under event_id %q and again under %q at %s/%d@%d", id, ev.Agg, ev.Seq, prev, eid, r.Topic, r.Partition, r.Offset)
		} else if other, ok := owner[eid]; ok && other != id {
			rep.IdentityViolations++
			rep.problem("event_id %q names events %d and %d (%s/%d@%d)", eid, other, id, r.Topic, r.Partition, r.Offset)
		}
		identity[id], owner[eid] = eid, id
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
		id, ev, ok := writtenEvent(byID, r)
		if !ok || r.Topic == CheckpointTopic || seen[id] {
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
			id, _ := RecordID(r)
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

// RecordID is the writer's id of the event r carries (Event.ID): the
// outbox_id header of a row's record (the row id), else its event_id (a
// message event's envelope id, which WriteMixed takes from the outbox
// table's sequence).
func RecordID(r Record) (int64, error) {
	if s, ok := r.Headers["outbox_id"]; ok {
		return strconv.ParseInt(s, 10, 64)
	}
	return strconv.ParseInt(r.Headers["event_id"], 10, 64)
}

// writtenEvent finds the written event r carries, by RecordID; an event
// whose event_id the writer read back must have it too: a record with the
// same row id under another event_id is another history's event (a row id
// handed out again after a failover), not this one.
func writtenEvent(byID map[int64]Event, r Record) (int64, Event, bool) {
	id, err := RecordID(r)
	ev, ok := byID[id]
	if err != nil || !ok || ev.EventID != "" && ev.EventID != r.Headers["event_id"] {
		return id, Event{}, false
	}
	return id, ev, true
}

// uuidRE is a UUID's text as PostgreSQL writes it.
var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// IsUUID reports whether s is a UUID's text as PostgreSQL writes it: the
// event_id of a row written since migration 0006.
func IsUUID(s string) bool { return uuidRE.MatchString(s) }

// checkRecord compares the first delivery of ev with what was written.
func checkRecord(rep *Report, r Record, ev Event, prefix string) {
	// A row's event_id is its event_id column (a UUID), or its id for a
	// row older than migration 0006.
	if oid, ok := r.Headers["outbox_id"]; ok && !IsUUID(r.Headers["event_id"]) && r.Headers["event_id"] != oid {
		rep.problem("event_id=%d: header event_id %q is neither a UUID nor the row id", ev.ID, r.Headers["event_id"])
	}
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
