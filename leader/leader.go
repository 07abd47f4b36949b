// Package leader makes one relay instance per slot the leader, with a lease
// kept in PostgreSQL itself: no extra infrastructure.
//
// The lease is two things on one dedicated connection:
//
//   - a session advisory lock, which PostgreSQL releases the moment the
//     holder's connection ends (process killed, connection reset): a
//     standby polling pg_try_advisory_lock takes over within a poll
//     interval;
//   - a row (slot, holder, epoch, renewed_at) the leader renews every
//     renew interval. A leader that stalls with its sockets open (SIGSTOP,
//     GC pause, frozen VM, blackholed network) keeps the lock but stops
//     renewing; a standby that sees renewed_at older than the TTL, by the
//     database's own clock, terminates the backend that holds the
//     advisory lock (found in pg_locks, never by pid or application name
//     alone, never its own) and the slot's walsender (pg_terminate_backend),
//     in one statement that terminates nothing when the row is fresh. At
//     its next poll the lock is free: it takes the lock and the row with
//     epoch+1, and ends any walsender still on the slot.
//
// Fencing needs the right to terminate the other instances' backends. Each
// new lease connection checks it against the current lock holder and says
// so at once when it is missing (log, /role's can_fence,
// outbox_relay_leader_can_fence), not at takeover.
//
// The leader fences itself too: its term ends when its lease connection
// ends (before the lock can go with it), when a renewal fails or finds the
// row with another holder or epoch or stale by the database's clock, or
// when its last successful renewal was sent longer ago than the TTL less a
// tenth, by its monotonic clock, which keeps running while the process is
// stopped (Valid turns false at that moment, before the term has wound
// down). So its term always ends before a standby can take over: by the
// lock, freed only with its session, or by fencing, only once the row is
// stale. The replication stream asks Valid before every status update and
// Check (a round trip) before every session, so a leader that lost the
// lease confirms nothing. TestLeaseModel checks all this on a model with
// pauses, slow round trips, cuts and clock drift.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Config of the election.
type Config struct {
	URL        string // direct connection, like the replication one (no transaction pooler)
	Slot       string // one lease per slot
	Schema     string // where the lease table (outboxschema.LeaseTable) lives: the outbox table's schema
	InstanceID string // names the holder in the lease row, logs and /role
	// TTL is how long a lease lives without renewal before a standby fences
	// the holder; Renew how often the leader renews; Poll how often a
	// standby tries to take over.
	TTL, Renew, Poll time.Duration
}

// AppName marks lease connections in pg_stat_activity, for operators. Every
// instance's lease connection says it, so fencing never relies on it: a
// standby terminates the backend pg_locks shows holding the lease's
// advisory lock.
const AppName = "outbox-relay lease"

// lockHolderSQL selects the pid of the backend, other than this one, that
// holds the session advisory lock pg_try_advisory_lock(hashtextextended(key,
// 0)) took; %s is the key's parameter. For a bigint key PostgreSQL's lock
// tag is (database, classid = high 32 bits, objid = low 32 bits, objsubid =
// 1), shown as such in pg_locks.
const lockHolderSQL = `SELECT l.pid FROM pg_locks l, (SELECT hashtextextended(%s, 0) AS k) lk
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND l.classid = ((lk.k >> 32) & 4294967295)::oid AND l.objid = (lk.k & 4294967295)::oid
	  AND l.pid <> pg_backend_pid()`

// Role is what an instance currently is.
type Role string

// The roles, as /role and the logs name them.
const (
	Standby Role = "standby" // campaigning: polls for the lease, fences a stale holder
	Leader  Role = "leader"  // holds the lease and runs Lead
)

// Status is a snapshot for /role and /readyz.
type Status struct {
	Role      Role      `json:"role"`
	Instance  string    `json:"instance"`
	Epoch     int64     `json:"epoch"`            // of the current term; the last seen when standby
	Holder    string    `json:"holder,omitempty"` // the leader's instance id as last seen
	Since     time.Time `json:"since"`            // of the current role
	Connected bool      `json:"connected"`        // the lease connection works
	LastError string    `json:"last_error,omitempty"`
	// CanFence says whether this instance's role may terminate the lease
	// holder's backends, as checked when the lease connection was made
	// (and set false when a fence failed for lack of privilege); nil
	// before the first check. FenceProblem says why not and what to GRANT.
	CanFence     *bool  `json:"can_fence,omitempty"`
	FenceProblem string `json:"fence_problem,omitempty"`
}

