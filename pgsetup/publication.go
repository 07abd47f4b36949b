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
func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config, slotExists bool, confirmed pglogrepl.LSN) error {
	tables := cfg.Tables()
	var quoted []string
	for _, x := range tables {
		quoted = append(quoted, x.Quoted())
	}
	list := strings.Join(quoted, ", ")
	var pubInsert, created bool
	err := conn.QueryRow(ctx, "SELECT pubinsert FROM pg_publication WHERE pubname = $1", cfg.Publication).Scan(&pubInsert)
	if errors.Is(err, pgx.ErrNoRows) && slotExists {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist, but slot %q does (confirmed up to %s): PostgreSQL decodes each change with the publications that existed when it was written, so a publication created now cannot cover the changes already in the slot and streaming would fail on the first of them. Recreate the publication (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')), skip the gap with SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()), then republish the outbox rows created since the publication was dropped (consumers deduplicate on event_id); or drop the slot and run outbox-relay migrate",
			cfg.Publication, cfg.Slot, confirmed, outboxschema.QuoteIdent(cfg.Publication), list, cfg.Slot))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if !cfg.CreatePublication {
			return fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist and postgres.create_publication is false: run `outbox-relay migrate`, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
				cfg.Publication, outboxschema.QuoteIdent(cfg.Publication), list))
		}
		_, err = conn.Exec(ctx, PublicationSQL(cfg.Publication, tables))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
			err = nil
		}
		if err != nil {
			return fmt.Errorf("create publication %q: %w", cfg.Publication, err)
		}
		pubInsert, created = true, true
	} else if err != nil {
		return fmt.Errorf("read publication %q: %w", cfg.Publication, err)
	}
	if !pubInsert {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication, outboxschema.QuoteIdent(cfg.Publication)))
	}
	for _, t := range tables {
		if err := checkPublishedTable(ctx, conn, cfg, t, slotExists, created, confirmed); err != nil {
			return err
		}
	}
	return nil
}

// checkPublishedTable checks that the publication streams table t's
// inserts under t's own name.
func checkPublishedTable(ctx context.Context, conn *pgx.Conn, cfg Config, t outboxschema.Table, slotExists, created bool, confirmed pglogrepl.LSN) error {
	// A partitioned outbox must be published through its root: otherwise
	// its inserts are streamed under the partitions' names, which the
	// relay does not read, and the slot would pass them silently.
	var partitioned, viaRoot bool
	if err := conn.QueryRow(ctx, "SELECT c.relkind = 'p', p.pubviaroot FROM pg_class c, pg_publication p WHERE c.oid = $1::regclass AND p.pubname = $2",
		t.Quoted(), cfg.Publication).Scan(&partitioned, &viaRoot); err != nil {
		return fmt.Errorf("read publication %q and table %s: %w", cfg.Publication, t, err)
	}
	if partitioned && !viaRoot && !slotExists && created {
		// Created just now by this call for a partitioned outbox.
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+outboxschema.QuoteIdent(cfg.Publication)+" SET (publish_via_partition_root = true)"); err != nil {
			return fmt.Errorf("set publish_via_partition_root on publication %q: %w", cfg.Publication, err)
		}
		viaRoot = true
	}
	if partitioned && !viaRoot {
		gap := ""
		if slotExists {
			gap = fmt.Sprintf(" Slot %q exists (confirmed up to %s): rows inserted while the publication lacked the option may have been streamed under the partitions' names and skipped; republish them (outbox-relay replay) after the change.", cfg.Slot, confirmed)
		}
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s is partitioned but publication %q lacks publish_via_partition_root: its inserts would arrive under the partitions' names and be ignored. Run: ALTER PUBLICATION %s SET (publish_via_partition_root = true).%s",
			t, cfg.Publication, outboxschema.QuoteIdent(cfg.Publication), gap))
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
		cfg.Publication, t.Schema, t.Name).Scan(&n); err != nil {
		return fmt.Errorf("read tables of publication %q: %w", cfg.Publication, err)
	}
	if n == 0 {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not include %s: ALTER PUBLICATION %s ADD TABLE %s", cfg.Publication, t,
			outboxschema.QuoteIdent(cfg.Publication), t.Quoted()))
	}
	return nil
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
