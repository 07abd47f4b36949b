package retention

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// archive is <table>_archive: the outbox's columns, partitioned by month
// on created_at, with a DEFAULT partition.
type archive struct {
	table outboxschema.Table
	name  string // quoted
	cols  string // the outbox's columns, quoted, comma-separated
}

// ArchiveTable is the archive of outbox t: <table>_archive.
func ArchiveTable(t outboxschema.Table) outboxschema.Table { return t.Sibling(t.Name + "_archive") }

func splitCols(cols string) []string { return strings.Split(cols, ", ") }

// EnsureArchive creates <table>_archive if missing (migrate with
// retention.archive on, or the cleaner) and adds any outbox column it
// lacks. It blocks on conn, which the caller must not use from another
// goroutine meanwhile.
func EnsureArchive(ctx context.Context, conn *pgx.Conn, t outboxschema.Table, log zerolog.Logger) error {
	_, err := ensureArchive(ctx, conn, t, log)
	return err
}

func ensureArchive(ctx context.Context, conn *pgx.Conn, t outboxschema.Table, log zerolog.Logger) (*archive, error) {
	a := &archive{table: ArchiveTable(t)}
	a.name = a.table.Quoted()
	if len(t.Name)+len("_archive_default") > 63 {
		return nil, fmt.Errorf("retention.archive: the table name %q is too long for the archive's names (%s_archive_default must fit 63 bytes)", t.Name, t.Name)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", a.name).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+a.name+" (LIKE "+t.Quoted()+") PARTITION BY RANGE (created_at); "+
			"CREATE TABLE IF NOT EXISTS "+a.table.Sibling(a.table.Name+"_default").Quoted()+" PARTITION OF "+a.name+" DEFAULT")
		if err != nil {
			return nil, fmt.Errorf("create the archive table %s: %w (the relay's role needs CREATE on schema %s, or run `outbox-relay migrate` with retention.archive on)", a.table, err, t.Schema)
		}
		log.Info().Str("archive", a.table.String()).Msg("archive table created")
	}
	// Columns the outbox has and the archive lacks (added to the outbox
	// later) are added, so no column is lost.
	rows, err := conn.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
		EXISTS (SELECT 1 FROM pg_attribute b WHERE b.attrelid = to_regclass($2) AND b.attname = a.attname AND b.attnum > 0 AND NOT b.attisdropped)
		FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, t.Quoted(), a.name)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	type col struct {
		name, typ string
		has       bool
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (col, error) {
		var c col
		return c, r.Scan(&c.name, &c.typ, &c.has)
	})
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	var names []string
	for _, c := range cs {
		if !c.has {
			if _, err := conn.Exec(ctx, "ALTER TABLE "+a.name+" ADD COLUMN IF NOT EXISTS "+outboxschema.QuoteIdent(c.name)+" "+c.typ); err != nil {
				return nil, fmt.Errorf("add column %s to the archive %s: %w", c.name, a.table, err)
			}
		}
		names = append(names, outboxschema.QuoteIdent(c.name))
	}
	a.cols = strings.Join(names, ", ")
	return a, nil
}

// ensureMonths creates the archive's monthly partitions from the month of
// src's oldest row (a FROM item) to next month, so archived rows do not pile up in the
// DEFAULT partition.
func (a *archive) ensureMonths(ctx context.Context, conn *pgx.Conn, src string, log zerolog.Logger) error {
	var oldest *time.Time
	if err := conn.QueryRow(ctx, "SELECT min(created_at) FROM "+src).Scan(&oldest); err != nil {
		return fmt.Errorf("read the oldest row of %s: %w", src, err)
	}
	if oldest == nil {
		return nil
	}
	now := time.Now().UTC()
	first := time.Date(oldest.UTC().Year(), oldest.UTC().Month(), 1, 0, 0, 0, 0, time.UTC)
	var ranges [][2]time.Time
	for m := first; !m.After(now); m = m.AddDate(0, 1, 0) {
		ranges = append(ranges, [2]time.Time{m, m.AddDate(0, 1, 0)})
	}
	ranges = append(ranges, Ranges(PartitionMonthly, now)[1:2]...)
	return createPartitions(ctx, conn, a.table, PartitionMonthly, ranges, log)
}