// Elector runs the election. New, then Run once; Status, Valid, Check and
// Close may be called from any goroutine.
type Elector struct {
	cfg     Config
	log     zerolog.Logger
	metrics *Metrics
	table   string // quoted schema.table
	lockKey string // text hashed into the advisory lock key
	addr    string // host:port of cfg.URL, for messages (never the password)

	mu             sync.Mutex
	status         Status
	lastFenceError string // the last refused fence, logged once
	roleSQL        string // quote_ident(current_user) of the lease connection

	start  time.Time             // origin of the monotonic clock leases are measured on
	held   atomic.Pointer[lease] // the term this instance leads, nil when standby
	conn   *pgx.Conn             // owned by Run's goroutine
	connMu sync.Mutex

	stopMu sync.Mutex
	stop   context.CancelFunc // ends Run's campaign and term gracefully; set by Run
	closed bool               // Close was called
}

// lease is the term this instance holds, on its own monotonic clock (time
// since the elector's start). Immutable: the elector swaps whole leases, so
// Valid, Check and a renewal never pair one term's epoch with another's
// deadline.
type lease struct {
	epoch int64
	until time.Duration // valid strictly before
}

// leaseMargin: a lease ends locally a tenth of the TTL early. The database
// judges staleness by its clock, the leader its lease by its own; if the
// leader's clock runs slower (NTP slews it by at most 0.05%, chrony by
// default by up to 8.3%), its term must still end before a standby may
// fence it.
const leaseMargin = 10

// newLease is the lease of epoch confirmed by a statement sent at sent (the
// campaign or a renewal): the database stamped renewed_at no earlier, so it
// cannot see the lease stale before until, even if this clock runs up to a
// tenth slower than the database's.
func newLease(epoch int64, sent, ttl time.Duration) *lease {
	return &lease{epoch: epoch, until: sent + ttl - ttl/leaseMargin}
}

// validAt reports whether l (nil: no term) is still valid at now, on the
// clock it was made on.
func (l *lease) validAt(now time.Duration) bool {
	return l != nil && now < l.until
}

// keepaliveIdle is the lease connection's tcp_keepalives_idle and _interval
// in seconds. With two probes the server drops a silent peer (a host gone
// without a FIN, or cut off) 3*idle after the last packet it received, and
// the lock with it; that must not come before the TTL, for which a cut-off
// leader's term runs after its last renewal reached the server: rounded up.
func keepaliveIdle(ttl time.Duration) int {
	const third = 3 * time.Second
	return max(1, int((ttl+third-1)/third))
}

// New checks cfg (TTL at least twice Renew, an InstanceID) and allocates;
// it does not connect or start anything.
func New(cfg Config, log zerolog.Logger, m *Metrics) (*Elector, error) {
	if cfg.TTL < 2*cfg.Renew {
		return nil, fmt.Errorf("leader.lease_ttl %s must be at least twice leader.renew_interval %s", cfg.TTL, cfg.Renew)
	}
	if cfg.InstanceID == "" {
		return nil, errors.New("leader.instance_id is empty")
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	e := &Elector{cfg: cfg, metrics: m, start: time.Now(),
		log:     log.With().Str("component", "leader").Str("instance", cfg.InstanceID).Logger(),
		table:   outboxschema.QuoteIdent(cfg.Schema, outboxschema.LeaseTable),
		lockKey: "outbox-relay:" + cfg.Slot, addr: dbAddr(cfg.URL)}
	e.status = Status{Role: Standby, Instance: cfg.InstanceID, Since: time.Now()}
	m.valid.Store(e)
	return e, nil
}

// reasonShutdown is the transition to standby at a graceful stop.
const reasonShutdown = "shutting down"

// errConnect marks a failure to reach PostgreSQL at all.
var errConnect = errors.New("connect")

// dbAddr is host:port of a connection string, "the database" when it
// cannot be parsed.
func dbAddr(url string) string {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "the database"
	}
	return net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))
}

