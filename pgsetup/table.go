package pgsetup

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// The warning is for a table without event_id (migration 0006): its events
// are published under their row id, which a failover to a standby that
// lagged or a restore hands out again.
func checkTable(ctx context.Context, conn *pgx.Conn, table string) (warning string, err error) {
	t, err := outboxschema.ParseTable(table)
	if err != nil {
		return "", fault.Fatal.Wrap(err)
	}
	rows, err := conn.Query(ctx, `SELECT a.attname FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, t.Schema, t.Name)
	if err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("read columns of %s: %w", table, err)
	}
	if len(have) == 0 {
		return "", fault.Fatal.Wrap(fmt.Errorf("outbox table %s does not exist: run `outbox-relay migrate` with the same config, or set postgres.table", table))
	}
	missing := func(want []string) string {
		var m []string
		for _, c := range want {
			if !slices.Contains(have, c) {
				m = append(m, c)
			}
		}
		return strings.Join(m, ", ")
	}
	if m := missing(outboxschema.RequiredColumns); m != "" {
		return "", fault.Fatal.Wrap(fmt.Errorf("outbox table %s lacks required column(s) %s: restore them (see migrations/) before starting the relay", table, m))
	}
	if m := missing(outboxschema.BookkeepingColumns); m != "" {
		return "", fault.Fatal.Wrap(fmt.Errorf("outbox table %s lacks column(s) %s, where poison events are recorded: run `outbox-relay migrate` (migration 0003 adds them)", table, m))
	}
	if !slices.Contains(have, "event_id") {
		warning = fmt.Sprintf("outbox table %s has no event_id column: its events are published with event_id = the row id, which a failover to a standby that lagged or a restore from a backup hands out again, so consumers deduplicating on event_id would drop new events; run `outbox-relay migrate` (migration 0006 adds a database-filled UUID)", table)
	}
	return warning, checkMarkPrivileges(ctx, conn, t)
}

// ColumnTypes reads the columns of t: name -> pg_type.typname, of the base
// type for a domain. Empty when the table does not exist. Prepare and
// preflight call it; it blocks on conn, which the caller must not use
// from another goroutine meanwhile.
func ColumnTypes(ctx context.Context, conn *pgx.Conn, t outboxschema.Table) (map[string]string, error) {
	rows, err := conn.Query(ctx, `SELECT a.attname::text, coalesce(bt.typname, ty.typname)::text FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_type ty ON ty.oid = a.atttypid LEFT JOIN pg_type bt ON ty.typtype = 'd' AND bt.oid = ty.typbasetype
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, t.Schema, t.Name)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", t, err)
	}
	types := map[string]string{}
	var name, typ string
	_, err = pgx.ForEachRow(rows, []any{&name, &typ}, func() error { types[name] = typ; return nil })
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", t, err)
	}
	return types, nil
}

// CheckMapping checks a mapped outbox table at start: it exists, and every
// mapped column exists with a type the mapping accepts. Problems come back
// marked fault.Fatal, naming the key, the column, its type and the fix.
// Prepare calls it for each mapping; it blocks on conn, which the caller
// must not use from another goroutine meanwhile.
func CheckMapping(ctx context.Context, conn *pgx.Conn, m outboxschema.Mapping) error {
	types, err := ColumnTypes(ctx, conn, m.Table)
	if err != nil {
		return err
	}
	if len(types) == 0 {
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s does not exist: create it, or fix the table's name (postgres.table or tables[].name)", m.Table))
	}
	if err := m.CheckTypes("", types); err != nil {
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s does not fit its column mapping: %w", m.Table, err))
	}
	return nil
}

// markPrivileges are what the dead-letter and halt marks (deadletter.Store:
// UPDATE ... SET the bookkeeping columns WHERE id = $1) need on the outbox
// table, table-wide or per column.
var markPrivileges = [][2]string{
	{"SELECT", outboxschema.ColID}, {"SELECT", outboxschema.ColDeadLetteredAt},
	{"UPDATE", outboxschema.ColAttemptCount}, {"UPDATE", outboxschema.ColLastError}, {"UPDATE", outboxschema.ColDeadLetteredAt},
}

// checkMarkPrivileges fails when the role cannot write the row marks: found
// only at the first poison event, that would hold the slot before it.
func checkMarkPrivileges(ctx context.Context, conn *pgx.Conn, t outboxschema.Table) error {
	var role string
	var missing []string
	for _, p := range markPrivileges {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT current_user::text, has_column_privilege($1::text::regclass, $2, $3)", t.Quoted(), p[1], p[0]).Scan(&role, &ok); err != nil {
			return fmt.Errorf("read privileges on %s: %w", t, err)
		}
		if !ok {
			missing = append(missing, p[0]+" ("+p[1]+")")
		}
	}
	if len(missing) > 0 {
		return fault.Fatal.Wrap(fmt.Errorf("role %q lacks %s on outbox table %s, which the relay needs to mark dead-lettered and halting rows: run %s",
			role, strings.Join(missing, ", "), t, t.MarkGrant(role)))
	}
	return nil
}
