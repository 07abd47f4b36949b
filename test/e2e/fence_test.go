//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// leaseLockPID returns the pid of the backend holding the test slot's lease
// (the session advisory lock on hashtextextended('outbox-relay:<slot>', 0)),
// 0 when nobody holds it.
func (e *env) leaseLockPID(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pid int
	err := e.DB.QueryRow(ctx, `SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
		  AND objid = (hashtextextended($1, 0) & 4294967295)::oid`, "outbox-relay:"+e.Slot).Scan(&pid)
	if err == pgx.ErrNoRows {
		return 0
	}
	return testkit.Must(t, pid, err)
}

// backendAlive reports whether a server process with pid exists.
func (e *env) backendAlive(t *testing.T, pid int) bool {
	t.Helper()
	var alive bool
	if err := e.DB.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	return alive
}

// bystanderWalsender streams a temporary slot of its own (test_decoding) and
// returns its walsender's pid: a replica or another relay on the cluster.
func (e *env) bystanderWalsender(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := pgconn.Connect(ctx, pgURL+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close(context.Background()) })
	slot := e.Slot + "_bystander"
	if _, err := pglogrepl.CreateReplicationSlot(ctx, rc, slot, "test_decoding", pglogrepl.CreateReplicationSlotOptions{Temporary: true}); err != nil {
		t.Fatal(err)
	}
	sys, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, rc, slot, sys.XLogPos, pglogrepl.StartReplicationOptions{}); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := e.DB.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// A standby fencing a stalled leader terminates the backend that holds the
// lease lock and the slot's walsender, and nothing else: a decoy session
// with the lease connections' application_name, whose pid the stale lease
// row names (as after a pid reuse), survives, and so do another slot's
// walsender and the standby's own lease session; the standby takes over.
func TestLeaderFenceHitsOnlyTheLockHolder(t *testing.T) {
	e := newEnv(t, "fencepid")
	a := e.startInstance("a")
	waitLeader(t, 30*time.Second, a)
	b := e.startInstance("b")
	w := e.newWriter(81)
	stopWriter := w.background(t)
	waitFor(t, 30*time.Second, "a publishing", func() bool { return a.metric("outbox_relay_events_published_total") > 0 })

	ctx := context.Background()
	cc, err := pgx.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["application_name"] = "outbox-relay lease" // what every instance's lease connection says
	decoy, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { decoy.Close(context.Background()) })
	var decoyPID int
	if err := decoy.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&decoyPID); err != nil {
		t.Fatal(err)
	}
	otherSender := e.bystanderWalsender(t)
	holderPID, senderPID := e.leaseLockPID(t), e.walsenderPID(t)
	if holderPID == 0 {
		t.Fatal("nobody holds the lease lock while a leads")
	}
	// The row's holder_pid now names the decoy, as if the pid had been
	// reused; a's renewals do not rewrite it.
	mustExec(t, e, "UPDATE "+e.Schema+"."+outboxschema.LeaseTable+" SET holder_pid = $1 WHERE slot_name = $2", decoyPID, e.Slot)

	a.Cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	t.Cleanup(func() { a.Cmd.Process.Signal(syscall.SIGCONT) })
	tookOver := testkit.Poll(testTTL+10*time.Second, 50*time.Millisecond, func() (bool, error) {
		role, _ := b.role()
		return role == "leader" && b.metric("outbox_relay_events_published_total") > 0, nil
	})
	takeover := time.Since(stopped)
	decoyAlive := decoy.Ping(ctx) == nil && e.backendAlive(t, decoyPID)
	holderAlive, senderAlive := e.backendAlive(t, holderPID), e.backendAlive(t, senderPID)
	otherAlive := e.backendAlive(t, otherSender)
	t.Logf("after %s: b took over: %v; decoy %d alive %v, lock holder %d alive %v, walsender %d alive %v, other slot's walsender %d alive %v",
		takeover.Round(time.Millisecond), tookOver == nil, decoyPID, decoyAlive, holderPID, holderAlive, senderPID, senderAlive, otherSender, otherAlive)
	if !decoyAlive {
		t.Errorf("the decoy backend %d (application_name 'outbox-relay lease', named by the stale lease row) was terminated", decoyPID)
	}
	if !otherAlive {
		t.Errorf("another slot's walsender %d was terminated", otherSender)
	}
	if strings.Contains(b.log(), "terminating connection due to administrator command") {
		t.Errorf("b's own lease session was terminated while fencing:\n%s", tail([]byte(b.log()), 3000))
	}
	if holderAlive {
		t.Errorf("the stalled leader's lease backend %d (the advisory lock holder) survived", holderPID)
	}
	if senderAlive {
		t.Errorf("the stalled leader's walsender %d survived", senderPID)
	}
	if tookOver != nil {
		t.Fatalf("b did not take over from the stalled leader: %v", tookOver)
	}
	if !strings.Contains(b.log(), "terminated its lease connection and walsender") {
		t.Errorf("b did not log the fencing:\n%s", tail([]byte(b.log()), 3000))
	}
	a.Cmd.Process.Signal(syscall.SIGCONT)
	waitFor(t, 15*time.Second, "a to step down", func() bool { role, _ := a.role(); return role == "standby" })
	stopWriter()
	ws := w.written()
	rep := check(t, ws, consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second), e.partitions(t))
	// a's producer may still write what it held when it resumes, after b
	// republished those events in order: a late copy can then precede a
	// newer event's first copy (docs/guarantees.md, "A stalled leader").
	// Nothing may be lost or misplaced.
	if rep.OrderViolations > 0 {
		t.Logf("%d order violations from the stalled leader's late writes (at-least-once; delivery: exactly_once fences them)", rep.OrderViolations)
		rep.Problems = slices.DeleteFunc(rep.Problems, func(p string) bool { return strings.Contains(p, " delivered after seq ") })
		rep.OrderViolations = 0
	}
	requireClean(t, rep, true)
}