// Status returns a snapshot. Any goroutine. A leader whose lease expired
// (say the process was stopped) reports standby at once, before its term
// has wound down.
func (e *Elector) Status() Status {
	e.mu.Lock()
	st := e.status
	e.mu.Unlock()
	if st.Role == Leader && !e.Valid() {
		st.Role = Standby
	}
	return st
}

// Valid reports whether this instance holds an unexpired lease, by its own
// monotonic clock. Any goroutine; does not block.
func (e *Elector) Valid() bool {
	return e.held.Load().validAt(e.now())
}

// now is the elector's monotonic clock, which leases are measured on.
func (e *Elector) now() time.Duration { return time.Since(e.start) }

// Check verifies the lease with a round trip: the row still names this
// instance and epoch. The replication stream calls it before each session.
// Any goroutine; it blocks for at most the term's remaining validity, on
// the lease connection (shared with the election). It fails with
// ErrNotLeader (wrapped) when this instance is standby, its term expired,
// the row has a newer holder or epoch, or the round trip failed; a timed
// out round trip ends the lease connection, and with it the advisory lock.
func (e *Elector) Check(ctx context.Context) error {
	l, now := e.held.Load(), e.now()
	if !l.validAt(now) {
		return ErrNotLeader
	}
	var ok bool
	err := e.query(ctx, l.until-now, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+e.table+` WHERE slot_name = $1 AND holder = $2 AND epoch = $3)`,
			e.cfg.Slot, e.cfg.InstanceID, l.epoch).Scan(&ok)
	})
	return checkVerdict(e.cfg.Slot, ok, err)
}

// checkVerdict judges Check's round trip: the row names this instance and
// epoch (ok), or the instance may not stream (ErrNotLeader): the row has a
// newer holder or epoch, or the lease connection failed (a term that cannot
// prove its lease does not start a session).
func checkVerdict(slot string, ok bool, err error) error {
	if err != nil {
		return fmt.Errorf("%w: check lease: %v", ErrNotLeader, err)
	}
	if !ok {
		return fmt.Errorf("%w: the lease of slot %q has a newer holder or epoch", ErrNotLeader, slot)
	}
	return nil
}

// ErrNotLeader is returned by Check when this instance may not stream.
var ErrNotLeader = errors.New("not the leader")

// Lead is what a leader does for one term, on its own goroutine: it must
// return soon after ctx ends, having stopped publishing and confirming. A
// non-nil error other than ctx's ends the election (Run returns it); nil
// before ctx ends ends the term, and Run campaigns again.
type Lead func(ctx context.Context, epoch int64) error

// Run campaigns until Close or ctx's end: standby until it takes the lease,
// then leader running lead until the term ends, then standby again. Close is
// the graceful stop: the term's context ends, the lease is kept (and
// renewed) until lead returns, then released so a standby takes over at
// once. ctx ending is the hard stop: lead's context ends with it. Run
// returns nil after either, and an error when it cannot go on: the URL
// does not parse, the lease table is missing or not writable by this role,
// or lead failed.
func (e *Elector) Run(ctx context.Context, lead Lead) error {
	defer e.closeConn()
	ctx, cancel := context.WithCancel(ctx) // ends at Close too
	defer cancel()
	e.stopMu.Lock()
	e.stop = cancel
	if e.closed {
		cancel()
	}
	e.stopMu.Unlock()
	// A steady schedule: standbys already spread out by when they started.
	// The cap is never below Poll, so the wait never shrinks as failures go on.
	reconnect := backoff.Backoff{Policy: backoff.Policy{Initial: e.cfg.Poll, Max: max(10*time.Second, e.cfg.Poll), Jitter: backoff.Exact}}
	for ctx.Err() == nil {
		if err := e.ensureConn(ctx); err != nil {
			if fault.KindOf(err) == fault.Fatal {
				return err
			}
			e.setConnected(false, err)
			wait := reconnect.Next()
			if errors.Is(err, errConnect) {
				// The database, not the election, is what to fix: say so,
				// whether this is the only instance or one of several.
				e.log.Warn().Err(err).Str("db", e.addr).Dur("retry_in", wait).
					Msg("PostgreSQL unreachable at " + e.addr + "; retrying: nothing is published until it answers")
			} else {
				e.log.Warn().Err(err).Dur("retry_in", wait).Msg("lease connection failed; retrying, standby meanwhile")
			}
			_ = backoff.Sleep(ctx, wait) // the loop checks ctx
			continue
		}
		reconnect.Reset()
		l, err := e.campaign(ctx)
		if fault.IsPrivilege(err) {
			return fmt.Errorf("%w; the relay's role needs SELECT, INSERT, UPDATE on %s (GRANT SELECT, INSERT, UPDATE ON %s TO <role>)",
				err, e.table, e.table)
		}
		if fault.KindOf(err) == fault.Fatal {
			return err
		}
		if err != nil {
			e.setConnected(false, err)
			e.log.Warn().Err(err).Dur("retry_in", e.cfg.Poll).Msg("lease check failed; retrying")
			e.closeConn()
			_ = backoff.Sleep(ctx, e.cfg.Poll)
			continue
		}
		e.setConnected(true, nil)
		if l == nil {
			_ = backoff.Sleep(ctx, e.cfg.Poll)
			continue
		}
		if err := e.serve(ctx, l, lead); err != nil {
			return err
		}
	}
	return nil
}

