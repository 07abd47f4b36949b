package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/internal/rawconn"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// SlotInfo is what the relay needs to know about its slot at start.
type SlotInfo struct {
	ConfirmedFlush pglogrepl.LSN
	RestartLSN     pglogrepl.LSN
	WALStatus      string
	ActivePID      int32 // 0 when no walsender uses the slot
	Created        bool  // created by this call
	// Failover: the slot is a failover slot (PostgreSQL 17+), synced to
	// standbys that have sync_replication_slots on.
	Failover bool
	// FailoverSet: this call turned failover on for an existing slot
	// (postgres.slot_failover).
	FailoverSet bool
	// Warnings are problems with the failover setup seen from this server
	// (postgres.slot_failover on): the caller logs them.
	Warnings []string
}

// ErrSlotVanished is returned (marked fault.Fatal) when a slot that existed
// earlier in this process is gone: recreating it silently would skip every
// event written in between.
var ErrSlotVanished = errors.New("replication slot vanished")

// Prepare checks the server and the outbox objects on a normal connection and
// creates the publication and, when createSlot is true, the slot if missing.
// Every problem an operator must fix comes back marked fault.Fatal, saying how
// to fix it. It is safe to call concurrently with another relay: creation
// races are tolerated.
func Prepare(ctx context.Context, cfg Config, createSlot bool) (SlotInfo, error) {
	return prepare(ctx, cfg, createSlot, Identity{})
}

// prepare is Prepare for a stream that last streamed on prev's history
// (zero: unknown): a missing slot is then explained by a failover for sure.
func prepare(ctx context.Context, cfg Config, createSlot bool, prev Identity) (SlotInfo, error) {
	conn, err := Connect(ctx, cfg.URL)
	if err != nil {
		return SlotInfo{}, fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return SlotInfo{}, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return SlotInfo{}, fault.Fatal.Wrap(fmt.Errorf("postgres wal_level is %q but logical replication needs 'logical': run ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and restart PostgreSQL", walLevel))
	}
	var versionNum int
	var version string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&versionNum, &version); err != nil {
		return SlotInfo{}, fmt.Errorf("read server_version_num: %w", err)
	}
	if err := checkFailoverVersion(cfg.SlotFailover, versionNum, version); err != nil {
		return SlotInfo{}, err
	}
	if len(cfg.Mappings) == 0 {
		if err := checkTable(ctx, conn, cfg.Table); err != nil {
			return SlotInfo{}, err
		}
	} else {
		for _, m := range cfg.Mappings {
			if err := CheckMapping(ctx, conn, m); err != nil {
				return SlotInfo{}, err
			}
		}
	}
	info, found, err := readSlot(ctx, conn, cfg.Slot, versionNum)
	if err != nil {
		return SlotInfo{}, err
	}
	registry := registryName(cfg.Table)
	created, registered, hasRegistry, err := readRegistry(ctx, conn, registry, cfg.Slot)
	if err != nil {
		return SlotInfo{}, err
	}
	if found && info.WALStatus == "lost" {
		return info, fault.Fatal.Wrap(fmt.Errorf("slot %q is invalidated (wal_status = lost): PostgreSQL removed WAL it still needed, so events after its last confirmed position %s may never be streamed. Retrying cannot fix this. Recover: SELECT pg_drop_replication_slot('%s'); %s. Raise max_slot_wal_keep_size or alert on slot lag to prevent it",
			cfg.Slot, info.ConfirmedFlush, cfg.Slot, recoverySteps(created, registered, registry, cfg.Slot)))
	}
	if err := ensurePublication(ctx, conn, cfg, found, info.ConfirmedFlush); err != nil {
		return SlotInfo{}, err
	}
	if !found && registered {
		return SlotInfo{}, fault.Fatal.Wrap(fmt.Errorf("slot %q was created at %s (LSN %s) and is gone (%s): %w. Events committed while it was missing were not streamed, and the relay will not create a fresh slot silently. Recover: %s",
			cfg.Slot, created.at, created.lsn, vanishedCause(ctx, cfg, prev), ErrSlotVanished, recoverySteps(created, registered, registry, cfg.Slot)))
	}
	if !found && !createSlot {
		return SlotInfo{}, fault.Fatal.Wrap(fmt.Errorf("slot %q existed earlier but is gone (%s): %w. Events committed while it was missing may not have been published. Recover: %s",
			cfg.Slot, vanishedCause(ctx, cfg, prev), ErrSlotVanished, recoverySteps(created, registered, registry, cfg.Slot)))
	}
	if !found {
		if err := createReplicationSlot(ctx, cfg); err != nil {
			return SlotInfo{}, err
		}
		info, found, err = readSlot(ctx, conn, cfg.Slot, versionNum)
		if err != nil {
			return SlotInfo{}, err
		}
		if !found {
			return SlotInfo{}, fmt.Errorf("slot %q vanished right after it was created", cfg.Slot)
		}
		info.Created = true
	}
	if cfg.SlotFailover && !info.Failover {
		if err := alterSlotFailover(ctx, cfg); err != nil {
			return SlotInfo{}, err
		}
		info.Failover, info.FailoverSet = true, true
	}
	if cfg.SlotFailover {
		if info.Warnings, err = standbyWarnings(ctx, conn); err != nil {
			return SlotInfo{}, err
		}
	}
	if hasRegistry && !registered {
		if err := register(ctx, conn, registry, cfg.Slot, info.ConfirmedFlush); err != nil {
			return SlotInfo{}, err
		}
	}
	return info, nil
}

