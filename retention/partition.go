package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// proven delivered, among them rows written before the partition was
// attached, or an unresolved dead letter): it is locked first, so
// no row can arrive between the check and the drop. With an archive its
// rows are copied there in the same transaction.
func (c *Cleaner) dropPartitions(ctx context.Context, conn *pgx.Conn, st State, arch *archive) (dropped []string, rows int64, err error) {
	ps, err := c.oldPartitions(ctx, conn)
	if err != nil {
		return nil, 0, err
	}
	floor, upto := st.Args()
	for _, p := range ps {
		if ctx.Err() != nil {
			break
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

// KeepsRowSQL is true when partition part (quoted) of outbox root (quoted)
// holds a row retention must keep; $1 floor, $2 delivered.
func KeepsRowSQL(root, part string) string {
	return With(root) + "SELECT EXISTS (SELECT 1 FROM " + part + " o, c WHERE NOT " + DeliveredCond("$1", "$2") + " OR " + keptDeadLetter + ")"
}

// UnstreamedSQL is true when partition part (quoted) of outbox root
// (quoted) holds a row written before it was attached and not published.
func UnstreamedSQL(root, part string) string {
	return With(root) + "SELECT EXISTS (SELECT 1 FROM " + part + " o, c WHERE o.published_at IS NULL AND " + unstreamed + ")"
}

// PartitionVerdictSQL counts the rows of partition part (quoted) of outbox
// root (quoted) by what keeps them, $1 floor, $2 delivered: all rows,
// unresolved dead letters, rows written before the partition was attached
// (with their least and greatest id), and rows not proven yet.
func PartitionVerdictSQL(root, part string) string {
	notDelivered := "NOT " + keptDeadLetter + " AND NOT " + DeliveredCond("$1", "$2")
	return With(root) + "SELECT count(*), count(*) FILTER (WHERE " + keptDeadLetter + "), " +
		"count(*) FILTER (WHERE " + notDelivered + " AND " + unstreamed + "), " +
		"coalesce(min(o.id) FILTER (WHERE " + notDelivered + " AND " + unstreamed + "), 0), " +
		"coalesce(max(o.id) FILTER (WHERE " + notDelivered + " AND " + unstreamed + "), 0), " +
		"count(*) FILTER (WHERE " + notDelivered + " AND NOT " + unstreamed + ") FROM " + part + " o, c"
}

// PartitionVerdict is what a retention run does with one partition past
// retention.keep, and why (cleanup --dry-run).
type PartitionVerdict struct {
	Partition   outboxschema.Table
	Rows        int64
	DeadLetters int64
	// Unstreamed rows were written before the partition was attached to
	// the outbox (ATTACH PARTITION of a table loaded apart): the slot never
	// streamed them. MinID..MaxID bound their ids.
	Unstreamed   int64
	MinID, MaxID int64
	Unproven     int64 // not yet below the delivered horizon, or below the slot's floor
}

// Drop reports whether a run drops the partition.
func (v PartitionVerdict) Drop() bool {
	return v.DeadLetters == 0 && v.Unstreamed == 0 && v.Unproven == 0
}

// String says what a run does with the partition and why.
func (v PartitionVerdict) String() string {
	if v.Drop() {
		return fmt.Sprintf("partition %s (%d rows, all delivered) would be dropped", v.Partition, v.Rows)
	}
	var why []string
	if v.Unstreamed > 0 {
		why = append(why, fmt.Sprintf("%d rows (ids %d..%d) were written into it before it was attached to the outbox, so the slot never streamed them: publish them with `outbox-relay replay --from-id %d --to-id %d` (or, if another publisher sent them: UPDATE %s SET published_at = now() WHERE published_at IS NULL;)",
			v.Unstreamed, v.MinID, v.MaxID, v.MinID, v.MaxID, v.Partition.Quoted()))
	}
	if v.Unproven > 0 {
		why = append(why, fmt.Sprintf("%d rows are not proven delivered yet (newer than the delivered horizon, or older than the slot)", v.Unproven))
	}
	if v.DeadLetters > 0 {
		why = append(why, fmt.Sprintf("%d rows are unresolved dead letters (`outbox-relay dlq replay` or `dlq resolve`)", v.DeadLetters))
	}
	return fmt.Sprintf("partition %s (%d rows) is kept: %s", v.Partition, v.Rows, strings.Join(why, "; "))
}

// oldPartitions are the non-default partitions whose upper bound is at or
// before now - keep: those a run may drop.
func (c *Cleaner) oldPartitions(ctx context.Context, conn *pgx.Conn) ([]partition, error) {
	ps, err := listPartitions(ctx, conn, c.h.Table)
	if err != nil {
		return nil, err
	}
	var cutoff time.Time
	if err := conn.QueryRow(ctx, "SELECT now() - make_interval(secs => $1)", c.cfg.Keep.Seconds()).Scan(&cutoff); err != nil {
		return nil, err
	}
	var out []partition
	for _, p := range ps {
		if !p.isDefault && !p.until.After(cutoff) {
			out = append(out, p)
		}
	}
	return out, nil
}

// partitionVerdicts says, for each partition past keep, what a run would
// do with it and why.
func (c *Cleaner) partitionVerdicts(ctx context.Context, conn *pgx.Conn, st State) ([]PartitionVerdict, error) {
	ps, err := c.oldPartitions(ctx, conn)
	if err != nil {
		return nil, err
	}
	floor, upto := st.Args()
	var out []PartitionVerdict
	for _, p := range ps {
		v := PartitionVerdict{Partition: p.table}
		if err := conn.QueryRow(ctx, PartitionVerdictSQL(c.h.Table.Quoted(), p.table.Quoted()), floor, upto).
			Scan(&v.Rows, &v.DeadLetters, &v.Unstreamed, &v.MinID, &v.MaxID, &v.Unproven); err != nil {
			return out, fmt.Errorf("count the rows of partition %s: %w", p.table, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func (c *Cleaner) dropPartition(ctx context.Context, conn *pgx.Conn, part outboxschema.Table, floor, upto int64, arch *archive) (int64, bool, error) {
	// A cheap check without the lock first: most old partitions of a
	// healthy relay pass it, and a failing one is not locked at all.
	root := c.h.Table.Quoted()
	var keeps bool
	if err := conn.QueryRow(ctx, KeepsRowSQL(root, part.Quoted()), floor, upto).Scan(&keeps); err != nil {
		return 0, false, fmt.Errorf("check partition %s: %w", part, err)
	}
	if keeps {
		var loaded bool
		if err := conn.QueryRow(ctx, UnstreamedSQL(root, part.Quoted())).Scan(&loaded); err != nil {
			return 0, false, fmt.Errorf("check partition %s: %w", part, err)
		}
		if loaded {
			c.log.Warn().Str("partition", part.String()).
				Msg("partition kept: it holds rows written before it was attached to the outbox, which the slot never streamed; `outbox-relay cleanup --dry-run` names them and the replay that publishes them")
		}
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
	if err := tx.QueryRow(ctx, KeepsRowSQL(root, part.Quoted()), floor, upto).Scan(&keeps); err != nil || keeps {
		return 0, false, err
	}
	var n int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+part.Quoted()).Scan(&n); err != nil {
		return 0, false, err
	}
	if arch != nil && n > 0 {
		if err := arch.ensureMonths(ctx, conn, part.Quoted(), c.log); err != nil {
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
