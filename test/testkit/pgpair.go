package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PGPairOptions configures StartPGPair.
type PGPairOptions struct {
	// BinDir holds the server's initdb, pg_ctl and postgres; "" takes
	// OUTBOX_TEST_PG_BINDIR (the version test/services.sh runs), then
	// Debian's PostgreSQL 15.
	BinDir string
	// SyncCommit makes the standby synchronous (synchronous_standby_names):
	// a commit the writer saw is on the standby, so a failover loses no
	// committed row and every lost event is the relay's doing.
	SyncCommit bool
	// FailoverSlots (PostgreSQL 17+) sets synchronized_standby_slots on the
	// primary to the standby's physical slot and sync_replication_slots on
	// the standby, so slots created with FAILOVER are synced to it.
	FailoverSlots bool
	// Dir is the parent of the clusters' temp dir; "" is $OUTBOX_TEST_TMP,
	// else os.TempDir(). It must be traversable by the postgres OS user.
	Dir string
	// PrimaryOnly starts the primary alone: no base backup, no standby (a
	// throwaway single server; Standby is set but never started).
	PrimaryOnly bool
	// MaxPreparedXacts is the servers' max_prepared_transactions (0, the
	// default, allows no PREPARE TRANSACTION). A standby copies it.
	MaxPreparedXacts int
}

// PGServer is one server of a PGPair.
type PGServer struct {
	Name string // "primary" or "standby"
	Data string
	Port int
	Log  string
}

// Addr is host:port of the server.
func (s *PGServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// PGPair is a primary and a streaming hot standby, both started by the test
// on free loopback ports in one temp dir, run as the postgres OS user when
// the test runs as root. The role "relay" (superuser, replication) logs in
// with Password over TCP; database "outbox" exists.
type PGPair struct {
	Primary, Standby *PGServer
	Major            int    // server major version, e.g. 15
	BinDir           string // server binaries
	Password         string
	BaseBackup       string // how the standby was made: "pg_basebackup" or "pg_backup_start"
	dir              string
	opts             PGPairOptions
	pgUser           *user.User          // postgres OS user when running as root, else nil
	frozen           map[*PGServer][]int // Freeze's stopped processes, postmaster first
}

// PairSlot is the primary's physical slot the standby streams from.
const PairSlot = "standby_slot"

// PairStandbyName is the standby's application_name (synchronous_standby_names).
const PairStandbyName = "standby"

// StartPGPair initdbs a primary (wal_level=logical), takes a base backup of
// it into a standby (pg_basebackup -R when one of the server's major version
// is installed, else the low-level pg_backup_start/pg_backup_stop API and a
// file copy), starts the standby with hot_standby_feedback and the physical
// slot PairSlot, and waits until it streams. Every failure is an error with
// the log to read; the caller must Close the pair (also after an error that
// returned a non-nil pair).
func StartPGPair(ctx context.Context, opts PGPairOptions) (*PGPair, error) {
	bin := opts.BinDir
	if bin == "" {
		bin = os.Getenv("OUTBOX_TEST_PG_BINDIR")
	}
	if bin == "" {
		if s, err := LoadServices(); err == nil {
			bin = s.Get("OUTBOX_TEST_PG_BINDIR")
		}
	}
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("pg pair: %s missing in %s (set OUTBOX_TEST_PG_BINDIR): %w", b, bin, err)
		}
	}
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("pg pair: %s/postgres --version: %w", bin, err)
	}
	major, err := parseMajor(string(out))
	if err != nil {
		return nil, fmt.Errorf("pg pair: %w", err)
	}
	if opts.FailoverSlots && major < 17 {
		return nil, fmt.Errorf("pg pair: failover slots need PostgreSQL 17+, %s is %d", bin, major)
	}
	if opts.Dir == "" {
		opts.Dir = os.Getenv("OUTBOX_TEST_TMP") // test/services.sh's knob; "" is os.TempDir()
	}
	dir, err := os.MkdirTemp(opts.Dir, "outbox-pgpair.")
	if err != nil {
		return nil, fmt.Errorf("pg pair: %w", err)
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	p := &PGPair{Major: major, BinDir: bin, Password: hex.EncodeToString(pw), dir: dir, opts: opts,
		Primary: &PGServer{Name: "primary", Data: filepath.Join(dir, "primary"), Log: filepath.Join(dir, "primary.log")},
		Standby: &PGServer{Name: "standby", Data: filepath.Join(dir, "standby"), Log: filepath.Join(dir, "standby.log")}}
	if os.Geteuid() == 0 {
		if p.pgUser, err = user.Lookup("postgres"); err != nil {
			return p, fmt.Errorf("pg pair: running as root needs the postgres OS user: %w", err)
		}
	}
	if err := p.chown(dir); err != nil {
		return p, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return p, err
	}
	if err := p.initPrimary(ctx); err != nil {
		return p, err
	}
	if opts.PrimaryOnly {
		return p, nil
	}
	if err := p.makeStandby(ctx); err != nil {
		return p, err
	}
	return p, nil
}