// vanishedCause says why a registered slot is missing, as far as the
// server's history tells: IDENTIFY_SYSTEM's timeline, and prev, the history
// the stream last streamed on.
func vanishedCause(ctx context.Context, cfg Config, prev Identity) string {
	const noFailoverSlot = "a standby has a logical slot only if it is a failover slot synced to it: PostgreSQL 17+, postgres.slot_failover and the standby settings in docs/failover.md"
	cur, err := identifySystem(ctx, cfg.URL)
	if err != nil {
		return "dropped, or lost in a failover: " + noFailoverSlot
	}
	return missingSlotCause(prev, cur) + "; " + noFailoverSlot
}

// missingSlotCause explains a missing slot on cur's history, prev being the
// one the relay last streamed on (zero: unknown).
func missingSlotCause(prev, cur Identity) string {
	switch {
	case prev != (Identity{}) && prev != cur:
		return fmt.Sprintf("the server history changed since the relay last streamed, from %s to %s: a failover to a server without the slot", prev, cur)
	case cur.Timeline > 1:
		return fmt.Sprintf("dropped, or lost in a failover: this server is on %s, so it was promoted from a standby (or restored from a backup) at least once", cur)
	default:
		return fmt.Sprintf("dropped: this server is on %s, it was never promoted", cur)
	}
}

func identifySystem(ctx context.Context, url string) (Identity, error) {
	conn, err := connectReplication(ctx, url)
	if err != nil {
		return Identity{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Identity{}, err
	}
	return Identity{SystemID: sys.SystemID, Timeline: sys.Timeline}, nil
}

// registryName is the slot registry table beside the outbox table (see
// migrations/0002_slot_registry.sql). table was validated with the config.
func registryName(table string) string {
	t, _ := outboxschema.ParseTable(table)
	return t.Sibling(outboxschema.SlotRegistry).Quoted()
}

type registryRow struct {
	at, lsn string
	// since is 5 minutes before created_at, in UTC, RFC 3339: the slot
	// streams transactions that began after its creation started, which
	// is before the registry row was written; 5 minutes cover transactions
	// open that long while the slot was being created.
	since string
}

// recoverySteps says how to recover after the slot was lost or dropped: a
// fresh slot streams everything committed from its creation on, and
// `outbox-relay replay` republishes the rows created since the old slot was
// (its creation time is a lower bound of every event it may have missed).
func recoverySteps(r registryRow, registered bool, registry, slot string) string {
	since := "<the time the relay last ran healthy, or earlier>"
	if registered {
		since = r.since
	}
	steps := fmt.Sprintf("run `outbox-relay migrate` (it creates a fresh slot: everything committed from then on is streamed); start the relay; then, with the relay's config, run `outbox-relay replay --since %s`", since)
	if registered {
		steps = fmt.Sprintf("DELETE FROM %s WHERE slot_name = '%s'; ", registry, slot) + steps +
			fmt.Sprintf(": it republishes every outbox row created since 5 minutes before the slot was created (%s)", r.at)
	} else {
		steps += ": it republishes the outbox rows created since then"
	}
	return steps + ", with their original event_id; the duplicates of events already delivered are harmless, consumers deduplicate on event_id"
}

// readRegistry reports whether the registry table exists and whether the
// slot is registered in it. Without the table (a schema not made by migrate)
// there is nothing to compare with.
func readRegistry(ctx context.Context, conn *pgx.Conn, registry, slot string) (r registryRow, registered, exists bool, err error) {
	if err = conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", registry).Scan(&exists); err != nil || !exists {
		return r, false, false, err
	}
	err = conn.QueryRow(ctx, "SELECT created_at::text, coalesce(created_lsn::text, '?'), to_char((created_at - interval '5 minutes') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM "+registry+" WHERE slot_name = $1", slot).Scan(&r.at, &r.lsn, &r.since)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, true, nil
	}
	if err != nil {
		return r, false, true, fmt.Errorf("read slot registry %s: %w; GRANT SELECT, INSERT ON %s TO the relay's role", registry, err, registry)
	}
	return r, true, true, nil
}