// Close asks Run to stop gracefully (see Run). Idempotent, does not block;
// before Run it makes Run return at once.
func (e *Elector) Close() {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	e.closed = true
	if e.stop != nil {
		e.stop()
	}
}

func (e *Elector) ensureConn(ctx context.Context) error {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	if e.conn != nil && !e.conn.IsClosed() {
		return nil
	}
	cc, err := pgx.ParseConfig(e.cfg.URL)
	if err != nil {
		return fault.Fatal.Wrap(errors.New("parse postgres.url: not a valid connection string"))
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	cc.RuntimeParams["application_name"] = AppName
	// Server-side keepalives end the backend (and free the lock) of a
	// holder whose host vanished without a FIN, no sooner than the TTL.
	idle := keepaliveIdle(e.cfg.TTL)
	cc.RuntimeParams["tcp_keepalives_idle"] = fmt.Sprint(idle)
	cc.RuntimeParams["tcp_keepalives_interval"] = fmt.Sprint(idle)
	cc.RuntimeParams["tcp_keepalives_count"] = "2"
	cctx, cancel := context.WithTimeout(ctx, cc.ConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil {
		return fmt.Errorf("%w: %w", errConnect, err)
	}
	var exists bool
	if err := conn.QueryRow(cctx, `SELECT to_regclass($1) IS NOT NULL`, e.table).Scan(&exists); err != nil {
		conn.Close(context.Background())
		return fmt.Errorf("look for %s: %w", e.table, err)
	}
	if !exists {
		conn.Close(context.Background())
		return fault.Fatal.Wrap(fmt.Errorf("lease table %s does not exist: run `outbox-relay migrate` (migration 0004 adds it)", e.table))
	}
	p, err := readPrivileges(cctx, conn, e.lockKey)
	if err != nil {
		conn.Close(context.Background())
		return fmt.Errorf("check the right to fence: %w", err)
	}
	ok, problem := p.canFence()
	e.mu.Lock()
	e.roleSQL = p.RoleSQL
	e.mu.Unlock()
	e.setCanFence(ok, problem)
	if !ok {
		e.log.Warn().Str("db_role", p.Role).Int32("holder_pid", p.HolderPID).Str("holder_role", p.HolderRole).
			Msg(problem)
	}
	e.conn = conn
	return nil
}

// privileges is what decides whether this session may terminate the lease
// holder's backends: PostgreSQL's pg_terminate_backend lets a superuser end
// any backend, anyone else only non-superuser backends of a role whose
// privileges it has (same role, or an inherited membership) or, with
// pg_signal_backend, any non-superuser backend.
type privileges struct {
	Role          string // current_user
	RoleSQL       string // quote_ident(current_user), for the GRANT to suggest
	Super         bool
	SignalBackend bool   // has the privileges of pg_signal_backend
	HolderPID     int32  // the lock holder's backend; 0 when the lock is free
	HolderRole    string // its role
	HolderSuper   bool   // its role is a superuser
	HolderPrivs   bool   // this role has the privileges of the holder's role
}

// readPrivileges reads privileges in one round trip.
func readPrivileges(ctx context.Context, c *pgx.Conn, lockKey string) (privileges, error) {
	var p privileges
	var hpid *int32
	var hrole *string
	var hsuper, hprivs *bool
	err := c.QueryRow(ctx, `WITH holder AS (`+fmt.Sprintf(lockHolderSQL, "$1")+`)
		SELECT me.rolname, quote_ident(me.rolname), me.rolsuper, pg_has_role(me.oid, 'pg_signal_backend', 'USAGE'),
			h.pid, hr.rolname, hr.rolsuper, pg_has_role(me.oid, hr.oid, 'USAGE')
		FROM pg_roles me
		LEFT JOIN holder h ON true
		LEFT JOIN pg_stat_activity a ON a.pid = h.pid
		LEFT JOIN pg_roles hr ON hr.oid = a.usesysid
		WHERE me.rolname = current_user
		LIMIT 1`, lockKey).Scan(&p.Role, &p.RoleSQL, &p.Super, &p.SignalBackend, &hpid, &hrole, &hsuper, &hprivs)
	if err != nil {
		return p, err
	}
	if hpid != nil && hrole != nil { // no role: the holder just ended
		p.HolderPID, p.HolderRole, p.HolderSuper, p.HolderPrivs = *hpid, *hrole, *hsuper, *hprivs
	}
	return p, nil
}

// canFence says whether p allows terminating the lease holder's backends
// (its lease connection and walsender connect as the same role), and if not
// why and what to do. With the lock free there is no holder to check
// against: the session can fence instances of its own role, and of any
// non-superuser role with pg_signal_backend; the check runs again at every
// new lease connection, which includes every return to standby.
func (p privileges) canFence() (bool, string) {
	const cannot = "this standby cannot fence a stalled leader (it can still replace a dead one): "
	switch {
	case p.Super:
		return true, ""
	case p.HolderPID != 0 && p.HolderSuper:
		return false, fmt.Sprintf(cannot+"role %s cannot terminate the lease holder's backends (pid %d): they belong to superuser %s, "+
			"which only a superuser may terminate; run every instance as the same non-superuser role "+
			"(and GRANT pg_signal_backend TO %s for instances of other roles)", p.Role, p.HolderPID, p.HolderRole, p.RoleSQL)
	case p.SignalBackend, p.HolderPID == 0, p.HolderPrivs:
		return true, ""
	default:
		return false, fmt.Sprintf(cannot+"role %s cannot terminate the lease holder's backends (pid %d, role %s); "+
			"GRANT pg_signal_backend TO %s, or run every instance as the same role", p.Role, p.HolderPID, p.HolderRole, p.RoleSQL)
	}
}

func (e *Elector) setCanFence(ok bool, problem string) {
	e.mu.Lock()
	e.status.CanFence, e.status.FenceProblem = &ok, problem
	if ok {
		e.lastFenceError = ""
	}
	e.mu.Unlock()
	if ok {
		e.metrics.canFence.Set(1)
	} else {
		e.metrics.canFence.Set(0)
	}
}

// closeConn ends the lease session, and with it any term: the advisory
// lock goes with the session, so the term ends first.
func (e *Elector) closeConn() {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	e.fence()
	if e.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e.conn.Close(ctx)
		cancel()
		e.conn = nil
	}
}

// query runs f on the lease connection, bounded by timeout: a blackholed
// connection must not stall the election. A timeout ends the connection
// (pgx cannot reuse it) and with it the advisory lock, so it is never
// shorter than the time the caller can afford to wait. A connection that
// ends ends the term at once: a standby may take the freed lock at its next
// poll, and this instance must not be valid then (Check's caller cancelling
// its context closes the connection too).
func (e *Elector) query(ctx context.Context, timeout time.Duration, f func(ctx context.Context, c *pgx.Conn) error) error {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	if e.conn == nil {
		return errors.New("no lease connection")
	}
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := f(qctx, e.conn)
	if err != nil && (e.conn.IsClosed() || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) {
		// A timed-out query leaves the connection unusable; the advisory
		// lock goes with it, so the term ends before.
		e.fence()
		ctx2, c2 := context.WithTimeout(context.Background(), time.Second)
		e.conn.Close(ctx2)
		c2()
		e.conn = nil
	}
	return err
}

// campaign is one standby round: take the advisory lock if free, else
// fence a holder whose renewal is older than the TTL. It returns the new
// lease when this instance became leader, nil otherwise.
func (e *Elector) campaign(ctx context.Context) (*lease, error) {
	var epoch int64
	sent := e.now()
	err := e.query(ctx, e.cfg.TTL, func(ctx context.Context, c *pgx.Conn) error {
		var got bool
		if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, e.lockKey).Scan(&got); err != nil {
			return fmt.Errorf("try advisory lock: %w", err)
		}
		if !got {
			return e.fenceStale(ctx, c)
		}
		// The lock is ours, so the last holder's lease session is gone: it
		// cannot renew any more. Take the row with the next epoch.
		err := c.QueryRow(ctx, `INSERT INTO `+e.table+` AS l (slot_name, holder, epoch, renewed_at, acquired_at, holder_pid)
			VALUES ($1, $2, 1, now(), now(), pg_backend_pid())
			ON CONFLICT (slot_name) DO UPDATE SET holder = EXCLUDED.holder, epoch = l.epoch + 1,
				renewed_at = now(), acquired_at = now(), holder_pid = EXCLUDED.holder_pid
			RETURNING epoch`, e.cfg.Slot, e.cfg.InstanceID).Scan(&epoch)
		if err != nil {
			_, _ = c.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, e.lockKey)
			return fmt.Errorf("take lease: %w", err)
		}
		// Any walsender still on the slot belongs to a fenced leader: end it
		// rather than wait for it to notice.
		// The walsender's pid is selected first (a materialized CTE), so
		// pg_terminate_backend never sees another slot's: the planner may
		// evaluate it before any other condition in a WHERE clause.
		var ended int
		if err := c.QueryRow(ctx, `WITH ws AS MATERIALIZED (`+walsenderSQL+`)
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ws`, e.cfg.Slot).Scan(&ended); err != nil {
			e.log.Warn().Err(err).Msg("could not end the previous leader's walsender; replication waits for the slot")
		} else if ended > 0 {
			e.log.Warn().Int64("epoch", epoch).Msg("terminated the previous leader's walsender")
		}
		return nil
	})
	if err != nil || epoch == 0 {
		return nil, err
	}
	return newLease(epoch, sent, e.cfg.TTL), nil
}

