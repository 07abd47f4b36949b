// Package migrations holds the versioned SQL that creates the outbox table,
// its index and the publication, and applies it idempotently.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
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
	Version int
	Name    string
	SQL     string
}

// Load returns the migrations in version order with names substituted.
func Load(n Names) ([]Migration, error) {
	entries, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	t := n.table()
	repl := strings.NewReplacer(
		"{{table}}", t.Quoted(),
		"{{index}}", outboxschema.QuoteIdent(n.Table+"_unpublished_idx"),
		"{{dlq_index}}", outboxschema.QuoteIdent(n.Table+"_dead_lettered_idx"),
		"{{slot_registry}}", t.Sibling(outboxschema.SlotRegistry).Quoted(),
		"{{leader_table}}", t.Sibling(outboxschema.LeaseTable).Quoted(),
		"{{publication}}", outboxschema.QuoteIdent(n.Publication),
		"{{publication_literal}}", "'"+strings.ReplaceAll(n.Publication, "'", "''")+"'",
	)
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
		out = append(out, Migration{Version: v, Name: name, SQL: repl.Replace(string(b))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Apply runs every migration not yet recorded, each in its own transaction,
// under an advisory lock so concurrent runs do not race. It returns the
// versions it applied. conn is a normal connection the caller owns.
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
		sum := sha256.Sum256([]byte(m.SQL))
		checksum := hex.EncodeToString(sum[:])
		done, err := applyOne(ctx, conn, history, target, m, checksum)
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

func (n Names) table() outboxschema.Table { return outboxschema.Table{Schema: n.Schema, Name: n.Table} }

func applyOne(ctx context.Context, conn *pgx.Conn, history, target string, m Migration, checksum string) (bool, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outbox-relay-migrate'))"); err != nil {
		return false, err
	}
	var prev string
	err = tx.QueryRow(ctx, "SELECT checksum FROM "+history+" WHERE target = $1 AND version = $2", target, m.Version).Scan(&prev)
	if err == nil {
		return false, nil // recorded; an edited file is not re-run (ship a new version instead)
	}
	if err != pgx.ErrNoRows {
		return false, err
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+history+" (target, version, name, checksum) VALUES ($1, $2, $3, $4)",
		target, m.Version, m.Name, checksum); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}