// register records the slot. created_xid (migration 0005) is read after the
// slot exists: every transaction with an xid at or above it began after the
// slot did, so the slot streams it; package retention proves delivery only
// for those.
func register(ctx context.Context, conn *pgx.Conn, registry, slot string, lsn pglogrepl.LSN) error {
	var hasXid bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'created_xid' AND NOT attisdropped)",
		registry).Scan(&hasXid); err != nil {
		return fmt.Errorf("read the columns of %s: %w", registry, err)
	}
	q := "INSERT INTO " + registry + " (slot_name, created_lsn) VALUES ($1, $2::pg_lsn) ON CONFLICT (slot_name) DO NOTHING"
	if hasXid {
		q = "INSERT INTO " + registry + " (slot_name, created_lsn, created_xid) VALUES ($1, $2::pg_lsn, pg_snapshot_xmax(pg_current_snapshot())) ON CONFLICT (slot_name) DO NOTHING"
	}
	if _, err := conn.Exec(ctx, q, slot, lsn.String()); err != nil {
		return fmt.Errorf("record slot %q in %s: %w; GRANT SELECT, INSERT ON %s TO the relay's role", slot, registry, err, registry)
	}
	return nil
}

func checkTable(ctx context.Context, conn *pgx.Conn, table string) error {
	t, err := outboxschema.ParseTable(table)
	if err != nil {
		return fault.Fatal.Wrap(err)
	}
	rows, err := conn.Query(ctx, `SELECT a.attname FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", table, err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", table, err)
	}
	if len(have) == 0 {
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s does not exist: run `outbox-relay migrate` with the same config, or set postgres.table", table))
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
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s lacks required column(s) %s: restore them (see migrations/) before starting the relay", table, m))
	}
	if m := missing(outboxschema.BookkeepingColumns); m != "" {
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s lacks column(s) %s, where poison events are recorded: run `outbox-relay migrate` (migration 0003 adds them)", table, m))
	}
	return checkMarkPrivileges(ctx, conn, t)
}

// Tables returns the outbox tables of cfg: those of Mappings, or Table.
func (c Config) Tables() []outboxschema.Table {
	if len(c.Mappings) == 0 {
		t, _ := outboxschema.ParseTable(c.Table) // validated with the config
		return []outboxschema.Table{t}
	}
	ts := make([]outboxschema.Table, len(c.Mappings))
	for i, m := range c.Mappings {
		ts[i] = m.Table
	}
	return ts
}

// ColumnTypes reads the columns of t: name -> pg_type.typname, of the base
// type for a domain. Empty when the table does not exist.
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

// ensurePublication checks the publication, creating it when it is missing,
// allowed, and the slot does not exist yet. A slot that exists without its
// publication cannot be saved by creating one: pgoutput looks publications
// up as of each change it decodes, so the first change before the new
// publication fails the stream for ever.
func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config, slotExists bool, confirmed pglogrepl.LSN) error {
	tables := cfg.Tables()
	var quoted []string
	for _, x := range tables {
		quoted = append(quoted, x.Quoted())
	}
	list := strings.Join(quoted, ", ")
	var pubInsert, created bool
	err := conn.QueryRow(ctx, "SELECT pubinsert FROM pg_publication WHERE pubname = $1", cfg.Publication).Scan(&pubInsert)
	if errors.Is(err, pgx.ErrNoRows) && slotExists {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist, but slot %q does (confirmed up to %s): PostgreSQL decodes each change with the publications that existed when it was written, so a publication created now cannot cover the changes already in the slot and streaming would fail on the first of them. Recreate the publication (CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')), skip the gap with SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()), then republish the outbox rows created since the publication was dropped (consumers deduplicate on event_id); or drop the slot and run outbox-relay migrate",
			cfg.Publication, cfg.Slot, confirmed, outboxschema.QuoteIdent(cfg.Publication), list, cfg.Slot))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if !cfg.CreatePublication {
			return fault.Fatal.Wrap(fmt.Errorf("publication %q does not exist and postgres.create_publication is false: run `outbox-relay migrate`, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
				cfg.Publication, outboxschema.QuoteIdent(cfg.Publication), list))
		}
		_, err = conn.Exec(ctx, PublicationSQL(cfg.Publication, tables))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
			err = nil
		}
		if err != nil {
			return fmt.Errorf("create publication %q: %w", cfg.Publication, err)
		}
		pubInsert, created = true, true
	} else if err != nil {
		return fmt.Errorf("read publication %q: %w", cfg.Publication, err)
	}
	if !pubInsert {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication, outboxschema.QuoteIdent(cfg.Publication)))
	}
	for _, t := range tables {
		if err := checkPublishedTable(ctx, conn, cfg, t, slotExists, created, confirmed); err != nil {
			return err
		}
	}
	return nil
}

// checkPublishedTable checks that the publication streams table t's
// inserts under t's own name.
func checkPublishedTable(ctx context.Context, conn *pgx.Conn, cfg Config, t outboxschema.Table, slotExists, created bool, confirmed pglogrepl.LSN) error {
	// A partitioned outbox must be published through its root: otherwise
	// its inserts are streamed under the partitions' names, which the
	// relay does not read, and the slot would pass them silently.
	var partitioned, viaRoot bool
	if err := conn.QueryRow(ctx, "SELECT c.relkind = 'p', p.pubviaroot FROM pg_class c, pg_publication p WHERE c.oid = $1::regclass AND p.pubname = $2",
		t.Quoted(), cfg.Publication).Scan(&partitioned, &viaRoot); err != nil {
		return fmt.Errorf("read publication %q and table %s: %w", cfg.Publication, t, err)
	}
	if partitioned && !viaRoot && !slotExists && created {
		// Created just now by this call for a partitioned outbox.
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+outboxschema.QuoteIdent(cfg.Publication)+" SET (publish_via_partition_root = true)"); err != nil {
			return fmt.Errorf("set publish_via_partition_root on publication %q: %w", cfg.Publication, err)
		}
		viaRoot = true
	}
	if partitioned && !viaRoot {
		gap := ""
		if slotExists {
			gap = fmt.Sprintf(" Slot %q exists (confirmed up to %s): rows inserted while the publication lacked the option may have been streamed under the partitions' names and skipped; republish them (outbox-relay replay) after the change.", cfg.Slot, confirmed)
		}
		return fault.Fatal.Wrap(fmt.Errorf("outbox table %s is partitioned but publication %q lacks publish_via_partition_root: its inserts would arrive under the partitions' names and be ignored. Run: ALTER PUBLICATION %s SET (publish_via_partition_root = true).%s",
			t, cfg.Publication, outboxschema.QuoteIdent(cfg.Publication), gap))
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
		cfg.Publication, t.Schema, t.Name).Scan(&n); err != nil {
		return fmt.Errorf("read tables of publication %q: %w", cfg.Publication, err)
	}
	if n == 0 {
		return fault.Fatal.Wrap(fmt.Errorf("publication %q does not include %s: ALTER PUBLICATION %s ADD TABLE %s", cfg.Publication, t,
			outboxschema.QuoteIdent(cfg.Publication), t.Quoted()))
	}
	return nil
}

// CreatePublicationSQL is the statement that creates the insert-only
// publication for the outbox table.
func CreatePublicationSQL(publication, table string) string {
	t, _ := outboxschema.ParseTable(table) // validated with the config
	return PublicationSQL(publication, []outboxschema.Table{t})
}

// PublicationSQL is the statement that creates the insert-only publication
// for the outbox tables.
func PublicationSQL(publication string, tables []outboxschema.Table) string {
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = t.Quoted()
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
		outboxschema.QuoteIdent(publication), strings.Join(quoted, ", "))
}

// failoverVersion is the first server_version_num with failover slots.
const failoverVersion = 170000

// checkFailoverVersion refuses postgres.slot_failover on a server without
// failover slots.
func checkFailoverVersion(slotFailover bool, versionNum int, version string) error {
	if !slotFailover || versionNum >= failoverVersion {
		return nil
	}
	return fault.Fatal.Wrap(fmt.Errorf("postgres.slot_failover is true, but the server is PostgreSQL %s (server_version_num %d) and failover slots need PostgreSQL 17 or later: set postgres.slot_failover to false (OUTBOX_RELAY_SLOT_FAILOVER=false); after a failover on this version the relay stops and the slot is recovered with `outbox-relay replay` (docs/failover.md)",
		version, versionNum))
}

// createSlotCommand is the replication command that creates the slot:
// without a snapshot, and a failover slot when failover is set (the option
// list syntax, PostgreSQL 15+, is used only then).
func createSlotCommand(slot string, failover bool) string {
	// slot matches [a-z0-9_]{1,63} (Config.Validate): safe unquoted.
	if failover {
		return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)", slot)
	}
	return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput NOEXPORT_SNAPSHOT", slot)
}

// alterSlotFailover turns failover on for an existing slot (PostgreSQL 17+).
func alterSlotFailover(ctx context.Context, cfg Config) error {
	conn, err := connectReplication(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+cfg.Slot+" (FAILOVER true)").ReadAll()
	if err != nil {
		// In use (55006): the walsender of an earlier session has not
		// exited yet, or another relay streams; retried like a connection error.
		return fmt.Errorf("turn on failover for slot %q (postgres.slot_failover): %w", cfg.Slot, err)
	}
	return nil
}

// standbyWarnings reads, on the primary, the settings a failover slot
// needs there: synchronized_standby_slots naming existing physical slots.
// What the standby needs (sync_replication_slots, hot_standby_feedback,
// primary_slot_name, dbname in primary_conninfo) is not visible from here.
func standbyWarnings(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var setting string
	if err := conn.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&setting); err != nil {
		return nil, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical'")
	if err != nil {
		return nil, fmt.Errorf("read the physical slots: %w", err)
	}
	physical, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the physical slots: %w", err)
	}
	return failoverWarnings(setting, physical), nil
}

// failoverWarnings judges synchronized_standby_slots (setting) against the
// server's physical slots.
func failoverWarnings(setting string, physical []string) []string {
	var names []string
	for _, n := range strings.Split(setting, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return []string{"postgres.slot_failover is on but synchronized_standby_slots is empty on this server: the relay can receive and publish transactions a standby has not received yet; after a failover to that standby they are not in its history, its synced slot may be behind them, and new rows may reuse their ids (event_id). Set synchronized_standby_slots to the physical slots of the standbys that may be promoted (docs/failover.md)"}
	}
	var warns []string
	for _, n := range names {
		if !slices.Contains(physical, n) {
			warns = append(warns, fmt.Sprintf("synchronized_standby_slots names %q, which is not a physical slot on this server: logical decoding waits for it, so the relay stalls until it exists or the setting is fixed (docs/failover.md)", n))
		}
	}
	return warns
}

func readSlot(ctx context.Context, conn *pgx.Conn, slot string, versionNum int) (SlotInfo, bool, error) {
	var (
		info               SlotInfo
		plugin, slotType   *string
		database           *string
		confirmed, restart *string
		walStatus          *string
		pid                *int32
		currentDB          string
	)
	err := conn.QueryRow(ctx, `SELECT plugin, slot_type, database, confirmed_flush_lsn::text, restart_lsn::text,
		wal_status, active_pid, current_database() FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&plugin, &slotType, &database, &confirmed, &restart, &walStatus, &pid, &currentDB)
	if errors.Is(err, pgx.ErrNoRows) {
		return info, false, nil
	}
	if err != nil {
		return info, false, fmt.Errorf("read slot %q: %w", slot, err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if str(slotType) != "logical" || str(plugin) != "pgoutput" {
		return info, false, fault.Fatal.Wrap(fmt.Errorf("slot %q exists but is a %s slot with plugin %q; the relay needs a logical pgoutput slot: choose another postgres.slot name, or drop that slot if nothing else uses it", slot, str(slotType), str(plugin)))
	}
	if str(database) != currentDB {
		return info, false, fault.Fatal.Wrap(fmt.Errorf("slot %q belongs to database %q, not %q: connect to that database or choose another postgres.slot", slot, str(database), currentDB))
	}
	info.WALStatus = str(walStatus)
	if confirmed != nil {
		if info.ConfirmedFlush, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return info, false, fmt.Errorf("parse confirmed_flush_lsn of slot %q: %w", slot, err)
		}
	}
	if restart != nil {
		if info.RestartLSN, err = pglogrepl.ParseLSN(*restart); err != nil {
			return info, false, fmt.Errorf("parse restart_lsn of slot %q: %w", slot, err)
		}
	}
	if pid != nil {
		info.ActivePID = *pid
	}
	if versionNum >= failoverVersion {
		if err := conn.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&info.Failover); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return info, false, fmt.Errorf("read failover of slot %q: %w", slot, err)
		}
	}
	return info, true, nil
}

