package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// pgDB is the bench's own connection pool plus the names of its outbox.
type pgDB struct {
	url    string
	pool   *pgxpool.Pool
	schema string // bench_<run id>
	table  string // schema.outbox
	pub    string
}

// payloadSQL builds the outbox payload of event n server-side: about 400
// bytes of JSON as jsonb prints it (what the relay publishes). loadgen.go
// builds the same document client-side.
const payloadSQL = `jsonb_build_object(
	'order_id', 'agg-' || ($N % $AGGS),
	'seq', $N,
	'customer_id', 'cust-' || lpad(($N % 9973)::text, 5, '0'),
	'status', 'paid',
	'currency', 'EUR',
	'amount', round((($N % 100000) / 100.0)::numeric, 2),
	'items', jsonb_build_array(
		jsonb_build_object('sku', 'sku-' || lpad(($N % 997)::text, 5, '0'), 'qty', 1 + $N % 3, 'unit_price', 19.99),
		jsonb_build_object('sku', 'sku-' || lpad(($N % 991)::text, 5, '0'), 'qty', 1, 'unit_price', 5.5)),
	'shipping', jsonb_build_object('street', '221B Example Street', 'city', 'Lyon', 'zip', '69001', 'country', 'FR'),
	'note', repeat('x', ` + padSQL + `))`

// padSQL is the filler that brings the payload to ~400 bytes as jsonb prints
// it (noteFill in loadgen.go is the same).
const padSQL = "60"

const headersSQL = `jsonb_build_object('trace_id', md5($N::text), 'tenant_id', 'acme', 'schema_version', '2')`

// eventSQL returns the payload and headers expressions of event number v.
func eventSQL(v string) (payload, headers string) {
	r := strings.NewReplacer("$N", v, "$AGGS", fmt.Sprint(aggregates))
	return r.Replace(payloadSQL), r.Replace(headersSQL)
}

func connectPG(ctx context.Context, url, runID string) (*pgDB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	s := "bench_" + runID
	return &pgDB{url: url, pool: pool, schema: s, table: s + ".outbox", pub: s + "_pub"}, nil
}

// setup runs the relay's own `migrate` (table, index, publication, registry)
// and installs the bench's fill procedure. migrate also makes a slot: it is
// dropped at once, every measurement uses fresh slots of its own.
func (d *pgDB) setup(ctx context.Context, relayBin, brokers string) error {
	slot := d.schema + "_migrate"
	cmd := execCtx(ctx, relayBin, "migrate", "--postgres-url", d.url, "--kafka-brokers", brokers,
		"--slot", slot, "--publication", d.pub, "--table", d.table, "--log-format", "json")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("outbox-relay migrate: %v\n%s", err, out)
	}
	if err := d.dropSlot(ctx, slot); err != nil {
		return err
	}
	aggs := fmt.Sprint(aggregates)
	payloadN, headersN := eventSQL("n")
	payloadG, headersG := eventSQL("g")
	// Autovacuum of a table that just got 1M inserts would write WAL and burn
	// CPU in the middle of a drain: the bench vacuums nothing.
	stmts := []string{
		`ALTER TABLE ` + d.table + ` SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)`,
		`CREATE OR REPLACE PROCEDURE ` + d.schema + `.bench_fill(p_from bigint, p_n bigint, p_per_txn int, p_agg_type text)
LANGUAGE plpgsql AS $proc$
DECLARE
	i bigint := p_from;
	stop bigint := p_from + p_n;
	k bigint;
	n bigint;
BEGIN
	WHILE i < stop LOOP
		k := least(p_per_txn, stop - i);
		IF k = 1 THEN -- VALUES: a third cheaper than INSERT ... SELECT for one row
			n := i;
			INSERT INTO ` + d.table + ` (aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES (p_agg_type, 'agg-' || (n % ` + aggs + `), 'order.updated', ` + payloadN + `, ` + headersN + `);
		ELSE
			INSERT INTO ` + d.table + ` (aggregate_type, aggregate_id, event_type, payload, headers)
			SELECT p_agg_type, 'agg-' || (g % ` + aggs + `), 'order.updated',
				` + payloadG + `, ` + headersG + `
			FROM generate_series(i, i + k - 1) AS g;
		END IF;
		i := i + k;
		COMMIT;
	END LOOP;
END
$proc$`,
	}
	for _, s := range stmts {
		if _, err := d.pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("setup: %w\n%s", err, s)
		}
	}
	return nil
}

// fill commits n events, perTxn per transaction, from `sessions` parallel
// server-side procedures (each COMMITs in its loop: no client round trip
// per transaction). It returns the WAL insert position after the last commit.
func (d *pgDB) fill(ctx context.Context, n, perTxn, sessions int, aggType string) (int64, error) {
	return d.fillWith(ctx, "bench_fill", n, perTxn, sessions, aggType)
}

