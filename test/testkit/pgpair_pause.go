package testkit

import (
	"context"
	"fmt"
	"syscall"

	"github.com/jackc/pglogrepl"
)

// PauseWALReceiver stops the standby's WAL receiver (SIGSTOP), so the
// standby flushes nothing more while the primary goes on: its slot PairSlot
// stays active with restart_lsn where it was. resume (SIGCONT) lets it
// catch up; call it before the primary's wal_sender_timeout (60 s) passes,
// and at the latest at cleanup (it is idempotent).
func (p *PGPair) PauseWALReceiver(ctx context.Context) (resume func() error, err error) {
	var pid int
	if err := p.query(ctx, p.Standby, "SELECT coalesce(max(pid), 0) FROM pg_stat_wal_receiver", &pid); err != nil {
		return nil, fmt.Errorf("pg pair: find the standby's WAL receiver: %w", err)
	}
	if pid == 0 {
		return nil, fmt.Errorf("pg pair: the standby has no WAL receiver\n%s", p.LogTail(p.Standby, 2000))
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("pg pair: SIGSTOP WAL receiver %d: %w", pid, err)
	}
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			return fmt.Errorf("pg pair: SIGCONT WAL receiver %d: %w", pid, err)
		}
		return nil
	}, nil
}

// StandbyFlushed is the restart_lsn of the primary's physical slot
// PairSlot: how far the standby has flushed, as it last reported.
func (p *PGPair) StandbyFlushed(ctx context.Context) (pglogrepl.LSN, error) {
	var s string
	if err := p.query(ctx, p.Primary, "SELECT coalesce(restart_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = '"+PairSlot+"'", &s); err != nil {
		return 0, fmt.Errorf("pg pair: read slot %s: %w", PairSlot, err)
	}
	return pglogrepl.ParseLSN(s)
}