func createReplicationSlot(ctx context.Context, cfg Config) error {
	conn, err := connectReplication(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createSlotCommand(cfg.Slot, cfg.SlotFailover)))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
		return nil
	}
	if err != nil {
		return fmt.Errorf("create slot %q: %w", cfg.Slot, err)
	}
	return nil
}

func connectReplication(ctx context.Context, url string) (*pgconn.PgConn, error) {
	return connectReplicationReading(ctx, url, nil)
}

// connectReplicationReading is connectReplication with the server's bytes
// read through wrap (nil: directly).
func connectReplicationReading(ctx context.Context, url string, wrap func(io.Reader) io.Reader) (*pgconn.PgConn, error) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fault.Fatal.Wrap(errors.New("parse postgres.url: not a valid connection string"))
	}
	withConnectTimeout(pc)
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outbox-relay"
	dial := pc.DialFunc
	pc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return rawconn.Wrap(c), nil
	}
	if wrap != nil {
		pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend { return pgproto3.NewFrontend(wrap(r), w) }
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if fault.IsPrivilege(err) { // fatal (fault.KindOf); only here is the missing grant known
		return nil, fmt.Errorf("open replication connection as %q: %w; grant it with ALTER ROLE %s REPLICATION (and allow it in pg_hba.conf for the replication database)",
			pc.User, err, pgx.Identifier{pc.User}.Sanitize())
	}
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", connectError(err))
	}
	return conn, nil
}

