package inbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Execer runs SQL: *pgx.Conn, *pgxpool.Pool and pgx.Tx are ones.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DB is the database a Consumer writes: a *pgxpool.Pool (each partition
// holds one connection while it handles a record).
type DB interface {
	Execer
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MigrationSQL is the idempotent DDL of the table of handled event ids
// (table "" = DefaultTable), for those who run migrations with their own
// tool. It does no I/O:
//
//	CREATE SCHEMA IF NOT EXISTS "public";
//	CREATE TABLE IF NOT EXISTS "public"."processed_events" (
//	    consumer     text        NOT NULL,  -- Config.Consumer (default: the group id)
//	    event_id     text        NOT NULL,  -- the record's event_id header
//	    processed_at timestamptz NOT NULL DEFAULT now(),
//	    PRIMARY KEY (consumer, event_id));
//	CREATE INDEX IF NOT EXISTS ... (consumer, processed_at);  -- for the TTL cleanup
func MigrationSQL(table string) (string, error) {
	if table == "" {
		table = DefaultTable
	}
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	idx := t.Name + "_processed_at_idx"
	if len(idx) > outboxschema.MaxIdentifierLen {
		idx = idx[:outboxschema.MaxIdentifierLen]
	}
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS %s ON %s (consumer, processed_at);
`, outboxschema.QuoteIdent(t.Schema), t.Quoted(), outboxschema.QuoteIdent(idx), t.Quoted()), nil
}

// Migrate creates the table of handled event ids (table "" =
// DefaultTable) if it does not exist; running it again, or from several
// processes at once, is harmless (an advisory lock orders concurrent runs).
// It blocks on the database; conn is any Execer the caller owns.
func Migrate(ctx context.Context, conn Execer, table string) error {
	ddl, err := MigrationSQL(table)
	if err != nil {
		return err
	}
	// One simple-protocol Exec: an implicit transaction, so the xact lock
	// holds until the DDL is done.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outbox-relay-inbox-migrate'));\n"+ddl); err != nil {
		return fmt.Errorf("inbox: migrate %s: %w", strings.TrimSpace(table), err)
	}
	return nil
}

// store is the SQL of one table and consumer.
type store struct {
	table    outboxschema.Table
	consumer string
	insert   string
	cleanup  string
}

func newStore(t outboxschema.Table, consumer string) store {
	q := t.Quoted()
	return store{
		table: t, consumer: consumer,
		insert: "INSERT INTO " + q + " (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
		cleanup: "DELETE FROM " + q + " WHERE consumer = $1 AND event_id IN (SELECT event_id FROM " + q +
			" WHERE consumer = $1 AND processed_at < now() - $2 * interval '1 second' LIMIT $3)",
	}
}

// record inserts the event id in tx; false when it was there already.
func (s store) record(ctx context.Context, tx pgx.Tx, eventID string) (bool, error) {
	tag, err := tx.Exec(ctx, s.insert, s.consumer, eventID)
	if err != nil {
		return false, fmt.Errorf("inbox: record event_id %s in %s: %w", eventID, s.table, err)
	}
	return tag.RowsAffected() == 1, nil
}
