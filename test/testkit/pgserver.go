package testkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Single-server operations on a PGPair's servers, for tests that take a
// server down and bring it (or a copy of it) back: a standby cut off from
// its primary, a data directory snapshot and its restore.

// StopServer stops s with pg_ctl stop -m mode (smart, fast, immediate);
// its data dir stays.
func (p *PGPair) StopServer(ctx context.Context, s *PGServer, mode string) error {
	if err := p.pgctl(ctx, s, "-m", mode, "stop"); err != nil {
		return fmt.Errorf("pg pair: stop the %s (-m %s): %w", s.Name, mode, err)
	}
	return nil
}

// StartServer starts s again from its data dir, on a new free port (Addr
// changes: re-point a proxy at it). A standby comes back as a standby and
// tries to stream from its primary_conninfo.
func (p *PGPair) StartServer(ctx context.Context, s *PGServer) error {
	return p.start(ctx, s)
}

// Snapshot copies the data dir of s, which must be stopped, to a new dir
// beside it named name (cp -a: ownership and modes kept), as a filesystem
// or VM snapshot would hold it: the WAL, the control file and the
// replication slots included. It returns the copy's path.
func (p *PGPair) Snapshot(ctx context.Context, s *PGServer, name string) (string, error) {
	if _, err := os.Stat(filepath.Join(s.Data, "postmaster.pid")); err == nil {
		return "", fmt.Errorf("pg pair: snapshot of the %s: the server still runs (postmaster.pid)", s.Name)
	}
	dst := filepath.Join(p.dir, name)
	if out, err := exec.CommandContext(ctx, "cp", "-a", s.Data, dst).CombinedOutput(); err != nil {
		return "", fmt.Errorf("pg pair: cp -a %s %s: %w\n%s", s.Data, dst, err, out)
	}
	return dst, nil
}

// Restore replaces the data dir of s, which must be stopped, by a copy of
// snapshot (Snapshot's result); StartServer then starts the restored
// server: same system id, same timeline, its WAL and slots as they were.
func (p *PGPair) Restore(ctx context.Context, s *PGServer, snapshot string) error {
	if _, err := os.Stat(filepath.Join(s.Data, "postmaster.pid")); err == nil {
		return fmt.Errorf("pg pair: restore the %s: the server still runs (postmaster.pid)", s.Name)
	}
	if err := os.RemoveAll(s.Data); err != nil {
		return fmt.Errorf("pg pair: remove the %s's data dir: %w", s.Name, err)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", snapshot, s.Data).CombinedOutput(); err != nil {
		return fmt.Errorf("pg pair: cp -a %s %s: %w\n%s", snapshot, s.Data, err, out)
	}
	return nil
}

// Timeline is the timeline s writes WAL on (its current WAL file's).
func (p *PGPair) Timeline(ctx context.Context, s *PGServer) (int, error) {
	var name string
	if err := p.query(ctx, s, "SELECT pg_walfile_name(pg_current_wal_lsn())", &name); err != nil {
		return 0, fmt.Errorf("pg pair: timeline of the %s: %w", s.Name, err)
	}
	tl, err := strconv.ParseInt(name[:8], 16, 32)
	return int(tl), err
}
