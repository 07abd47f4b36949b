package preflight

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
)

func TestXactChecks(t *testing.T) {
	prepared := func(gid string, age time.Duration) pgsetup.XidHolder {
		return pgsetup.XidHolder{Prepared: true, GID: gid, User: "app", Database: "shop", Age: age, AgeKnown: true}
	}
	session := func(pid int32, age time.Duration) pgsetup.XidHolder {
		return pgsetup.XidHolder{PID: pid, User: "app", Database: "shop", App: "psql", State: "idle in transaction", Age: age, AgeKnown: true}
	}
	noSlot := func(f *Facts) { f.PG.Slot = SlotFacts{} }
	tests := []struct {
		name       string
		change     func(f *Facts)
		check      string
		verdict    report.Verdict // "": no such line
		exit       int
		value, fix []string
	}{
		{"none", func(*Facts) {}, CheckPreparedXacts, OK, report.ExitOK, []string{"none"}, nil},
		{"fresh prepared", func(f *Facts) { f.PG.XidHolders = []pgsetup.XidHolder{prepared("p1", 59*time.Second)} }, CheckPreparedXacts, OK, report.ExitOK,
			[]string{"1 prepared transaction(s), none older than 1m"}, nil},
		{"old prepared", func(f *Facts) {
			f.PG.XidHolders = []pgsetup.XidHolder{prepared("p0", 2*time.Hour), prepared("p1", 61*time.Second), prepared("p2", 5*time.Second), session(9, time.Hour)}
		}, CheckPreparedXacts, Warn, report.ExitWarn,
			[]string{"2 of 3 prepared transaction(s) older than 1m (forgotten?): prepared transaction 'p0' (database shop, owner app, prepared 2h0m0s ago); prepared transaction 'p1' (database shop, owner app, prepared 1m1s ago).", "slot waiting"},
			[]string{"COMMIT PREPARED 'p0' or ROLLBACK PREPARED 'p0', connected to database shop; COMMIT PREPARED 'p1' or ROLLBACK PREPARED 'p1', connected to database shop"}},
		{"old prepared, slot exists: no slot_creation line", func(f *Facts) { f.PG.XidHolders = []pgsetup.XidHolder{prepared("p0", time.Hour)} },
			CheckSlotCreation, "", report.ExitWarn, nil, nil},
		{"no slot, nothing old", func(f *Facts) {
			noSlot(f)
			f.PG.XidHolders = []pgsetup.XidHolder{prepared("p2", 5*time.Second), session(9, 59*time.Second), {PID: 10}}
		}, CheckSlotCreation, OK, report.ExitOK, []string{"slot outbox_relay does not exist yet; no transaction has held an xid for 1m or more"}, nil},
		{"no slot, an old session", func(f *Facts) {
			noSlot(f)
			f.PG.XidHolders = []pgsetup.XidHolder{prepared("p2", 5*time.Second), session(9, 3*time.Minute)}
		}, CheckSlotCreation, Warn, report.ExitWarn,
			[]string{"slot outbox_relay does not exist yet, and creating it", "1 have for 1m or more: session pid 9 (user app, database shop, application \"psql\", idle in transaction, transaction open 3m0s"},
			[]string{"finish or terminate pid 9: SELECT pg_terminate_backend(9)"}},
		{"no slot, an old prepared", func(f *Facts) { noSlot(f); f.PG.XidHolders = []pgsetup.XidHolder{prepared("p0", time.Hour)} },
			CheckSlotCreation, Warn, report.ExitWarn, []string{"prepared transaction 'p0'"}, []string{"ROLLBACK PREPARED 'p0'"}},
		{"cannot read", func(f *Facts) { noSlot(f); f.PG.XidErr = "read pg_stat_activity: boom" }, CheckPreparedXacts, Skip, report.ExitOK,
			[]string{"cannot read the transactions holding an xid: read pg_stat_activity: boom"}, nil},
		{"cannot read: no slot_creation line", func(f *Facts) { noSlot(f); f.PG.XidErr = "boom" }, CheckSlotCreation, "", report.ExitOK, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.change(&f)
			r := Evaluate(f)
			if r.ExitCode != tc.exit {
				t.Errorf("exit %d, want %d: %+v", r.ExitCode, tc.exit, r.Checks)
			}
			if tc.verdict == "" {
				for _, c := range r.Checks {
					if c.Name == tc.check {
						t.Fatalf("unexpected %s line: %+v", tc.check, c)
					}
				}
				return
			}
			c := find(t, r, tc.check)
			if c.Verdict != tc.verdict {
				t.Errorf("%s is %s, want %s: %s", tc.check, c.Verdict, tc.verdict, c.Value)
			}
			for _, w := range tc.value {
				if !strings.Contains(c.Value, w) {
					t.Errorf("value %q\nlacks %q", c.Value, w)
				}
			}
			for _, w := range tc.fix {
				if !strings.Contains(c.Fix, w) {
					t.Errorf("fix %q\nlacks %q", c.Fix, w)
				}
			}
		})
	}
}
