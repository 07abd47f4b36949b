// Package migrations holds the versioned SQL of the relay's own objects (the
// outbox table and its indexes, the publication, and the helper tables
// beside the outbox: slot registry, leader lease, delivery state) and
// applies it idempotently, recording each outbox table's history; and, for
// postgres.partition daily or monthly, CreatePartitionedOutbox, which
// `migrate` runs first to create a missing outbox table partitioned (the
// partitions ahead are retention's, which keeps them ahead afterwards).
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

//go:embed *.sql
var files embed.FS

// Names are the configured object names substituted into the SQL.
type Names struct {
	Schema, Table, Publication string
}

// Migration is one versioned SQL file.
type Migration struct {
	Version  int
	Name     string // file name
	SQL      string // with names substituted
	Checksum string // SHA-256 of the file before names are substituted: other names are not a change
}

// ErrChecksumMismatch is wrapped by Apply's error when a migration file was
// changed after it was applied.
var ErrChecksumMismatch = errors.New("migration file changed after it was applied")

// Load returns the migrations in version order with names substituted.
func Load(n Names) ([]Migration, error) {
	entries, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	t := n.table()
	subst := []string{
		"{{table}}", t.Quoted(),
		"{{table_literal}}", outboxschema.QuoteLiteral(t.Quoted()),
		"{{index}}", outboxschema.QuoteIdent(n.Table + "_unpublished_idx"),
		"{{unpublished_index}}", t.Sibling(n.Table + "_unpublished_idx").Quoted(),
		"{{created_at_index}}", outboxschema.QuoteIdent(n.Table + "_created_at_idx"),
		"{{delivery_table}}", t.Sibling(outboxschema.DeliveryTable).Quoted(),
		"{{dlq_index}}", outboxschema.QuoteIdent(n.Table + "_dead_lettered_idx"),
		"{{slot_registry}}", t.Sibling(outboxschema.SlotRegistry).Quoted(),
		"{{leader_table}}", t.Sibling(outboxschema.LeaseTable).Quoted(),
		"{{publication}}", outboxschema.QuoteIdent(n.Publication),
		"{{publication_literal}}", outboxschema.QuoteLiteral(n.Publication),
	}
	repl := strings.NewReplacer(subst...)
	// The files' DO blocks are dollar-quoted with $$, which a quoted name
	// may contain (a publication "a$$b" would end the block early): then
	// use a tag that no substituted name contains. Other names keep $$, so
	// the SQL, and an older relay's checksum of it, stays the same.
	dollar := dollarTag(subst)
	var out []Migration
	for _, name := range entries {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s: name must start with a number and '_'", name)
		}
		b, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: repl.Replace(strings.ReplaceAll(string(b), "$$", dollar)), Checksum: sha256Hex(string(b))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Apply runs every migration not yet recorded, each in its own transaction,
// under an advisory lock so concurrent runs do not race (it blocks while
// another run holds the lock). It first creates n's schema and the history
// table if missing. It returns the versions it applied, on an error those
// applied before it. conn is a normal connection the caller owns and must
// not use concurrently. An applied migration whose file changed since fails
// with ErrChecksumMismatch.
func Apply(ctx context.Context, conn *pgx.Conn, n Names, log zerolog.Logger) ([]int, error) {
	ms, err := Load(n)
	if err != nil {
		return nil, err
	}
	t := n.table()
	history := t.Sibling(outboxschema.MigrationHistory).Quoted()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{n.Schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", n.Schema, err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+history+` (
		target text NOT NULL, version int NOT NULL, name text NOT NULL, checksum text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, version))`); err != nil {
		return nil, fmt.Errorf("create %s: %w", history, err)
	}
	// One history per outbox table, so two outboxes can share a schema.
	target := t.String()
	var applied []int
	for _, m := range ms {
		done, err := applyOne(ctx, conn, history, target, m)
		if err != nil {
			return applied, fmt.Errorf("apply migration %s to %s: %w", m.Name, target, err)
		}
		if done {
			applied = append(applied, m.Version)
			log.Info().Int("version", m.Version).Str("migration", m.Name).Str("table", target).Msg("migration applied")
		}
	}
	return applied, nil
}

// helperMigrations create only the relay's helper tables (slot registry,
// leader lease), none of which touches the outbox table.
var helperMigrations = []string{"0002_slot_registry.sql", "0004_leader_lease.sql", "0007_history.sql"}

// ApplyHelpers creates the relay's helper tables beside n's table (the slot
// registry and the leader lease) and nothing else: for outbox tables the
// relay reads through a column mapping, which it must not alter. It is
// idempotent and records no history (the statements are CREATE TABLE IF NOT
// EXISTS).
func ApplyHelpers(ctx context.Context, conn *pgx.Conn, n Names) error {
	ms, err := Load(n)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{n.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", n.Schema, err)
	}
	for _, m := range ms {
		for _, h := range helperMigrations {
			if m.Name == h {
				if _, err := conn.Exec(ctx, m.SQL); err != nil {
					return fmt.Errorf("apply helper tables of migration %s: %w", m.Name, err)
				}
			}
		}
	}
	return nil
}

// dollarTag is "$$" unless a substituted value contains it, else a
// $outbox_relay_N$ tag that none contains.
func dollarTag(subst []string) string {
	tag := "$$"
	for i := 0; ; i++ {
		clash := false
		for j := 1; j < len(subst); j += 2 {
			clash = clash || strings.Contains(subst[j], tag)
		}
		if !clash {
			return tag
		}
		tag = "$outbox_relay_" + strconv.Itoa(i) + "$"
	}
}

func (n Names) table() outboxschema.Table { return outboxschema.Table{Schema: n.Schema, Name: n.Table} }

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func applyOne(ctx context.Context, conn *pgx.Conn, history, target string, m Migration) (bool, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outbox-relay-migrate'))"); err != nil {
		return false, err
	}
	var prev, prevName string
	err = tx.QueryRow(ctx, "SELECT checksum, name FROM "+history+" WHERE target = $1 AND version = $2", target, m.Version).Scan(&prev, &prevName)
	if err == nil {
		return false, checkApplied(ctx, tx, history, target, m, prev, prevName)
	}
	if err != pgx.ErrNoRows {
		return false, err
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+history+" (target, version, name, checksum) VALUES ($1, $2, $3, $4)",
		target, m.Version, m.Name, m.Checksum); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// checkApplied compares an applied migration's recorded checksum with the
// embedded file's. An applied migration is never re-run, so a file edited
// since would silently not take effect: refuse instead.
func checkApplied(ctx context.Context, tx pgx.Tx, history, target string, m Migration, recorded, recordedName string) error {
	switch recorded {
	case m.Checksum:
		return nil
	case sha256Hex(m.SQL):
		// Recorded by an older relay, which summed the SQL with the names
		// substituted: record the name-independent checksum from now on.
		if _, err := tx.Exec(ctx, "UPDATE "+history+" SET checksum = $3 WHERE target = $1 AND version = $2",
			target, m.Version, m.Checksum); err != nil {
			return fmt.Errorf("update the checksum recorded in %s: %w", history, err)
		}
		return tx.Commit(ctx)
	}
	file := "migrations/" + m.Name
	if recordedName != m.Name {
		file += " (applied as " + recordedName + ")"
	}
	return fmt.Errorf("%w: version %d, %s, was applied with checksum %s but the file now has %s. "+
		"Restore the file as it was when applied and put the change in a new migration with a higher number. "+
		"If the database already matches the edited file, accept it with: UPDATE %s SET checksum = '%s' WHERE target = '%s' AND version = %d",
		ErrChecksumMismatch, m.Version, file, recorded, m.Checksum,
		history, m.Checksum, strings.ReplaceAll(target, "'", "''"), m.Version)
}
