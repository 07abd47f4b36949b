package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/internal/pg"
)

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
	conn, err := pg.ConnectReplication(ctx, cfg.URL, nil)
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
// gated: postgres.standby_slots holds publishing back instead, so an empty
// setting is no risk.
func standbyWarnings(ctx context.Context, conn *pgx.Conn, gated bool) ([]string, error) {
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
	return failoverWarnings(setting, physical, gated), nil
}

// failoverWarnings judges synchronized_standby_slots (setting) against the
// server's physical slots; gated as for standbyWarnings.
func failoverWarnings(setting string, physical []string, gated bool) []string {
	var names []string
	for _, n := range strings.Split(setting, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 && gated {
		return nil
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

// createReplicationSlot creates the slot on a replication connection of
// its own. While it waits (for the transactions holding an xid, see
// slotWatch) a watch logs what it waits for on log; when ctx ends first,
// the creating backend is sent a cancel request (else it would go on
// waiting, holding the half-made slot under its name, and could still
// make it later) and the error says what it waited for.
func createReplicationSlot(ctx context.Context, cfg Config, log zerolog.Logger) error {
	conn, err := pg.ConnectReplication(ctx, cfg.URL, nil)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	w := &slotWatch{url: cfg.URL, slot: cfg.Slot, pid: int32(conn.PID()), start: time.Now(), log: log}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		w.run(wctx)
	}()
	defer func() {
		stopWatch()
		<-watched
	}()
	_, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createSlotCommand(cfg.Slot, cfg.SlotFailover)))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
		return nil
	}
	if err != nil && ctx.Err() != nil {
		// Here, not on a goroutine: the caller may exit right after.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = conn.CancelRequest(cctx) // best effort: the backend may be gone already
		cancel()
		return w.gaveUp(err)
	}
	if err != nil {
		return fmt.Errorf("create slot %q: %w", cfg.Slot, err)
	}
	return nil
}
