package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/retention"
)

// CreatePartitionedOutboxSQL creates the outbox partitioned by range of
// created_at, with the columns of migration 0001 and the identity columns
// of 0006 (whose ALTERs then find them), and PRIMARY KEY (id,
// created_at) (a partitioned table's keys must include the partition
// key), and its DEFAULT partition: an insert never fails for lack of a
// partition. Pure: any goroutine, never blocks.
func CreatePartitionedOutboxSQL(t outboxschema.Table) string {
	return "CREATE TABLE IF NOT EXISTS " + t.Quoted() + ` (
    id             BIGSERIAL,
    aggregate_type TEXT        NOT NULL,
    aggregate_id   TEXT        NOT NULL,
    event_type     TEXT        NOT NULL,
    payload        JSONB       NOT NULL,
    headers        JSONB,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at   TIMESTAMPTZ,
    attempt_count  INTEGER     NOT NULL DEFAULT 0,
    last_error     TEXT,
    event_id       UUID        DEFAULT gen_random_uuid(),
    dlq_replay_of  BIGINT,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE IF NOT EXISTS ` + DefaultPartition(t).Quoted() + " PARTITION OF " + t.Quoted() + " DEFAULT"
}

// DefaultPartition is the outbox's DEFAULT partition, <table>_default.
// Pure.
func DefaultPartition(t outboxschema.Table) outboxschema.Table { return t.Sibling(t.Name + "_default") }

// CreatePartitionedOutbox is run by `migrate` before the migrations when
// postgres.partition is daily or monthly: if the outbox table does not
// exist it creates it partitioned (migration 0001's CREATE TABLE IF NOT
// EXISTS then leaves it alone), with its DEFAULT partition and the
// partitions ahead (retention.CreatePartitionsAhead). created reports
// whether it did; an existing table is left as it is. It blocks on conn,
// which the caller must not use from another goroutine meanwhile.
func CreatePartitionedOutbox(ctx context.Context, conn *pgx.Conn, t outboxschema.Table, mode string, log zerolog.Logger) (created bool, err error) {
	if mode == retention.PartitionNone || mode == "" {
		return false, nil
	}
	if n := len(t.Name) + len("_p20060102"); n > 63 {
		return false, fmt.Errorf("postgres.partition: the table name %q is too long for partition names (%s_p20060102 is %d bytes, at most 63)", t.Name, t.Name, n)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Quoted()).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+outboxschema.QuoteIdent(t.Schema)); err != nil {
		return false, fmt.Errorf("create schema %s: %w", t.Schema, err)
	}
	if _, err := conn.Exec(ctx, CreatePartitionedOutboxSQL(t)); err != nil {
		return false, fmt.Errorf("create the partitioned outbox %s: %w", t, err)
	}
	return true, retention.CreatePartitionsAhead(ctx, conn, t, mode, log)
}
