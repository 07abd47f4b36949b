package retention

import (
	"context"
	"errors"
	"fmt"

	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Partition modes of postgres.partition.
const (
	PartitionNone    = "none"
	PartitionDaily   = "daily"
	PartitionMonthly = "monthly"
)

// Partitions created ahead of now, so an insert never lands in the
// DEFAULT partition in normal operation.
const (
	daysAhead   = 7
	monthsAhead = 3
)

// partition is one partition of the outbox (or the archive).
type partition struct {
	table       outboxschema.Table
	isDefault   bool
	from, until time.Time // zero for the default partition
}

// isPartitioned reports whether t is a partitioned table.
func isPartitioned(ctx context.Context, q RowQuerier, t outboxschema.Table) (bool, error) {
	var kind *string
	if err := q.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", t.Quoted()).Scan(&kind); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("read the kind of %s: %w", t, err)
	}
	return kind != nil && *kind == "p", nil
}

// IsPartitioned reports whether the outbox table is partitioned; false
// when it does not exist. `migrate` calls it; it blocks on q.
func IsPartitioned(ctx context.Context, q RowQuerier, t outboxschema.Table) (bool, error) {
	return isPartitioned(ctx, q, t)
}

// listPartitions reads t's partitions and their created_at bounds.
func listPartitions(ctx context.Context, conn *pgx.Conn, t outboxschema.Table) ([]partition, error) {
	rows, err := conn.Query(ctx, `SELECT n.nspname::text, c.relname::text, pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT',
		(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
		(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = to_regclass($1) ORDER BY 5 NULLS FIRST`, t.Quoted())
	if err != nil {
		return nil, fmt.Errorf("list the partitions of %s: %w", t, err)
	}
	defer rows.Close()
	var out []partition
	for rows.Next() {
		var p partition
		var from, until *time.Time
		if err := rows.Scan(&p.table.Schema, &p.table.Name, &p.isDefault, &from, &until); err != nil {
			return nil, fmt.Errorf("list the partitions of %s: %w", t, err)
		}
		if from != nil && until != nil {
			p.from, p.until = *from, *until
		} else if !p.isDefault {
			continue // MINVALUE/MAXVALUE bounds: not ours, left alone
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Ranges are the partition bounds [from, until) that mode needs ahead of
// now: today and the next 7 days (daily), or this month and the next 3
// (monthly), in UTC.
func Ranges(mode string, now time.Time) [][2]time.Time {
	now = now.UTC()
	var out [][2]time.Time
	switch mode {
	case PartitionDaily:
		d := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		for i := 0; i <= daysAhead; i++ {
			out = append(out, [2]time.Time{d.AddDate(0, 0, i), d.AddDate(0, 0, i+1)})
		}
	case PartitionMonthly:
		m := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		for i := 0; i <= monthsAhead; i++ {
			out = append(out, [2]time.Time{m.AddDate(0, i, 0), m.AddDate(0, i+1, 0)})
		}
	}
	return out
}

// PartitionName is the partition of t for the range starting at from:
// <table>_pYYYYMMDD (daily) or <table>_pYYYYMM (monthly).
func PartitionName(t outboxschema.Table, mode string, from time.Time) outboxschema.Table {
	layout := "20060102"
	if mode == PartitionMonthly {
		layout = "200601"
	}
	return t.Sibling(t.Name + "_p" + from.UTC().Format(layout))
}

// CreatePartitionSQL attaches a new partition of parent for [from, until).
func CreatePartitionSQL(parent, part outboxschema.Table, from, until time.Time) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		part.Quoted(), parent.Quoted(), from.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
}

// createPartitions creates the missing partitions of t for ranges. A range
// that overlaps an existing partition, or whose rows already sit in the
// DEFAULT partition, is skipped with a warning.
func createPartitions(ctx context.Context, conn *pgx.Conn, t outboxschema.Table, mode string, ranges [][2]time.Time, log zerolog.Logger) error {
	have, err := listPartitions(ctx, conn, t)
	if err != nil {
		return err
	}
next:
	for _, r := range ranges {
		for _, p := range have {
			if !p.isDefault && p.from.Before(r[1]) && r[0].Before(p.until) {
				continue next
			}
		}
		part := PartitionName(t, mode, r[0])
		_, err := conn.Exec(ctx, "SET lock_timeout = '2s'; "+CreatePartitionSQL(t, part, r[0], r[1])+"; RESET lock_timeout")
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "23514" || pgErr.Code == "42P17" || pgErr.Code == "55P03" || pgErr.Code == "42P07") {
			_, _ = conn.Exec(ctx, "RESET lock_timeout")
			log.Warn().Str("partition", part.String()).Str("error", pgErr.Message).Msg("partition not created; rows for its range go to the DEFAULT partition")
			continue
		}
		if err != nil {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout")
			return fmt.Errorf("create partition %s of %s: %w (the relay's role must own %s)", part, t, err, t)
		}
	}
	return nil
}

// partitionMode guesses daily or monthly from the widest bounded partition.
func partitionMode(ps []partition) string {
	for i := len(ps) - 1; i >= 0; i-- {
		if !ps[i].isDefault {
			if ps[i].until.Sub(ps[i].from) <= 25*time.Hour {
				return PartitionDaily
			}
			return PartitionMonthly
		}
	}
	return ""
}

// keepAhead creates the partitions ahead of now that the outbox's mode
// needs.
func (c *Cleaner) keepAhead(ctx context.Context, conn *pgx.Conn) error {
	ps, err := listPartitions(ctx, conn, c.h.Table)
	if err != nil {
		return err
	}
	mode := partitionMode(ps)
	if mode == "" {
		return nil
	}
	return CreatePartitionsAhead(ctx, conn, c.h.Table, mode, c.log)
}

// CreatePartitionsAhead creates the partitions of t that mode (daily or
// monthly) needs ahead of now (Ranges) and that are missing; a range that
// overlaps an existing partition, or whose rows already sit in the DEFAULT
// partition, is skipped with a warning. The cleaner calls it every run;
// `migrate` once, after it created the outbox partitioned. It blocks on
// conn, which the caller must not use concurrently.
func CreatePartitionsAhead(ctx context.Context, conn *pgx.Conn, t outboxschema.Table, mode string, log zerolog.Logger) error {
	return createPartitions(ctx, conn, t, mode, Ranges(mode, time.Now()), log)
}

// dropPartitions drops each non-default partition whose upper bound is at
// or before now - keep and that holds no row retention must keep (not
// proven delivered, or an unresolved dead letter): it is locked first, so
// no row can arrive between the check and the drop. With an archive its
// rows are copied there in the same transaction.
func (c *Cleaner) dropPartitions(ctx context.Context, conn *pgx.Conn, st State, arch *archive) (dropped []string, rows int64, err error) {
	ps, err := listPartitions(ctx, conn, c.h.Table)
	if err != nil {
		return nil, 0, err
	}
	var cutoff time.Time
	if err := conn.QueryRow(ctx, "SELECT now() - make_interval(secs => $1)", c.cfg.Keep.Seconds()).Scan(&cutoff); err != nil {
		return nil, 0, err
	}
	floor, upto := st.Args()
	for _, p := range ps {
		if p.isDefault || p.until.After(cutoff) || ctx.Err() != nil {
			continue
		}
		n, ok, err := c.dropPartition(ctx, conn, p.table, floor, upto, arch)
		if err != nil {
			return dropped, rows, err
		}
		if ok {
			dropped = append(dropped, p.table.String())
			rows += n
		}
	}
	return dropped, rows, nil
}

// KeepsRowSQL is true when partition part (quoted) holds a row retention
// must keep; $1 floor, $2 delivered.
func KeepsRowSQL(part string) string {
	return With() + "SELECT EXISTS (SELECT 1 FROM " + part + " o, c WHERE NOT " + DeliveredCond("$1", "$2") + " OR " + keptDeadLetter + ")"
}

func (c *Cleaner) dropPartition(ctx context.Context, conn *pgx.Conn, part outboxschema.Table, floor, upto int64, arch *archive) (int64, bool, error) {
	// A cheap check without the lock first: most old partitions of a
	// healthy relay pass it, and a failing one is not locked at all.
	var keeps bool
	if err := conn.QueryRow(ctx, KeepsRowSQL(part.Quoted()), floor, upto).Scan(&keeps); err != nil {
		return 0, false, fmt.Errorf("check partition %s: %w", part, err)
	}
	if keeps {
		return 0, false, nil
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '1s'"); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+part.Quoted()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		if isLockTimeout(err) {
			c.log.Info().Str("partition", part.String()).Msg("partition busy; its drop is retried next run")
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("lock partition %s: %w", part, err)
	}
	if err := tx.QueryRow(ctx, KeepsRowSQL(part.Quoted()), floor, upto).Scan(&keeps); err != nil || keeps {
		return 0, false, err
	}
	var n int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+part.Quoted()).Scan(&n); err != nil {
		return 0, false, err
	}
	if arch != nil && n > 0 {
		if err := arch.ensureMonths(ctx, conn, part, c.log); err != nil {
			return 0, false, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+arch.name+" ("+arch.cols+") SELECT "+arch.cols+" FROM "+part.Quoted()); err != nil {
			return 0, false, fmt.Errorf("archive partition %s: %w", part, err)
		}
	}
	if _, err := tx.Exec(ctx, "DROP TABLE "+part.Quoted()); err != nil {
		if isLockTimeout(err) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("drop partition %s: %w (the relay's role must own the outbox table and its partitions)", part, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, err
	}
	return n, true, nil
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}