var versionRe = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

func parseMajor(version string) (int, error) {
	m := versionRe.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("cannot read the major version from %q", strings.TrimSpace(version))
	}
	return strconv.Atoi(m[1])
}

// URL is the relay role's URL of s, database outbox.
func (p *PGPair) URL(s *PGServer) string { return p.URLAt(s.Addr()) }

// URLAt is the relay role's URL of database outbox at addr (a proxy).
func (p *PGPair) URLAt(addr string) string {
	return fmt.Sprintf("postgres://relay:%s@%s/outbox?sslmode=disable&connect_timeout=5", p.Password, addr)
}

// Dir is the pair's temp dir (data dirs and logs).
func (p *PGPair) Dir() string { return p.dir }

// chown gives path to the postgres OS user when running as root.
func (p *PGPair) chown(path string) error {
	if p.pgUser == nil {
		return nil
	}
	uid, _ := strconv.Atoi(p.pgUser.Uid)
	gid, _ := strconv.Atoi(p.pgUser.Gid)
	return filepath.WalkDir(path, func(f string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(f, uid, gid)
	})
}

// asPG runs a command as the postgres OS user (as is when not root), in
// the pair's dir; the error carries the output.
func (p *PGPair) asPG(ctx context.Context, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), env...)
	if p.pgUser != nil {
		uid, _ := strconv.Atoi(p.pgUser.Uid)
		gid, _ := strconv.Atoi(p.pgUser.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(cmd.Env, "HOME="+p.pgUser.HomeDir, "USER=postgres")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(redactArgs(args), " "), err, Tail(string(out), 2000))
	}
	return nil
}

func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.Contains(a, "password=") {
			a = "<conninfo>"
		}
		out[i] = a
	}
	return out
}

func (p *PGPair) writeFile(path, text string, appendTo bool) error {
	flag := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flag = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, text); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return p.chown(path)
}

func freePort() (int, error) {
	addr, err := FreeAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	return strconv.Atoi(port)
}

func (p *PGPair) initPrimary(ctx context.Context) error {
	s := p.Primary
	pwfile := filepath.Join(p.dir, "pwfile")
	if err := p.writeFile(pwfile, p.Password+"\n", false); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if err := p.asPG(ctx, nil, filepath.Join(p.BinDir, "initdb"), "-D", s.Data, "-U", "postgres", "--pwfile="+pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("pg pair: initdb: %w", err)
	}
	hba := `local all all trust
local replication all trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
`
	if err := p.writeFile(filepath.Join(s.Data, "pg_hba.conf"), hba, false); err != nil {
		return err
	}
	conf := fmt.Sprintf(`listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
password_encryption = 'scram-sha-256'
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
max_connections = 60
shared_buffers = 32MB
wal_sender_timeout = 60s
hot_standby = on
hot_standby_feedback = on
fsync = off
synchronous_commit = on
log_min_messages = warning
logging_collector = off
`, p.dir)
	if p.opts.FailoverSlots {
		conf += "synchronized_standby_slots = '" + PairSlot + "'\n"
	}
	if p.opts.MaxPreparedXacts > 0 {
		conf += fmt.Sprintf("max_prepared_transactions = %d\n", p.opts.MaxPreparedXacts)
	}
	if err := p.writeFile(filepath.Join(s.Data, "postgresql.conf"), "include_if_exists = 'pair.conf'\n", true); err != nil {
		return err
	}
	if err := p.writeFile(filepath.Join(s.Data, "pair.conf"), conf, false); err != nil {
		return err
	}
	if err := p.start(ctx, s); err != nil {
		return err
	}
	// Over the unix socket (trust): the relay's role and database, and
	// the standby's physical slot, reserving WAL from now on.
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", p.dir, s.Port))
	if err != nil {
		return fmt.Errorf("pg pair: connect to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		"CREATE ROLE relay WITH LOGIN SUPERUSER REPLICATION PASSWORD '" + p.Password + "'",
		"CREATE DATABASE outbox OWNER relay",
		"SELECT pg_create_physical_replication_slot('" + PairSlot + "', true)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pg pair: primary: %s: %w", strings.SplitN(q, " PASSWORD", 2)[0], err)
		}
	}
	return nil
}

