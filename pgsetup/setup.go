package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// SlotInfo is what Prepare found out about the slot: what the stream and
// `migrate` need to know about it at start. A plain value.
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
	// (postgres.slot_failover on, postgres.standby_slots): the caller logs
	// them.
	Warnings []string
	// Columns are, for each outbox table (Config.Tables order), the
	// columns the relay reads that the table has, all streamed by the
	// publication as Prepare checked it, the server's WAL then at
	// CheckedAt: a later Relation message without one of them means the
	// publication changed (decoder.Decoder.Expect).
	Columns   [][]string
	CheckedAt pglogrepl.LSN
	// Registry is the slot's row in the slot registry, its generation
	// raised by this call (history.Mark); zero without a registry.
	Registry Registry
}

// Registry is what the slot registry says of the slot's history: its
// creation, and the generation counter each Prepare raises (migration
// 0007), which a restore winds back with the data.
type Registry struct {
	SlotLSN pglogrepl.LSN
	SlotXid uint64 // created_xid; 0 unknown
	// Raised is the generation before this call raised it, Generation
	// after; both 0 when the registry has no generation column or the
	// relay's role may not update it.
	Raised, Generation int64
	// Warning says why the generation is unknown, for the caller's log.
	Warning string
}

// ErrSlotVanished is wrapped by Prepare's error (marked fault.Fatal) when a
// slot that existed before is gone: the slot registry records its creation,
// or the caller saw it earlier (createSlot false). Recreating it silently
// would skip every event written in between. Test with errors.Is.
var ErrSlotVanished = errors.New("replication slot vanished")

