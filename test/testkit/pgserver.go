package testkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// Freezing a running server: every process of the cluster (the postmaster
// and all its descendants: backends, walsenders, background workers)
// stopped with SIGSTOP, so nothing writes to the data dir while it is
// copied. A copy taken frozen is crash-consistent, like a filesystem or VM
// snapshot of a server that was never stopped; the server's clients keep
// their connections (they only see it silent for the freeze's length).

// Freeze stops every process of the running server s with SIGSTOP: the
// postmaster first (it forks no more), then its descendants, until a scan
// finds none left running; it returns once each is stopped (state T). It
// returns how many it stopped. On an error what it stopped is continued.
// Thaw continues them; call it also when the test fails (t.Cleanup): a
// stopped postmaster ignores pg_ctl stop.
func (p *PGPair) Freeze(s *PGServer) (int, error) {
	pm, err := postmasterPID(s)
	if err != nil {
		return 0, err
	}
	if p.frozen == nil {
		p.frozen = map[*PGServer][]int{}
	}
	stopped := map[int]bool{}
	stop := func(pid int) error {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pg pair: freeze the %s: SIGSTOP %d: %w", s.Name, pid, err)
		}
		stopped[pid] = true
		p.frozen[s] = append(p.frozen[s], pid)
		return nil
	}
	if err := stop(pm); err != nil {
		return 0, err
	}
	for quiet := 0; quiet < 2; { // two scans in a row with nothing new
		kids, err := descendants(pm)
		if err != nil {
			_ = p.Thaw(s)
			return 0, err
		}
		quiet++
		for _, pid := range kids {
			if !stopped[pid] {
				quiet = 0
				if err := stop(pid); err != nil {
					_ = p.Thaw(s)
					return 0, err
				}
			}
		}
	}
	// SIGSTOP takes effect asynchronously (a process in the kernel stops
	// on its way out): wait until each is stopped or gone.
	deadline := time.Now().Add(5 * time.Second)
	for pid := range stopped {
		for {
			st, err := procState(pid)
			if err != nil || st == 'T' || st == 't' || st == 'Z' {
				break
			}
			if time.Now().After(deadline) {
				_ = p.Thaw(s)
				return 0, fmt.Errorf("pg pair: freeze the %s: process %d still in state %c after SIGSTOP", s.Name, pid, st)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return len(stopped), nil
}

// Thaw continues (SIGCONT) every process Freeze stopped in s, and any
// process of its tree that is stopped, and checks that none stays
// stopped. It does nothing to a server not frozen; safe to call twice.
func (p *PGPair) Thaw(s *PGServer) error {
	pids := p.frozen[s]
	delete(p.frozen, s)
	if pm, err := postmasterPID(s); err == nil {
		if kids, err := descendants(pm); err == nil {
			pids = append(pids, kids...)
		}
	}
	var errs []error
	// Children first, the postmaster (first in the list) last: it finds
	// its children running when it runs again.
	for i := len(pids) - 1; i >= 0; i-- {
		if err := syscall.Kill(pids[i], syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("SIGCONT %d: %w", pids[i], err))
		}
	}
	for _, pid := range pids {
		var st byte
		for range 100 {
			var err error
			if st, err = procState(pid); err != nil || st != 'T' {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if st == 'T' {
			errs = append(errs, fmt.Errorf("process %d still stopped after SIGCONT", pid))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pg pair: thaw the %s: %w", s.Name, err)
	}
	return nil
}

// HotSnapshot copies the data dir of the running server s to a new dir
// beside it named name, as a filesystem or VM snapshot of a running
// server holds it: s is frozen (Freeze), its data dir copied (cp -a), and
// thawed, whatever happened. The copy has no postmaster.pid (a restored
// machine has none of the processes it names). It returns the copy's path,
// how long s was frozen and how many processes were.
func (p *PGPair) HotSnapshot(ctx context.Context, s *PGServer, name string) (dir string, frozen time.Duration, procs int, err error) {
	dst := filepath.Join(p.dir, name)
	began := time.Now()
	if procs, err = p.Freeze(s); err != nil {
		return "", 0, 0, err
	}
	defer func() {
		frozen = time.Since(began)
		if terr := p.Thaw(s); terr != nil {
			err = errors.Join(err, terr)
		}
	}()
	if out, cerr := exec.CommandContext(ctx, "cp", "-a", s.Data, dst).CombinedOutput(); cerr != nil {
		return "", 0, procs, fmt.Errorf("pg pair: cp -a %s %s (the %s frozen): %w\n%s", s.Data, dst, s.Name, cerr, out)
	}
	if err := os.Remove(filepath.Join(dst, "postmaster.pid")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", 0, procs, err
	}
	return dst, 0, procs, nil
}

// postmasterPID is the first line of the running server's postmaster.pid.
func postmasterPID(s *PGServer) (int, error) {
	b, err := os.ReadFile(filepath.Join(s.Data, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pg pair: the %s does not run: %w", s.Name, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pg pair: the %s's postmaster.pid starts with %q", s.Name, line)
	}
	return pid, nil
}

// procStat reads the state and the parent pid of pid from /proc/PID/stat
// ("pid (comm) state ppid ...", comm may hold spaces and parentheses).
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	var f []string
	if i >= 0 {
		f = strings.Fields(string(b[i+1:]))
	}
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: cannot parse %q", pid, b)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

func procState(pid int) (byte, error) {
	st, _, err := procStat(pid)
	return st, err
}

// descendants lists the processes under pid (children, theirs, ...).
func descendants(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, err := procStat(c); err == nil {
			children[pp] = append(children[pp], c)
		}
	}
	var out []int
	for q := []int{pid}; len(q) > 0; q = q[1:] {
		for _, c := range children[q[0]] {
			out = append(out, c)
			q = append(q, c)
		}
	}
	return out, nil
}