// start starts s on a free port (retried on another one if taken).
func (p *PGPair) start(ctx context.Context, s *PGServer) error {
	var err error
	for range 3 {
		if s.Port, err = freePort(); err != nil {
			return err
		}
		if err = p.writeFile(filepath.Join(s.Data, "port.conf"), fmt.Sprintf("port = %d\n", s.Port), false); err != nil {
			return err
		}
		if err = p.ensureInclude(s, "port.conf"); err != nil {
			return err
		}
		if err = p.pgctl(ctx, s, "start"); err == nil {
			return nil
		}
		if log, _ := os.ReadFile(s.Log); !strings.Contains(string(log), "could not bind") && !strings.Contains(string(log), "Address already in use") {
			break
		}
	}
	return fmt.Errorf("pg pair: start %s: %w\n%s", s.Name, err, p.LogTail(s, 3000))
}

// ensureInclude makes postgresql.conf of s include name (after everything
// else, so it wins over earlier settings).
func (p *PGPair) ensureInclude(s *PGServer, name string) error {
	path := filepath.Join(s.Data, "postgresql.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	line := "include_if_exists = '" + name + "'\n"
	if strings.Contains(string(b), line) {
		return nil
	}
	return p.writeFile(path, line, true)
}

func (p *PGPair) pgctl(ctx context.Context, s *PGServer, args ...string) error {
	switch args[0] {
	case "start":
		args = []string{"-D", s.Data, "-l", s.Log, "-w", "-t", "120", "start"}
	default:
		args = append([]string{"-D", s.Data, "-w", "-t", "120"}, args...)
	}
	return p.asPG(ctx, nil, filepath.Join(p.BinDir, "pg_ctl"), args...)
}

// LogTail is the end of s's server log.
func (p *PGPair) LogTail(s *PGServer, n int) string {
	b, _ := os.ReadFile(s.Log)
	return fmt.Sprintf("----- %s log %s -----\n%s", s.Name, s.Log, Tail(string(b), n))
}

// basebackupBin is a pg_basebackup that can copy this server: of its major
// version or a newer one (pg_basebackup refuses a newer server; Debian's 15
// copies 14). The zonky builds have none.
func (p *PGPair) basebackupBin() string {
	dirs := []string{p.BinDir, fmt.Sprintf("/usr/lib/postgresql/%d/bin", p.Major)}
	more, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append(dirs, more...) {
		bb := filepath.Join(d, "pg_basebackup")
		out, err := exec.Command(bb, "--version").Output()
		if err != nil {
			continue
		}
		if m := regexp.MustCompile(`\) (\d+)`).FindStringSubmatch(string(out)); m != nil {
			if v, _ := strconv.Atoi(m[1]); v >= p.Major {
				return bb
			}
		}
	}
	return ""
}

func (p *PGPair) makeStandby(ctx context.Context) error {
	s := p.Standby
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=relay password=%s application_name=%s dbname=outbox",
		p.Primary.Port, p.Password, PairStandbyName)
	if bb := p.basebackupBin(); bb != "" {
		p.BaseBackup = "pg_basebackup"
		if err := p.asPG(ctx, nil, bb, "-D", s.Data, "-d", conninfo, "-R", "-X", "stream", "-S", PairSlot, "-c", "fast", "--no-sync"); err != nil {
			return fmt.Errorf("pg pair: %w", err)
		}
	} else {
		p.BaseBackup = "pg_backup_start"
		if err := p.copyBackup(ctx); err != nil {
			return err
		}
	}
	// postgresql.auto.conf is read last: these win over what the copy of
	// the primary's configuration says. A promoted standby must not wait
	// for a synchronous standby or a standby slot it does not have.
	conf := fmt.Sprintf(`
unix_socket_directories = '%s'
primary_conninfo = '%s'
primary_slot_name = '%s'
hot_standby = on
hot_standby_feedback = on
synchronous_standby_names = ''
`, p.dir, conninfo, PairSlot)
	if p.opts.FailoverSlots {
		conf += "sync_replication_slots = on\nsynchronized_standby_slots = ''\n"
	}
	if err := p.writeFile(filepath.Join(s.Data, "postgresql.auto.conf"), conf, true); err != nil {
		return err
	}
	if err := p.writeFile(filepath.Join(s.Data, "standby.signal"), "", false); err != nil {
		return err
	}
	if err := p.start(ctx, s); err != nil {
		return err
	}
	if err := p.WaitStreaming(ctx, 60*time.Second); err != nil {
		return err
	}
	if !p.opts.SyncCommit {
		return nil
	}
	// Only now: with no standby connected, every commit would wait.
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", p.dir, p.Primary.Port))
	if err != nil {
		return fmt.Errorf("pg pair: connect to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '" + PairStandbyName + "'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pg pair: primary: %s: %w", q, err)
		}
	}
	return nil
}

