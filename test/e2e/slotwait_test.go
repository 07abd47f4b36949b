//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/preflight"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// startMigrate starts `outbox-relay migrate` without waiting for it.
func (e *env) startMigrate() *testkit.Relay {
	e.t.Helper()
	m, err := testkit.StartRelay(testkit.RelayConfig{Bin: relayBin, Args: append([]string{"migrate"}, e.flags()...),
		LogPath: filepath.Join(logDir, fmt.Sprintf("%s-migrate-%d.log", strings.ReplaceAll(e.t.Name(), "/", "_"), time.Now().UnixNano()%1e6))})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(m.Kill)
	return m
}

// Creating a slot waits for every transaction holding an xid in the
// cluster (issue 37): on a server of its own (the wait would hold every
// other test's slot creation), with a prepared transaction left open in
// another database and a session idle in a transaction that holds an xid,
// `migrate` says within 10 s what it waits for, with the gid and its age,
// the session's pid, and how to end each; stopped (SIGINT), its error says
// it too, and no half-made slot is left behind. `check` counts the fresh
// prepared transaction without a warning, and warns once it is older than
// a minute (the real age rule, so the test waits that minute), naming the
// gid, its age and the fix, and that the missing slot's creation would
// wait. Once both transactions end, `migrate` completes.
func TestSlotCreationSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := newPGPair(t, testkit.PGPairOptions{PrimaryOnly: true, MaxPreparedXacts: 10})
	url := pair.URL(pair.Primary)
	e := newEnvUnmigrated(t, "slotwait", url)
	slotExists := func() bool {
		var n int
		if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", e.Slot).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}

	// A forgotten prepared transaction in database postgres.
	other, err := pgx.Connect(ctx, strings.Replace(url, "/outbox?", "/postgres?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	gid := "forgotten_" + e.Slot
	for _, q := range []string{"CREATE TABLE forgotten (x int)", "BEGIN", "INSERT INTO forgotten VALUES (1)", "PREPARE TRANSACTION '" + gid + "'"} {
		if _, err := other.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	preparedAt := time.Now()
	rolledBack := false
	defer func() {
		if !rolledBack {
			_, _ = other.Exec(ctx, "ROLLBACK PREPARED '"+gid+"'")
		}
	}()
	// A session idle in a transaction holding an xid, in database outbox.
	idle, err := pgx.Connect(ctx, url+"&application_name=slotwait_idle")
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)
	tx, err := idle.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var idlePID int
	var xid int64
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), txid_current()").Scan(&idlePID, &xid); err != nil {
		t.Fatal(err)
	}

	// check now: the fresh prepared transaction is read, not warned about.
	r, out := e.runCheck(t, "")
	if c := checkNamed(t, r, preflight.CheckPreparedXacts); c.Verdict != preflight.OK || c.Value != "1 prepared transaction(s), none older than 1m" {
		t.Errorf("fresh prepared transaction: %+v\n%s", c, out)
	}
	if c := checkNamed(t, r, preflight.CheckSlotCreation); c.Verdict != preflight.OK {
		t.Errorf("slot missing, nothing old: %+v", c)
	}

	gidRe := regexp.QuoteMeta(gid)
	report := regexp.MustCompile(`creating slot \\"` + regexp.QuoteMeta(e.Slot) + `\\" has waited \d+s: .*prepared transaction '` + gidRe +
		`' \(database postgres, owner relay, prepared ([0-9hms]+) ago\): COMMIT PREPARED '` + gidRe + `' or ROLLBACK PREPARED '` + gidRe + `', connected to database postgres`)
	session := fmt.Sprintf(`session pid %d (user relay, database outbox, application \"slotwait_idle\", idle in transaction, transaction open `, idlePID)
	terminate := fmt.Sprintf("SELECT pg_terminate_backend(%d)", idlePID)
	// waitReport waits up to 10 s for m's report and returns the age it
	// gives the prepared transaction.
	waitReport := func(m *testkit.Relay) time.Duration {
		t.Helper()
		var age time.Duration
		err := testkit.Poll(10*time.Second, 200*time.Millisecond, func() (bool, error) {
			if err := m.Exited(); err != nil {
				return false, err
			}
			log := m.Log()
			match := report.FindStringSubmatch(log)
			if match == nil || !strings.Contains(log, session) || !strings.Contains(log, terminate) {
				return false, nil
			}
			var err error
			age, err = time.ParseDuration(match[1])
			return true, err
		})
		if err != nil {
			t.Fatalf("migrate did not say what it waits for within 10 s (%v); log:\n%s", err, m.LogTail(4096))
		}
		if limit := time.Since(preparedAt) + time.Second; age < time.Second || age > limit {
			t.Errorf("the prepared transaction's age %s is not within 1s..%s, the time since PREPARE", age, limit)
		}
		return age
	}

	// migrate waits and says why; stopped, its error says it too.
	m := e.startMigrate()
	waitReport(m)
	if code, err := m.Stop(syscall.SIGINT, 30*time.Second); err != nil || code != 1 {
		t.Fatalf("migrate stopped while waiting: exit %d (%v), want 1; log:\n%s", code, err, m.LogTail(4096))
	}
	var errLine string
	for _, l := range strings.Split(m.Log(), "\n") {
		if strings.Contains(l, `"level":"error"`) {
			errLine = l
		}
	}
	for _, want := range []string{`gave up after`, "ROLLBACK PREPARED '" + gid + "'", terminate, "context canceled"} {
		if !strings.Contains(errLine, want) {
			t.Errorf("migrate's error lacks %q:\n%s", want, errLine)
		}
	}
	testkit.WaitFor(t, 10*time.Second, "the creating walsender to give up the half-made slot", func() bool { return !slotExists() })

	// check once the prepared transaction is over a minute old.
	time.Sleep(time.Until(preparedAt.Add(preflight.OldXact + 2*time.Second))) // the rule is about age: nothing to poll
	r, out = e.runCheck(t, "")
	c := checkNamed(t, r, preflight.CheckPreparedXacts)
	if c.Verdict != preflight.Warn || !regexp.MustCompile(`1 of 1 prepared transaction\(s\) older than 1m \(forgotten\?\): prepared transaction '`+gidRe+`' \(database postgres, owner relay, prepared 1m\d+s ago\)`).MatchString(c.Value) ||
		c.Fix != "COMMIT PREPARED '"+gid+"' or ROLLBACK PREPARED '"+gid+"', connected to database postgres" {
		t.Errorf("prepared transaction over a minute old: %+v\n%s", c, out)
	}
	c = checkNamed(t, r, preflight.CheckSlotCreation)
	if c.Verdict != preflight.Warn || !strings.Contains(c.Value, "prepared transaction '"+gid+"'") || !strings.Contains(c.Value, fmt.Sprintf("session pid %d", idlePID)) ||
		!strings.Contains(c.Fix, terminate) {
		t.Errorf("slot missing, old transactions: %+v", c)
	}

	// migrate again: it waits; once both transactions end, it completes.
	m = e.startMigrate()
	if age := waitReport(m); age < preflight.OldXact {
		t.Errorf("reported age %s, want a minute or more", age)
	}
	if _, err := other.Exec(ctx, "ROLLBACK PREPARED '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	rolledBack = true
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("migrate still waits 30 s after both transactions ended; log:\n%s", m.LogTail(4096))
	}
	if code, _ := testkit.ExitCode(m.Err()); code != 0 || !slotExists() {
		t.Fatalf("migrate: exit %d, slot exists %v; log:\n%s", code, slotExists(), m.LogTail(4096))
	}
	r, out = e.runCheck(t, "")
	if c := checkNamed(t, r, preflight.CheckPreparedXacts); c.Verdict != preflight.OK || c.Value != "none" {
		t.Errorf("after ROLLBACK PREPARED: %+v\n%s", c, out)
	}
}
