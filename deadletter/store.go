package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Store reads and writes the dead-letter bookkeeping columns of the outbox
// table (migration 0003). Safe for concurrent use.
type Store struct {
	db    *pgxpool.Pool
	table string // schema.name, for messages
	ident string // quoted, for SQL
	grant string // the GRANT a privilege error of a row mark needs
}

// Open connects lazily: a PostgreSQL that is down at start delays the first
// query, not the relay. url must reach the server directly, like the
// replication connection.
func Open(ctx context.Context, url, schema, table string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// Never wrap pgx's error: it quotes the string, and its redaction
		// is best effort (it keeps what follows an escaped space).
		return nil, errors.New("postgres.url: cannot be parsed as a PostgreSQL connection string or URL")
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	t := outboxschema.Table{Schema: schema, Name: table}
	return &Store{db: db, table: t.String(), ident: t.Quoted(), grant: t.MarkGrant(cfg.ConnConfig.User)}, nil
}

// Close closes the connections.
func (s *Store) Close() { s.db.Close() }

// MarkDead records that row id went to the dead-letter topic after attempts
// publish attempts. It reports false when the row no longer exists (deleted
// by retention), which is not an error: the dead letter holds the event.
func (s *Store) MarkDead(ctx context.Context, id int64, attempts int, lastErr string) (bool, error) {
	tag, err := s.db.Exec(ctx, `UPDATE `+s.ident+` SET attempt_count = $2, last_error = $3,
		dead_lettered_at = COALESCE(dead_lettered_at, now()) WHERE id = $1`, id, attempts, Truncate(lastErr))
	if err != nil {
		return false, fmt.Errorf("mark outbox row %s id=%d dead-lettered: %w%s", s.table, id, err, s.grantHint(err))
	}
	return tag.RowsAffected() == 1, nil
}

// MarkFailed records a failed attempt on row id without dead-lettering it
// (on_poison=halt), so the operator sees why the relay stopped.
func (s *Store) MarkFailed(ctx context.Context, id int64, attempts int, lastErr string) error {
	_, err := s.db.Exec(ctx, `UPDATE `+s.ident+` SET attempt_count = $2, last_error = $3 WHERE id = $1`,
		id, attempts, Truncate(lastErr))
	if err != nil {
		return fmt.Errorf("record error on outbox row %s id=%d: %w%s", s.table, id, err, s.grantHint(err))
	}
	return nil
}

// grantHint names the GRANT that fixes a privilege error of the row marks,
// or is empty.
func (s *Store) grantHint(err error) string {
	if !fault.IsPrivilege(err) {
		return ""
	}
	return "; run " + s.grant + ", or change the row-level security policy that forbids it"
}

// Unresolved counts dead-lettered rows nobody has replayed or resolved yet:
// the "DLQ size" an operator is alerted on.
func (s *Store) Unresolved(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM `+s.ident+
		` WHERE dead_lettered_at IS NOT NULL AND dlq_resolved_at IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead-lettered rows of %s: %w", s.table, err)
	}
	return n, nil
}

// Row is one dead-lettered outbox row as `dlq list` shows it.
type Row struct {
	ID                                    int64
	AggregateType, AggregateID, EventType string // "<NULL>" when NULL
	Attempts                              int
	LastError                             string
	DeadLetteredAt                        time.Time
	ResolvedAt                            *time.Time
}