// copyBackup is a base backup without pg_basebackup (none of the server's
// major version installed): pg_backup_start, a file copy of the running
// primary, pg_backup_stop's backup_label. The standby fetches the WAL from
// the backup's start through the physical slot, which reserved it.
func (p *PGPair) copyBackup(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", p.dir, p.Primary.Port))
	if err != nil {
		return fmt.Errorf("pg pair: connect to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_backup_start('outbox-pgpair', true)"); err != nil {
		return fmt.Errorf("pg pair: pg_backup_start: %w", err)
	}
	if err := copyDataDir(p.Primary.Data, p.Standby.Data); err != nil {
		return fmt.Errorf("pg pair: copy the primary's data dir: %w", err)
	}
	var label, spcmap string
	if err := conn.QueryRow(ctx, "SELECT labelfile, coalesce(spcmapfile, '') FROM pg_backup_stop(false)").Scan(&label, &spcmap); err != nil {
		return fmt.Errorf("pg pair: pg_backup_stop: %w", err)
	}
	if err := os.WriteFile(filepath.Join(p.Standby.Data, "backup_label"), []byte(label), 0o600); err != nil {
		return err
	}
	if spcmap != "" {
		if err := os.WriteFile(filepath.Join(p.Standby.Data, "tablespace_map"), []byte(spcmap), 0o600); err != nil {
			return err
		}
	}
	return p.chown(p.Standby.Data)
}

// copyDataDir copies a running data dir as a base backup does: without
// the WAL, the slots, the pid file and the temporary files, tolerating
// files that vanish during the copy.
func copyDataDir(src, dst string) error {
	skipContents := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true,
		"pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true}
	skipFiles := map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		skipped := skipContents[filepath.Dir(rel)] // e.g. pg_wal/000000010000000000000001, pg_replslot/standby_slot
		if d.IsDir() {
			if skipped && !(filepath.Dir(rel) == "pg_wal" && d.Name() == "archive_status") {
				return fs.SkipDir
			}
			return os.MkdirAll(target, 0o700)
		}
		if skipped || skipFiles[rel] || strings.HasPrefix(d.Name(), "pgsql_tmp") {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
}

// Conn connects to database db of s as the relay role.
func (p *PGPair) Conn(ctx context.Context, s *PGServer, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, fmt.Sprintf("postgres://relay:%s@%s/%s?sslmode=disable&connect_timeout=5", p.Password, s.Addr(), db))
}

// query runs q on s and scans one row into dest.
func (p *PGPair) query(ctx context.Context, s *PGServer, q string, dest ...any) error {
	conn, err := p.Conn(ctx, s, "outbox")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, q).Scan(dest...)
}