// walsenderSQL selects the pid of the slot's walsender; $1 is the slot.
const walsenderSQL = `SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`

// fenceStale reads the lease; when its renewal is older than the TTL, the
// holder is stalled or cut off: terminate the backend that holds the
// advisory lock (its lease session, found in pg_locks) and the slot's
// walsender, so it can neither renew nor confirm. One statement: the pids
// are selected in materialized CTEs, and only then terminated, so
// pg_terminate_backend never runs on a row the conditions did not select
// (in a plain WHERE clause the planner may call it first, on every
// backend). The row's holder_pid is only reported: a pid can be reused, and
// every lease connection has the same application_name.
//
// The row is read FOR UPDATE, so the read and the terminations are one
// step for whoever writes the row: a renewal, or a new holder's INSERT,
// running at that moment either commits first (the newest row is read:
// fresh, nothing terminated) or waits for the row lock, and its session is
// terminated while it waits. Read without the lock, a stale row could be
// acted on after a renewal had committed (its leader counting on a lease
// whose session then ends), or after the old holder had gone and come back
// with a new epoch (its fresh lease terminated). TestLeaseModel finds both.
//
// The lock may change hands between the row's renewal and this statement:
// a standby that has just taken the lock and not yet written the row would
// be terminated. That costs it the term it was starting, never safety: it
// had confirmed nothing.
func (e *Elector) fenceStale(ctx context.Context, c *pgx.Conn) error {
	var holder string
	var epoch int64
	var rowPID *int32
	var stale bool
	var lease, sender []int32
	err := c.QueryRow(ctx, `WITH lease AS MATERIALIZED (
			SELECT holder, epoch, holder_pid, renewed_at < now() - make_interval(secs => $2) AS stale
			FROM `+e.table+` WHERE slot_name = $1 FOR UPDATE),
		lock_holder AS MATERIALIZED (`+fmt.Sprintf(lockHolderSQL, "$3")+` AND (SELECT stale FROM lease)),
		ws AS MATERIALIZED (`+walsenderSQL+` AND (SELECT stale FROM lease))
		SELECT holder, epoch, holder_pid, stale,
			(SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)) FROM lock_holder),
			(SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)) FROM ws)
		FROM lease`, e.cfg.Slot, e.cfg.TTL.Seconds(), e.lockKey).Scan(&holder, &epoch, &rowPID, &stale, &lease, &sender)
	action := fenceVerdict(err, stale)
	switch action {
	case waitForRow:
		return nil
	case fenceRefused:
		// pg_terminate_backend refused: stay standby (a dead leader frees
		// the lock, and this instance takes over then), and say why.
		e.mu.Lock()
		role, holder := e.roleSQL, e.status.Holder
		e.mu.Unlock()
		problem := fmt.Sprintf("this standby cannot fence the stalled leader %s (it can still replace a dead one): %v; "+
			"GRANT pg_signal_backend TO %s, or run every instance as the same non-superuser role", holder, err, role)
		e.setCanFence(false, problem)
		e.fenceFailed(problem)
		return nil
	case fenceError:
		return fmt.Errorf("fence stale leader: %w", err)
	}
	e.mu.Lock()
	e.status.Holder, e.status.Epoch = holder, epoch
	e.mu.Unlock()
	e.metrics.epoch.Set(float64(epoch))
	if action == holderAlive {
		return nil
	}
	ev := e.log.Warn().Str("holder", holder).Int64("epoch", epoch).Ints32("lease_backends", lease).Ints32("walsenders", sender)
	if rowPID != nil {
		ev = ev.Int32("holder_pid", *rowPID)
	}
	ev.Msg("leader's lease expired (stalled or cut off): terminated its lease connection and walsender")
	return nil
}

