package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// ensurePublication checks the publication, creating it when it is missing,
// allowed, and the slot does not exist yet. A slot that exists without its
// publication cannot be saved by creating one: pgoutput looks publications
// up as of each change it decodes, so the first change before the new
// publication fails the stream for ever.
//
// It returns, for each outbox table (cfg.Tables order), the columns the
// relay reads that the table has, all of which the publication streams.
func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config, slotExists bool, confirmed pglogrepl.LSN) ([][]string, error) {
	tables := cfg.Tables()
	var quoted []string
	for _, x := range tables {
		quoted = append(quoted, x.Quoted())
	}
	list := strings.Join(quoted, ", ")
	var pubInsert, created bool
	err := conn.QueryRow(ctx, "SELECT pubinsert FROM pg_publication WHERE pubname = $1", cfg.Publication).Scan(&pubInsert)
	if errors.Is(err, pgx.ErrNoRows) && slotExists {
		return nil, fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist, but slot %q does (confirmed up to %s): PostgreSQL decodes each change with the publications that existed when it was written, so a publication created now cannot cover the changes already in the slot and streaming would fail on the first of them. Recreate the publication (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')), skip the gap with SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()), then republish the outbox rows created since the publication was dropped (consumers deduplicate on event_id); or drop the slot and run outbox-relay migrate",
			cfg.Publication, cfg.Slot, confirmed, outboxschema.QuoteIdent(cfg.Publication), list, cfg.Slot))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if !cfg.CreatePublication {
			return nil, fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist and postgres.create_publication is false: run `outbox-relay migrate`, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
				cfg.Publication, outboxschema.QuoteIdent(cfg.Publication), list))
		}
		_, err = conn.Exec(ctx, PublicationSQL(cfg.Publication, tables))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
			err = nil
		}
		if err != nil {
			return nil, fmt.Errorf("create publication %q: %w", cfg.Publication, err)
		}
		pubInsert, created = true, true
	} else if err != nil {
		return nil, fmt.Errorf("read publication %q: %w", cfg.Publication, err)
	}
	if !pubInsert {
		return nil, fault.Fatal.Wrap(fmt.Errorf("publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication, outboxschema.QuoteIdent(cfg.Publication)))
	}
	cols := make([][]string, len(tables))
	for i, t := range tables {
		c, err := checkPublishedTable(ctx, conn, cfg, t, slotExists, created, confirmed)
		if err != nil {
			return nil, err
		}
		cols[i] = c
	}
	return cols, nil
}

// checkPublishedTable checks that the publication streams table t's
// inserts whole, under t's own name (Shape.Problems), and returns the
// columns the relay reads that t has.
func checkPublishedTable(ctx context.Context, conn *pgx.Conn, cfg Config, t outboxschema.Table, slotExists, created bool, confirmed pglogrepl.LSN) ([]string, error) {
	// A partitioned outbox must be published through its root: otherwise
	// its inserts are streamed under the partitions' names, which the
	// relay does not read, and the slot would pass them silently.
	var partitioned, viaRoot bool
	if err := conn.QueryRow(ctx, "SELECT c.relkind = 'p', p.pubviaroot FROM pg_class c, pg_publication p WHERE c.oid = $1::regclass AND p.pubname = $2",
		t.Quoted(), cfg.Publication).Scan(&partitioned, &viaRoot); err != nil {
		return nil, fmt.Errorf("read publication %q and table %s: %w", cfg.Publication, t, err)
	}
	if partitioned && !viaRoot && !slotExists && created {
		// Created just now by this call for a partitioned outbox.
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+outboxschema.QuoteIdent(cfg.Publication)+" SET (publish_via_partition_root = true)"); err != nil {
			return nil, fmt.Errorf("set publish_via_partition_root on publication %q: %w", cfg.Publication, err)
		}
	}
	m := outboxschema.DefaultMapping(t)
	for _, x := range cfg.Mappings {
		if x.Table == t {
			m = x
		}
	}
	shape, err := ReadShape(ctx, conn, cfg.Publication, m, cfg.Tables())
	if err != nil {
		return nil, err
	}
	ps := shape.Problems()
	if len(ps) == 0 {
		return shape.Read, nil
	}
	gap := ""
	if slotExists {
		gap = " " + slotGap(ps[0].Kind, cfg.Slot, confirmed)
	}
	return nil, fault.Fatal.Wrap(fmt.Errorf("%s. Run: %s%s", ps[0].What, Statement(ps[0].Fix), gap))
}

// slotGap says what became of the rows written while the publication was
// wrong, for a slot that exists (confirmed up to confirmed): pgoutput
// decodes each change with the publication as it was then, so a fix
// covers only the rows written after it.
func slotGap(kind, slot string, confirmed pglogrepl.LSN) string {
	switch kind {
	case KindColumnList, KindGenerated:
		return fmt.Sprintf("Slot %q exists (confirmed up to %s): rows written while the column was not published are streamed without it even after the fix, and the relay halts at them rather than publish them stripped. If any were written, skip them and republish them from the table after the fix: with the relay stopped, SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()); then start the relay and run `outbox-relay replay --since <the time the publication changed>` (consumers deduplicate on event_id).",
			slot, confirmed, slot)
	default:
		return fmt.Sprintf("Slot %q exists (confirmed up to %s): rows inserted while the publication was wrong were never streamed (or under another name, and skipped); republish them (`outbox-relay replay --since <the time the publication changed>`) after the fix.", slot, confirmed)
	}
}

// CreatePublicationSQL is the statement that creates the insert-only
// publication for the outbox table (valid schema.name). Pure: any
// goroutine, never blocks.
func CreatePublicationSQL(publication, table string) string {
	t, _ := outboxschema.ParseTable(table) // validated with the config
	return PublicationSQL(publication, []outboxschema.Table{t})
}

// PublicationSQL is the statement that creates the insert-only publication
// for the outbox tables; Prepare runs it when the publication is missing.
// Pure: any goroutine, never blocks.
func PublicationSQL(publication string, tables []outboxschema.Table) string {
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = t.Quoted()
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
		outboxschema.QuoteIdent(publication), strings.Join(quoted, ", "))
}

// PublishViaRootSQL is the statement that makes publication pub publish a
// partitioned outbox's rows under the root table's name (`migrate` runs it
// while no slot exists yet). Pure: any goroutine, never blocks.
func PublishViaRootSQL(pub string) string {
	return "ALTER PUBLICATION " + outboxschema.QuoteIdent(pub) + " SET (publish = 'insert', publish_via_partition_root = true)"
}