// fillWith is fill with another of the bench's procedures (proc(from, n,
// per_txn, agg_type, extra...), e.g. bench_fill_msg and its prefix).
func (d *pgDB) fillWith(ctx context.Context, proc string, n, perTxn, sessions int, aggType string, extra ...any) (int64, error) {
	sessions = max(1, min(sessions, n/max(perTxn, 1)))
	per := (n + sessions - 1) / sessions
	per = (per + perTxn - 1) / perTxn * perTxn // whole transactions per session
	errc := make(chan error, sessions)
	launched := 0
	for s := 0; s < sessions; s++ {
		from := s * per
		cnt := min(per, n-from)
		if cnt <= 0 {
			break
		}
		launched++
		go func(from, cnt int) {
			conn, err := d.pool.Acquire(ctx)
			if err != nil {
				errc <- err
				return
			}
			defer conn.Release()
			// Asynchronous commit: the backlog only has to exist before the
			// drains start (fill waits for the WAL flush below).
			if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				errc <- err
				return
			}
			call := "CALL " + d.schema + "." + proc + "($1, $2, $3, $4"
			for i := range extra {
				call += fmt.Sprintf(", $%d", i+5)
			}
			args := append([]any{int64(from), int64(cnt), perTxn, aggType}, extra...)
			_, err = conn.Exec(ctx, call+")", args...)
			conn.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit")
			errc <- err
		}(from, cnt)
	}
	var errs []error
	for i := 0; i < launched; i++ {
		errs = append(errs, <-errc)
	}
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("fill: %w", err)
	}
	end, err := d.lsn(ctx, "pg_current_wal_insert_lsn()")
	if err != nil {
		return 0, err
	}
	// The walsender only decodes flushed WAL: wait until the backlog is.
	deadline := time.Now().Add(time.Minute)
	for {
		f, err := d.lsn(ctx, "pg_current_wal_flush_lsn()")
		if err != nil {
			return 0, err
		}
		if f >= end {
			return end, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("WAL not flushed to %s after 1m", fmtLSN(end))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lsn evaluates an expression of type pg_lsn to a byte position.
func (d *pgDB) lsn(ctx context.Context, expr string, args ...any) (int64, error) {
	var v *int64
	if err := d.pool.QueryRow(ctx, "SELECT ("+expr+" - '0/0'::pg_lsn)::bigint", args...).Scan(&v); err != nil {
		return 0, err
	}
	if v == nil {
		return 0, nil
	}
	return *v, nil
}

func fmtLSN(l int64) string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint32(l)) }

func (d *pgDB) createSlot(ctx context.Context, name string) (int64, error) {
	var l int64
	err := d.pool.QueryRow(ctx, "SELECT (lsn - '0/0'::pg_lsn)::bigint FROM pg_create_logical_replication_slot($1, 'pgoutput')", name).Scan(&l)
	if err != nil {
		return 0, fmt.Errorf("create slot %s: %w", name, err)
	}
	return l, nil
}

// slotState returns the slot's confirmed_flush_lsn and its walsender's pid
// (0 if none).
func (d *pgDB) slotState(ctx context.Context, name string) (confirmed int64, pid int, err error) {
	var c *int64
	var p *int32
	err = d.pool.QueryRow(ctx, "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint, active_pid FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&c, &p)
	if err != nil {
		return 0, 0, fmt.Errorf("read slot %s: %w", name, err)
	}
	if c != nil {
		confirmed = *c
	}
	if p != nil {
		pid = int(*p)
	}
	return confirmed, pid, nil
}

// walsenderPID waits (bounded) until a walsender serves the slot.
func (d *pgDB) walsenderPID(ctx context.Context, slot string, alive func() bool, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && alive() {
		if _, pid, err := d.slotState(ctx, slot); err == nil && pid != 0 {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0
}

// dropSlot waits for the slot's walsender to let go, then drops it.
func (d *pgDB) dropSlot(ctx context.Context, name string) error {
	return testkit.DropSlot(ctx, d.pool, name)
}

// cleanup drops every slot, the publication and the schema of this run.
func (d *pgDB) cleanup(ctx context.Context) {
	rows, err := d.pool.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE $1", d.schema+"%")
	if err == nil {
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			if err := d.dropSlot(ctx, n); err != nil {
				logf("cleanup: %v", err)
			}
		}
	}
	d.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+d.pub)
	d.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+d.schema+" CASCADE")
}

// truncate empties the outbox (TRUNCATE is not published: the publication is
// insert-only) and checkpoints, so WAL of dropped slots can be recycled.
func (d *pgDB) truncate(ctx context.Context) error {
	if _, err := d.pool.Exec(ctx, "TRUNCATE "+d.table); err != nil {
		return err
	}
	_, err := d.pool.Exec(ctx, "CHECKPOINT")
	return err
}

// avgPayload is the average published payload size (jsonb text) of a sample.
func (d *pgDB) avgPayload(ctx context.Context) (float64, error) {
	var v *float64
	err := d.pool.QueryRow(ctx, "SELECT avg(octet_length(payload::text))::float8 FROM (SELECT payload FROM "+d.table+" LIMIT 1000) s").Scan(&v)
	if err != nil || v == nil {
		return 0, err
	}
	return *v, nil
}

func (d *pgDB) version(ctx context.Context) string {
	var v string
	if err := d.pool.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	return v
}

// slotLag is pg_current_wal_lsn() - confirmed_flush_lsn in bytes.
func (d *pgDB) slotLag(ctx context.Context, slot string) (int64, error) {
	var v *int64
	err := d.pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&v)
	if err != nil || v == nil {
		return 0, err
	}
	return *v, nil
}