// fenceAction is what a standby makes of the fencing statement of one
// campaign round (fenceStale). The statement itself decides what to
// terminate, atomically: the backend holding the lease's advisory lock
// (never this session's own) and the slot's walsender, both only when the
// row's renewal is older than the TTL by the database's clock.
type fenceAction uint8

const (
	// waitForRow: no lease row yet (the lock holder has just taken the
	// lock and not written it): nothing terminated, stay standby.
	waitForRow fenceAction = iota
	// holderAlive: renewed within the TTL: nothing terminated; note the
	// holder and epoch, stay standby.
	holderAlive
	// holderFenced: the renewal was older than the TTL: its lock backend
	// and the slot's walsender were terminated; note the holder and epoch.
	// The lock, now free, is taken at the next round.
	holderFenced
	// fenceRefused: pg_terminate_backend was refused for lack of
	// privilege: stay standby (a dead leader still frees the lock) and
	// report can_fence false with the GRANT that fixes it.
	fenceRefused
	// fenceError: the statement failed otherwise: the round fails and the
	// lease connection is made again.
	fenceError
)

func (a fenceAction) String() string {
	return [...]string{"wait for row", "holder alive", "holder fenced", "fence refused", "fence error"}[a]
}

// fenceVerdict classifies the fencing statement's outcome: its error, and
// whether the row it read was stale.
func fenceVerdict(err error, stale bool) fenceAction {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return waitForRow
	case fault.IsPrivilege(err) && strings.Contains(err.Error(), "terminat"):
		return fenceRefused
	case err != nil:
		return fenceError
	case stale:
		return holderFenced
	default:
		return holderAlive
	}
}