// WaitStreaming waits until the standby streams from the primary.
func (p *PGPair) WaitStreaming(ctx context.Context, d time.Duration) error {
	var state string
	err := Poll(d, 100*time.Millisecond, func() (bool, error) {
		err := p.query(ctx, p.Primary, "SELECT coalesce(max(state), '') FROM pg_stat_replication WHERE application_name = '"+PairStandbyName+"'", &state)
		return err == nil && state == "streaming", nil
	})
	if err != nil {
		return fmt.Errorf("pg pair: standby not streaming after %s (state %q): %w\n%s\n%s", d, state, err, p.LogTail(p.Standby, 2000), p.LogTail(p.Primary, 1000))
	}
	return nil
}

// WaitReplayed waits until the standby replayed everything the primary
// wrote so far.
func (p *PGPair) WaitReplayed(ctx context.Context, d time.Duration) error {
	var want string
	if err := p.query(ctx, p.Primary, "SELECT pg_current_wal_lsn()::text", &want); err != nil {
		return fmt.Errorf("pg pair: read the primary's WAL position: %w", err)
	}
	var ok bool
	err := Poll(d, 100*time.Millisecond, func() (bool, error) {
		err := p.query(ctx, p.Standby, "SELECT pg_last_wal_replay_lsn() >= '"+want+"'::pg_lsn", &ok)
		return err == nil && ok, nil
	})
	if err != nil {
		return fmt.Errorf("pg pair: standby did not replay up to %s: %w", want, err)
	}
	return nil
}

// SlotOnStandby reads the standby's copy of a logical slot (PostgreSQL
// 17+): present, synced (by the slot sync worker) and not temporary (a
// synced slot is temporary until it caught up: promotion drops it).
func (p *PGPair) SlotOnStandby(ctx context.Context, slot string) (synced bool, confirmed string, err error) {
	var n int
	if err := p.query(ctx, p.Standby, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+slot+"' AND synced AND NOT temporary AND invalidation_reason IS NULL", &n); err != nil {
		return false, "", err
	}
	if n == 0 {
		return false, "", nil
	}
	err = p.query(ctx, p.Standby, "SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = '"+slot+"'", &confirmed)
	return true, confirmed, err
}

// StopPrimary stops the primary (mode immediate: a crash as far as
// PostgreSQL is concerned; its data dir stays for a post-mortem).
func (p *PGPair) StopPrimary(ctx context.Context, mode string) error {
	if err := p.pgctl(ctx, p.Primary, "-m", mode, "stop"); err != nil {
		return fmt.Errorf("pg pair: stop the primary: %w", err)
	}
	return nil
}

// Promote promotes the standby (pg_ctl promote -w: returns once it accepts
// writes).
func (p *PGPair) Promote(ctx context.Context) error {
	if err := p.pgctl(ctx, p.Standby, "promote"); err != nil {
		return fmt.Errorf("pg pair: promote the standby: %w\n%s", err, p.LogTail(p.Standby, 2000))
	}
	var rec bool
	if err := p.query(ctx, p.Standby, "SELECT pg_is_in_recovery()", &rec); err != nil || rec {
		return fmt.Errorf("pg pair: standby still in recovery (%v) after promote: %w", rec, err)
	}
	return nil
}

// Close stops both servers (immediate) and removes the temp dir; keep, when
// true, leaves the dir (logs, data) for a post-mortem.
func (p *PGPair) Close(keep bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	for _, s := range []*PGServer{p.Standby, p.Primary} {
		if _, err := os.Stat(filepath.Join(s.Data, "postmaster.pid")); err != nil {
			continue
		}
		if err := p.pgctl(ctx, s, "-m", "immediate", "stop"); err != nil {
			errs = append(errs, err)
		}
	}
	if !keep && len(errs) == 0 {
		errs = append(errs, os.RemoveAll(p.dir))
	}
	return errors.Join(errs...)
}