// roleStatus is the part of /role the fencing check fills in.
type roleStatus struct {
	Role         string `json:"role"`
	CanFence     *bool  `json:"can_fence"`
	FenceProblem string `json:"fence_problem"`
}

func (r *relay) roleStatus(t *testing.T) roleStatus {
	t.Helper()
	code, body := r.get("/role")
	var st roleStatus
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("/role: %d %s", code, body)
	}
	return st
}

// A standby whose role cannot terminate the leader's backends says so when
// its lease connection is made, with the GRANT that fixes it, in the log,
// /role and outbox_relay_leader_can_fence; one of the leader's own role or
// with pg_signal_backend does not complain. The leader runs as a
// non-superuser (a superuser's backends only a superuser may terminate).
func TestStandbyThatCannotFenceSaysSoAtStart(t *testing.T) {
	e := newEnv(t, "fencepriv")
	ctx := context.Background()
	// The leader's role: what a non-superuser relay needs, and no more.
	mk := func(suffix string) (role, url string) {
		role = e.Slot + "_" + suffix
		mustExec(t, e, "CREATE ROLE "+role+" LOGIN REPLICATION PASSWORD 'pw'")
		mustExec(t, e, "GRANT USAGE ON SCHEMA "+e.Schema+" TO "+role)
		mustExec(t, e, "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA "+e.Schema+" TO "+role)
		t.Cleanup(func() { e.DB.Exec(ctx, "DROP OWNED BY "+role); e.DB.Exec(ctx, "DROP ROLE "+role) })
		return role, strings.Replace(pgURL, "relay:"+passwordOf(pgURL)+"@", role+":pw@", 1)
	}
	_, leadURL := mk("lead")
	weak, weakURL := mk("weak")
	signaller, signalURL := mk("signal")
	mustExec(t, e, "GRANT pg_signal_backend TO "+signaller)

	a := e.startInstance("a", "--postgres-url", leadURL)
	waitLeader(t, 30*time.Second, a)
	waitFor(t, 30*time.Second, "a streaming", func() bool { return a.readyStatus() == 200 })

	tests := []struct {
		name, url string
		canFence  bool
		want      []string // in the log and /role's fence_problem
	}{
		{"role without pg_signal_backend", weakURL, false, []string{"cannot terminate", "GRANT pg_signal_backend TO " + weak}},
		{"role with pg_signal_backend", signalURL, true, nil},
		{"the leader's own role", leadURL, true, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := e.startInstance(string(rune('b'+i)), "--postgres-url", tt.url)
			defer b.stop(syscall.SIGTERM, 30*time.Second)
			waitFor(t, 10*time.Second, "the fencing check", func() bool { return b.roleStatus(t).CanFence != nil })
			st := b.roleStatus(t)
			if st.Role != "standby" || *st.CanFence != tt.canFence {
				t.Errorf("/role: role %q can_fence %v, want standby, %v", st.Role, *st.CanFence, tt.canFence)
			}
			if got, want := b.metric("outbox_relay_leader_can_fence"), map[bool]float64{true: 1, false: 0}[tt.canFence]; got != want {
				t.Errorf("outbox_relay_leader_can_fence = %v, want %v", got, want)
			}
			log := b.log()
			for _, w := range tt.want {
				if !strings.Contains(log, w) || !strings.Contains(st.FenceProblem, w) {
					t.Errorf("log or /role fence_problem (%q) lacks %q:\n%s", st.FenceProblem, w, tail([]byte(log), 3000))
				}
			}
			if tt.canFence && strings.Contains(log, "cannot terminate") {
				t.Errorf("a standby that can fence warned that it cannot:\n%s", tail([]byte(log), 3000))
			}
			if b.readyStatus() != 200 {
				t.Errorf("standby not ready: %d", b.readyStatus())
			}
		})
	}

	// The standby that cannot fence keeps running when the leader stalls,
	// says why it cannot take over, and takes over once the leader dies.
	w := e.startInstance("w", "--postgres-url", weakURL)
	a.Cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { a.Cmd.Process.Signal(syscall.SIGCONT) })
	waitFor(t, testTTL+10*time.Second, "the refused fence to be logged", func() bool {
		return strings.Contains(w.log(), "cannot fence the stalled leader") || !w.running()
	})
	if !w.running() {
		t.Fatalf("the standby that cannot fence exited when the leader stalled:\n%s", tail([]byte(w.log()), 3000))
	}
	if st := w.roleStatus(t); st.Role != "standby" || *st.CanFence || !strings.Contains(st.FenceProblem, "GRANT pg_signal_backend TO "+weak) {
		t.Errorf("/role after a refused fence: %+v", st)
	}
	a.Cmd.Process.Signal(syscall.SIGKILL)
	<-a.Done()
	waitFor(t, 30*time.Second, "w to take over from the dead leader", func() bool { role, _ := w.role(); return role == "leader" })
}

// A lease the database's clock already calls stale is not renewed, even by
// its holder (a standby may be fencing it at that moment): the leader steps
// down, and, alone, takes the lease again with the next epoch.
func TestLeaderStaleLeaseIsNotRenewed(t *testing.T) {
	e := newEnv(t, "stalerenew")
	a := e.startInstance("a")
	waitLeader(t, 30*time.Second, a)
	_, epoch := a.role()
	mustExec(t, e, "UPDATE "+e.Schema+"."+outboxschema.LeaseTable+" SET renewed_at = now() - interval '1 hour' WHERE slot_name = $1", e.Slot)
	waitFor(t, 15*time.Second, "a leading the next epoch", func() bool {
		role, now := a.role()
		return role == "leader" && now > epoch
	})
	if log := a.log(); !strings.Contains(log, "renewed_at older than the TTL") {
		t.Errorf("a did not step down for the stale row:\n%s", tail([]byte(log), 3000))
	}
}