// connectError makes a connection error that retrying cannot fix fatal: a
// run-time parameter the server does not know, e.g. in options=-c ... of
// postgres.url. 42704 (undefined_object) is fatal only here, at connect:
// fault.KindOf keeps it transient, because START_REPLICATION on a dropped
// slot says 42704 too, and the next session's Prepare explains that one.
func connectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" {
		return fault.Fatal.Wrap(fmt.Errorf("%w; fix the options in postgres.url", err))
	}
	return err
}

// defaultConnectTimeout bounds a connection attempt whose URL sets no
// connect_timeout, so a blackholed server fails fast and is retried instead
// of hanging for the kernel's TCP timeout.
const defaultConnectTimeout = 10 * time.Second

func withConnectTimeout(c *pgconn.Config) {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = defaultConnectTimeout
	}
}

// Connect opens a normal (non-replication) connection with the default
// connect timeout unless the URL sets one.
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fault.Fatal.Wrap(errors.New("parse postgres.url: not a valid connection string"))
	}
	withConnectTimeout(&cc.Config)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, connectError(err)
	}
	return conn, nil
}

// IdentifySystem reads the server's system identifier and timeline over a
// replication connection to url (delivery: exactly_once checks its
// checkpoint against it).
func IdentifySystem(ctx context.Context, url string) (Identity, error) {
	return identifySystem(ctx, url)
}