// List returns dead-lettered rows, oldest first: unresolved ones, or all
// when all is true.
func (s *Store) List(ctx context.Context, all bool, limit int) ([]Row, error) {
	where := "dead_lettered_at IS NOT NULL"
	if !all {
		where += " AND dlq_resolved_at IS NULL"
	}
	rows, err := s.db.Query(ctx, `SELECT id, COALESCE(aggregate_type::text, '<NULL>'), COALESCE(aggregate_id::text, '<NULL>'),
		COALESCE(event_type::text, '<NULL>'), attempt_count, COALESCE(last_error, ''), dead_lettered_at, dlq_resolved_at
		FROM `+s.ident+` WHERE `+where+` ORDER BY dead_lettered_at, id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead-lettered rows of %s: %w", s.table, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		err := r.Scan(&x.ID, &x.AggregateType, &x.AggregateID, &x.EventType, &x.Attempts, &x.LastError, &x.DeadLetteredAt, &x.ResolvedAt)
		return x, err
	})
}

// ErrNotReplayable is wrapped by Replay and Resolve errors about the row
// itself (missing, not dead-lettered, already resolved, still invalid).
var ErrNotReplayable = errors.New("row cannot be replayed")

// Replayed is what Replay did.
type Replayed struct {
	NewID int64 // the copy's id
	// EventID is the event_id the copy is published under: the
	// dead-lettered row's event_id, or for a row older than migration
	// 0006 its id (the first row's, through a chain of replays).
	EventID string
}

// Replay republishes dead-lettered row id through the normal path: in one
// transaction it inserts a copy of the row as it is now (so fix the row
// first, e.g. UPDATE ... SET headers = ...) and marks the old row resolved.
// The copy is the same event, not a new one: it keeps the row's event_id
// and its dlq_replay_of names the row (COALESCE with the row's own, for a
// copy replayed again), so the relay publishes it under the row's identity
// (decoder.Event.Identity), marked outbox_replayed_from: dlq. A consumer
// that saw the event by another way (outbox-relay replay
// --include-dead-letters, a rewind) deduplicates it. The table needs
// migration 0006.
func (s *Store) Replay(ctx context.Context, id int64) (Replayed, error) {
	var out Replayed
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.lockDead(ctx, tx, id); err != nil {
			return err
		}
		var have []string
		if err := tx.QueryRow(ctx, `SELECT COALESCE(array_agg(attname::text), '{}') FROM pg_attribute WHERE attrelid = $1::regclass
			AND attname IN ('headers', 'event_id', 'dlq_replay_of') AND attnum > 0 AND NOT attisdropped`, s.ident).Scan(&have); err != nil {
			return fmt.Errorf("read columns of %s: %w", s.table, err)
		}
		if !slices.Contains(have, outboxschema.ColEventID) || !slices.Contains(have, outboxschema.ColDLQReplayOf) {
			return fmt.Errorf("outbox table %s has no columns %s and %s: run `outbox-relay migrate` (migration 0006), so that the copy of row id=%d is published under the event's own identity",
				s.table, outboxschema.ColEventID, outboxschema.ColDLQReplayOf, id)
		}
		hasHeaders := slices.Contains(have, outboxschema.ColHeaders)
		cols, check := "aggregate_type, aggregate_id, event_type, payload", ""
		if hasHeaders {
			cols += ", headers"
			check = ` OR (headers IS NOT NULL AND jsonb_typeof(headers::jsonb) IS DISTINCT FROM 'object')`
		}
		var bad []string
		err := tx.QueryRow(ctx, `SELECT array_remove(ARRAY[
			CASE WHEN aggregate_type IS NULL THEN 'aggregate_type is NULL' END,
			CASE WHEN aggregate_id IS NULL OR aggregate_id::text = '' THEN 'aggregate_id is NULL or empty' END,
			CASE WHEN event_type IS NULL THEN 'event_type is NULL' END,
			CASE WHEN payload IS NULL THEN 'payload is NULL' END,
			CASE WHEN false`+check+` THEN 'headers is not a JSON object' END], NULL)
			FROM `+s.ident+` WHERE id = $1`, id).Scan(&bad)
		if err != nil {
			return fmt.Errorf("check outbox row %s id=%d: %w", s.table, id, err)
		}
		if len(bad) == 0 && hasHeaders {
			var keys []string
			if err := tx.QueryRow(ctx, `SELECT COALESCE(array_agg(k), '{}') FROM `+s.ident+
				`, jsonb_object_keys(headers::jsonb) k WHERE id = $1`, id).Scan(&keys); err != nil {
				return fmt.Errorf("read the headers keys of outbox row %s id=%d: %w", s.table, id, err)
			}
			for _, k := range keys {
				if outboxschema.ReservedHeader(k) {
					bad = append(bad, fmt.Sprintf("headers has the key %q, which is reserved for the relay (rename it)", Truncate(k)))
				}
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%w: outbox row %s id=%d: %s; fix the row with UPDATE, then replay it",
				ErrNotReplayable, s.table, id, strings.Join(bad, ", "))
		}
		// event_id is copied as it is, NULL included (an explicit NULL
		// overrides the column's default): a row without one is the event
		// named by its id, which dlq_replay_of then carries.
		if err := tx.QueryRow(ctx, `INSERT INTO `+s.ident+` (`+cols+`, event_id, dlq_replay_of) SELECT `+cols+
			`, event_id, COALESCE(dlq_replay_of, id) FROM `+s.ident+` WHERE id = $1
			RETURNING id, COALESCE(event_id::text, dlq_replay_of::text)`, id).Scan(&out.NewID, &out.EventID); err != nil {
			return fmt.Errorf("insert the replay of outbox row %s id=%d: %w", s.table, id, err)
		}
		return s.resolve(ctx, tx, id, fmt.Sprintf("replayed as id=%d", out.NewID))
	})
	return out, err
}

// Resolve marks dead-lettered row id resolved without republishing it: the
// operator handled the event another way or decided it must not be sent.
func (s *Store) Resolve(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := s.lockDead(ctx, tx, id); err != nil {
			return err
		}
		return s.resolve(ctx, tx, id, "resolved without replay")
	})
}

// lockDead locks row id and checks that it is dead-lettered and unresolved.
func (s *Store) lockDead(ctx context.Context, tx pgx.Tx, id int64) error {
	var dead, resolved *time.Time
	err := tx.QueryRow(ctx, `SELECT dead_lettered_at, dlq_resolved_at FROM `+s.ident+` WHERE id = $1 FOR UPDATE`, id).
		Scan(&dead, &resolved)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: outbox table %s has no row id=%d", ErrNotReplayable, s.table, id)
	case err != nil:
		return fmt.Errorf("read outbox row %s id=%d: %w", s.table, id, err)
	case dead == nil:
		return fmt.Errorf("%w: outbox row %s id=%d was not dead-lettered; see `outbox-relay dlq list`", ErrNotReplayable, s.table, id)
	case resolved != nil:
		return fmt.Errorf("%w: outbox row %s id=%d was already resolved at %s", ErrNotReplayable, s.table, id, resolved.Format(time.RFC3339))
	}
	return nil
}

func (s *Store) resolve(ctx context.Context, tx pgx.Tx, id int64, note string) error {
	_, err := tx.Exec(ctx, `UPDATE `+s.ident+` SET dlq_resolved_at = now(),
		last_error = COALESCE(last_error, '') || ' [' || $2 || ']' WHERE id = $1`, id, note)
	if err != nil {
		return fmt.Errorf("mark outbox row %s id=%d resolved: %w", s.table, id, err)
	}
	return nil
}
