package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/pg"
)

// restart is why a session's start discards the in-memory watermark.
type restart uint8

const (
	// keepWatermark: the watermark is at or behind the slot; it is raised
	// to the slot's confirmed position (Progress.AdvanceIdle).
	keepWatermark restart = iota
	// slotBehind: the same history, but the slot's confirmed position is
	// behind the watermark: the last status updates never reached the
	// server or were lost in a crash, or an operator put the slot back.
	slotBehind
	// historyChanged: the server is on another history (system id or
	// timeline differs from the previous session's).
	historyChanged
)

func (r restart) String() string {
	return [...]string{"keep watermark", "slot behind", "history changed"}[r]
}

// startFrom decides where a session starts and whether the watermark acked
// on prev's history (zero: unknown) is discarded (Progress.Reset) before a
// session on cur's. The start is always the slot's confirmed position: it
// is the only position the server vouches for on its own history. A
// watermark ahead of it is never trusted, even on the same system id and
// timeline: the events between them were acked, but on a server that went
// back (a slot restored from backup or copied from an older one, a cluster
// restored from a snapshot without a new timeline) the WAL there may hold
// other transactions, and starting at the watermark would skip them. The
// progress skips what it had acked itself only after checking the server's
// history and seeing its last acked transaction again (Progress.Session,
// package history).
func startFrom(prev, cur pg.Identity, watermark, confirmed pglogrepl.LSN) (start pglogrepl.LSN, reset restart) {
	switch {
	case prev != (pg.Identity{}) && prev != cur:
		return confirmed, historyChanged
	case watermark > confirmed:
		return confirmed, slotBehind
	default:
		return confirmed, keepWatermark
	}
}

// identify reads the server's identity and the slot's confirmed position on
// the replication connection, the one START_REPLICATION will use, so both
// come from the server that will stream (not one a failover replaced since
// pgsetup.Prepare read the slot).
func identify(ctx context.Context, conn *pgconn.PgConn, slot string) (id pg.Identity, confirmed, serverEnd pglogrepl.LSN, err error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return pg.Identity{}, 0, 0, fmt.Errorf("identify system: %w", err)
	}
	id = pg.Identity{SystemID: sys.SystemID, Timeline: sys.Timeline}
	// slot matches [a-z0-9_]{1,63} (Config.Validate): safe as a literal. A
	// replication connection takes only simple queries.
	res, err := conn.Exec(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '"+slot+"'").ReadAll()
	if err != nil {
		return id, 0, 0, fmt.Errorf("read confirmed_flush_lsn of slot %q: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || res[0].Rows[0][0] == nil {
		return id, 0, 0, fmt.Errorf("read confirmed_flush_lsn of slot %q on %s: slot missing or without a confirmed position", slot, id)
	}
	lsn, err := pglogrepl.ParseLSN(string(res[0].Rows[0][0]))
	if err != nil {
		return id, 0, 0, fmt.Errorf("parse confirmed_flush_lsn of slot %q: %w", slot, err)
	}
	return id, lsn, sys.XLogPos, nil
}