// Prepare checks the server and the outbox objects on a normal connection and
// creates the publication and, when createSlot is true, the slot if missing.
// prev is the server history the caller last streamed on (zero: unknown,
// as for `migrate`): a registered slot missing on another history is
// explained as lost in a failover. Every problem an operator must fix comes
// back marked fault.Fatal, saying how to fix it.
//
// While it creates the slot, which waits for every transaction holding an
// xid in the cluster to end, it logs on log every few seconds which ones
// hold one and how to end them (and an error when ctx ends first says so).
//
// Any goroutine; it blocks for its own connections (a normal one, and
// replication ones to create the slot, turn on its failover or read the
// server's history, and one to watch the slot's creation), all closed
// before it returns. It is safe to call
// concurrently with another relay: creation races are tolerated.
func Prepare(ctx context.Context, cfg Config, createSlot bool, prev pg.Identity, log zerolog.Logger) (SlotInfo, error) {
	conn, err := pg.Connect(ctx, cfg.URL)
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
	var tableWarning string
	if len(cfg.Mappings) == 0 {
		w, err := checkTable(ctx, conn, cfg.Table)
		if err != nil {
			return SlotInfo{}, err
		}
		tableWarning = w
	} else {
		for _, m := range cfg.Mappings {
			if err := CheckMapping(ctx, conn, m); err != nil {
				return SlotInfo{}, err
			}
		}
	}
	for _, t := range cfg.Tables() {
		if err := checkInheritance(ctx, conn, t); err != nil {
			return SlotInfo{}, err
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
	cols, err := ensurePublication(ctx, conn, cfg, found, info.ConfirmedFlush)
	if err != nil {
		return SlotInfo{}, err
	}
	var at string
	if err := conn.QueryRow(ctx, "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END::text").Scan(&at); err != nil {
		return SlotInfo{}, fmt.Errorf("read the WAL position: %w", err)
	}
	checkedAt, err := pglogrepl.ParseLSN(at)
	if err != nil {
		return SlotInfo{}, fmt.Errorf("parse WAL position %q: %w", at, err)
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
		if err := createReplicationSlot(ctx, cfg, log); err != nil {
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
	info.Columns, info.CheckedAt = cols, checkedAt
	if cfg.SlotFailover && !info.Failover {
		if err := alterSlotFailover(ctx, cfg); err != nil {
			return SlotInfo{}, err
		}
		info.Failover, info.FailoverSet = true, true
	}
	if cfg.SlotFailover {
		if info.Warnings, err = standbyWarnings(ctx, conn, len(cfg.StandbySlots) > 0); err != nil {
			return SlotInfo{}, err
		}
	}
	if len(cfg.StandbySlots) > 0 {
		slots, err := ReadStandbySlots(ctx, conn, cfg.StandbySlots)
		if err != nil {
			return SlotInfo{}, err
		}
		warns, err := checkStandbySlots(slots)
		if err != nil {
			return SlotInfo{}, err
		}
		info.Warnings = append(info.Warnings, warns...)
	}
	if hasRegistry && !registered {
		if err := register(ctx, conn, registry, cfg.Slot, info.ConfirmedFlush); err != nil {
			return SlotInfo{}, err
		}
	}
	if hasRegistry {
		if info.Registry, err = raiseGeneration(ctx, conn, registry, cfg.Slot); err != nil {
			return SlotInfo{}, err
		}
	}
	if tableWarning != "" {
		info.Warnings = append(info.Warnings, tableWarning)
	}
	return info, nil
}

// raiseGeneration raises the slot's generation in the registry and reads
// the slot's creation. The generation moves at every session start, so a
// database restored from a snapshot taken before the last start has a lower
// one than the relay (or its exactly-once checkpoint) remembers: a history
// that went back (package history). Without the column (migration 0007 not
// applied) or the privilege the generation stays unknown, with a warning:
// the relay still verifies a kept position by its transaction.
func raiseGeneration(ctx context.Context, conn *pgx.Conn, registry, slot string) (Registry, error) {
	var r Registry
	var lsn, xid *string
	err := conn.QueryRow(ctx, "UPDATE "+registry+" SET generation = generation + 1 WHERE slot_name = $1 RETURNING generation - 1, generation, created_lsn::text, created_xid::text",
		slot).Scan(&r.Raised, &r.Generation, &lsn, &xid)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, nil // registered by another relay's race, or not at all: nothing to raise
	case errors.As(err, &pgErr) && pgErr.Code == "42703": // undefined_column
		r.Warning = fmt.Sprintf("slot registry %s has no generation column: a restore of the database is found only by the transaction at a kept position; run `outbox-relay migrate` (migration 0007)", registry)
		return r, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		r.Warning = fmt.Sprintf("cannot raise the generation in slot registry %s (%s): a restore of the database is found only by the transaction at a kept position; GRANT UPDATE ON %s TO the relay's role", registry, pgErr.Message, registry)
		return r, nil
	case err != nil:
		return r, fmt.Errorf("raise the generation of slot %q in %s: %w", slot, registry, err)
	}
	if lsn != nil {
		if r.SlotLSN, err = pglogrepl.ParseLSN(*lsn); err != nil {
			return r, fmt.Errorf("slot registry %s: created_lsn %q of slot %q: %w", registry, *lsn, slot, err)
		}
	}
	if xid != nil {
		if r.SlotXid, err = strconv.ParseUint(*xid, 10, 64); err != nil {
			return r, fmt.Errorf("slot registry %s: created_xid %q of slot %q: %w", registry, *xid, slot, err)
		}
	}
	return r, nil
}

// vanishedCause says why a registered slot is missing, as far as the
// server's history tells: IDENTIFY_SYSTEM's timeline, and prev, the history
// the stream last streamed on.
func vanishedCause(ctx context.Context, cfg Config, prev pg.Identity) string {
	const noFailoverSlot = "a standby has a logical slot only if it is a failover slot synced to it: PostgreSQL 17+, postgres.slot_failover and the standby settings in docs/failover.md"
	cur, err := pg.IdentifySystem(ctx, cfg.URL)
	if err != nil {
		return "dropped, or lost in a failover: " + noFailoverSlot
	}
	return missingSlotCause(prev, cur) + "; " + noFailoverSlot
}

// missingSlotCause explains a missing slot on cur's history, prev being the
// one the relay last streamed on (zero: unknown).
func missingSlotCause(prev, cur pg.Identity) string {
	switch {
	case prev != (pg.Identity{}) && prev != cur:
		return fmt.Sprintf("the server history changed since the relay last streamed, from %s to %s: a failover to a server without the slot", prev, cur)
	case cur.Timeline > 1:
		return fmt.Sprintf("dropped, or lost in a failover: this server is on %s, so it was promoted from a standby (or restored from a backup) at least once", cur)
	default:
		return fmt.Sprintf("dropped: this server is on %s, it was never promoted", cur)
	}
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