// fenceFailed logs a refused fence at error level, once per distinct
// problem: a standby polls every poll_interval.
func (e *Elector) fenceFailed(problem string) {
	e.mu.Lock()
	repeat := problem == e.lastFenceError
	e.lastFenceError = problem
	e.mu.Unlock()
	if !repeat {
		e.log.Error().Msg(problem)
	}
}

// serve is one term: run lead while renewing. The term ends when a
// renewal fails or the lease expires (fenced at once: nothing may be
// confirmed from then on), or at shutdown, where the lease is kept and
// renewed until lead has drained and sent its last status update, then
// handed over.
func (e *Elector) serve(ctx context.Context, l *lease, lead Lead) error {
	epoch := l.epoch
	e.held.Store(l)
	e.transition(Leader, epoch, "took the lease")
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- lead(tctx, epoch) }()

	t := time.NewTicker(e.cfg.Renew)
	defer t.Stop()
	stop := ctx.Done()
	reason := reasonShutdown
	var leadErr error
	for done != nil {
		select {
		case leadErr = <-done:
			done = nil
			if ctx.Err() == nil {
				reason = "leader stopped"
			}
		case <-stop:
			stop = nil
			cancel() // lead drains; the lease stays valid meanwhile
		case <-t.C:
			if err := e.renew(context.WithoutCancel(ctx)); err != nil {
				reason = err.Error()
				e.fence()
				cancel()
				leadErr = <-done
				done = nil
			}
		}
	}
	e.fence()
	if ctx.Err() != nil {
		e.release()
	}
	// A new lease session for the next campaign: this one may hold the lock.
	e.closeConn()
	e.transition(Standby, epoch, reason)
	if leadErr != nil && !errors.Is(leadErr, context.Canceled) && ctx.Err() == nil {
		return leadErr
	}
	return nil
}

