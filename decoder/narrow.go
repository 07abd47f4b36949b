package decoder

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// ErrColumnNotStreamed is wrapped by the Decode error for a Relation
// message of an outbox table that lacks an optional column the relay reads
// (headers, event_id, dlq_replay_of) which the table has: the publication streams the table without it (a column list,
// or a column made generated), so every event of the table would be
// published with the column read as NULL (headers stripped, event_id
// replaced by the row id). The stream cannot continue: the pipeline
// returns the error and the relay stops before publishing any such event.
var ErrColumnNotStreamed = errors.New("outbox column not streamed")

// expectation is what Expect set for one outbox table.
type expectation struct {
	cols []string
	from pglogrepl.LSN
}

// SetPublication names the publication the stream reads, for the errors
// that say how to fix it. Call before the first Decode, from the goroutine
// that calls Decode; does not block.
func (d *Decoder) SetPublication(name string) { d.publication = name }

// Expect tells the decoder that the outbox table of index table (in
// NewMapped's maps) had the columns cols when its publication was checked,
// with the server's WAL at from: a Relation message of the table at or
// after from that lacks one of them, among the optional columns the relay
// reads (headers, event_id, dlq_replay_of: read as NULL when absent), is
// refused (ErrColumnNotStreamed). A required column's absence makes each
// row a bad row instead (RowError). Earlier ones are not judged by it (the
// table may have gained the column since, as a migration adds event_id),
// only against the table's previous Relation message: a Relation that
// loses such a column is refused too. Call from the goroutine
// that calls Decode; does not block.
func (d *Decoder) Expect(table int, cols []string, from pglogrepl.LSN) {
	if table < 0 || table >= len(d.maps) {
		return
	}
	if d.expect == nil {
		d.expect = make([]*expectation, len(d.maps))
	}
	d.expect[table] = &expectation{cols: append([]string(nil), cols...), from: from}
}

// readColumn reports whether col is a column the relay reads of tm.
func (tm *tableMap) readColumn(col []byte) bool {
	for _, want := range tm.cols {
		if want != "" && string(col) == want {
			return true
		}
	}
	for _, p := range tm.m.Additional {
		if string(col) == p.Column {
			return true
		}
	}
	return false
}

// optionalColumn reports whether col feeds one of tm's optional roles
// (headers, event_id, dlq_replay_of): a Relation without it is read as a
// table without it, every row's value NULL.
func (tm *tableMap) optionalColumn(col string) bool {
	for r, want := range tm.cols {
		if want != "" && want == col && role(r).optional() {
			return true
		}
	}
	return false
}

// checkNarrowed refuses rel, the new Relation of outbox table tm at lsn,
// when it lacks a read column that the table's previous Relation (old,
// nil for none) had, or that Expect said the table has.
func (d *Decoder) checkNarrowed(lsn pglogrepl.LSN, tm *tableMap, rel, old *relation) error {
	// Only the optional columns: a Relation without a required or
	// additional column makes each row a bad row that names it (dead
	// letter or halt, on_poison), as for a column dropped mid-run; an
	// optional one would be read as NULL without a word.
	lacks := func(cols []string) string {
		for _, c := range cols {
			if tm.optionalColumn(c) && !contains(rel.read, c) {
				return c
			}
		}
		return ""
	}
	// Where the stream is: pgoutput sends a Relation with WALStart 0, so
	// the open transaction's final LSN (its commit: its changes are
	// decoded with the catalog as of then), or the highest position seen
	// (a streamed transaction's changes are decoded as of themselves).
	at := max(lsn, d.pos)
	if d.inTxn {
		at = max(at, d.txn.BeginLSN)
	}
	if old != nil && old.outbox == rel.outbox {
		if c := lacks(old.read); c != "" {
			return d.narrowedError(at, tm, c, "its previous Relation message had")
		}
	}
	if rel.outbox < len(d.expect) {
		if e := d.expect[rel.outbox]; e != nil && at >= e.from {
			if c := lacks(e.cols); c != "" {
				return d.narrowedError(at, tm, c, fmt.Sprintf("the table had when the publication was checked (WAL at %s)", e.from))
			}
		}
	}
	return nil
}

func (d *Decoder) narrowedError(lsn pglogrepl.LSN, tm *tableMap, col, had string) error {

	pub := "the relay's publication (postgres.publication)"
	fix := "ALTER PUBLICATION <postgres.publication> SET TABLE " + tm.m.Table.Quoted()
	if d.publication != "" {
		q := outboxschema.QuoteIdent(d.publication)
		pub, fix = "publication "+q, "ALTER PUBLICATION "+q+" SET TABLE "+tm.m.Table.Quoted()
	}
	since, note := "<the time the publication changed>", ""
	if d.inTxn && !d.txn.CommitTime.IsZero() {
		since, note = d.txn.CommitTime.Add(-5*time.Minute).UTC().Format(time.RFC3339), ", 5 minutes before the first transaction streamed without it,"
	}
	return fmt.Errorf("decode Relation at LSN %s: outbox table %s is streamed without column %q, which %s: %s has a column list that leaves it out "+
		"(or the column was made generated, or dropped), and the relay reads it: its events would be published with it as NULL "+
		"(headers stripped, event_id replaced by the row id). %w: the relay stops before publishing any of them. Fix the publication: %s "+
		"(if it publishes only the outbox; `outbox-relay check` prints the exact statement). Rows written since the change are streamed "+
		"without the column even after the fix: skip them and republish them from the table, with the relay stopped: "+
		"SELECT pg_replication_slot_advance('<postgres.slot>', pg_current_wal_lsn()); then start the relay and run "+
		"`outbox-relay replay --since %s`%s (consumers deduplicate on event_id). If the column was dropped on purpose, just restart the relay",
		lsn, tm.full, col, had, pub, ErrColumnNotStreamed, fix, since, note)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