// fence ends the term locally: Valid and Check fail from now on.
func (e *Elector) fence() {
	e.held.Store(nil)
}

// renew extends the current term. An expired lease is never renewed, by
// either clock: locally it is over (a standby may be fencing it), and the
// UPDATE matches no row the database's clock says is stale.
func (e *Elector) renew(ctx context.Context) error {
	l, sent := e.held.Load(), e.now()
	if !l.validAt(sent) {
		return errors.New("lease expired before it could be renewed (process stalled or database unreachable)")
	}
	// A slow renewal is fine while the lease is still valid: the deadline
	// is the lease's own, not the renew interval (a busy database or CPU
	// must not depose a healthy leader).
	var n int64
	err := e.query(ctx, l.until-sent, func(ctx context.Context, c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `UPDATE `+e.table+` SET renewed_at = now()
			WHERE slot_name = $1 AND holder = $2 AND epoch = $3 AND renewed_at >= now() - make_interval(secs => $4)`,
			e.cfg.Slot, e.cfg.InstanceID, l.epoch, e.cfg.TTL.Seconds())
		n = tag.RowsAffected()
		return err
	})
	if err := renewVerdict(n, err); err != nil {
		return err
	}
	// Only the term that was renewed: a lost lease connection may have
	// ended it meanwhile, and must not be undone.
	if !e.held.CompareAndSwap(l, newLease(l.epoch, sent, e.cfg.TTL)) {
		return errors.New("lease connection lost during the renewal")
	}
	return nil
}

// renewVerdict judges a renewal that updated rows rows: an error ends the
// term (serve fences at once). A failed statement (the lease connection
// lost or timed out) and a row that no longer names this instance and
// epoch (taken over by a standby that fenced this one) both end it.
func renewVerdict(rows int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("renew lease: %w", err)
	case rows == 0:
		return errors.New("lease taken over or expired (newer epoch, another holder, or renewed_at older than the TTL by the database's clock)")
	}
	return nil
}

// release hands the lease over at shutdown: the row is marked expired and
// the lock freed, so a standby takes over at its next poll.
func (e *Elector) release() {
	_ = e.query(context.Background(), time.Second, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `UPDATE `+e.table+` SET renewed_at = '-infinity' WHERE slot_name = $1 AND holder = $2`,
			e.cfg.Slot, e.cfg.InstanceID)
		if err == nil {
			_, err = c.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, e.lockKey)
		}
		return err
	})
}

func (e *Elector) transition(r Role, epoch int64, reason string) {
	e.mu.Lock()
	e.status.Role, e.status.Epoch, e.status.Since = r, epoch, time.Now()
	if r == Leader {
		e.status.Holder = e.cfg.InstanceID
	}
	e.mu.Unlock()
	e.metrics.transitions.Inc()
	e.metrics.epoch.Set(float64(epoch))
	ev := e.log.Warn()
	if r == Leader || reason == reasonShutdown { // a relay's normal life: no warning
		ev = e.log.Info()
	}
	ev.Str("role", string(r)).Int64("epoch", epoch).Str("reason", reason).Msg("leadership transition")
}

func (e *Elector) setConnected(ok bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.status.Connected = ok
	e.status.LastError = ""
	if err != nil {
		e.status.LastError = err.Error()
	}
}
