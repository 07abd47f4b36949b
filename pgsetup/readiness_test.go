package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/report"
)

func strp(s string) *string { return &s }

func TestFailoverChecks(t *testing.T) {
	v17 := func(f *FailoverFacts) {
		f.VersionNum = 170008
		f.SynchronizedStandbySlots = strp("")
	}
	tests := []struct {
		name    string
		facts   func(f *FailoverFacts)
		opts    FailoverOptions
		check   string
		verdict report.Verdict // of check; "" = no such check
		value   []string
		fix     []string
		noFix   []string // must not be in the fix
	}{
		// Neither protection, check's advice.
		{name: "17, off, a standby", facts: func(f *FailoverFacts) { v17(f); f.Standbys = 1 }, opts: FailoverOptions{Advise: true},
			check: CheckFailover, verdict: report.Warn, value: []string{"phantom events are possible"},
			fix: []string{"postgres.slot_failover: true", "ALTER SYSTEM SET synchronized_standby_slots = 'standby_slot'; SELECT pg_reload_conf();", "postgres.standby_slots: [standby_slot]", "OUTBOX_RELAY_STANDBY_SLOTS=standby_slot"}},
		{name: "17, off, no standby", facts: func(f *FailoverFacts) { v17(f); f.PhysicalSlots = nil }, opts: FailoverOptions{Advise: true},
			check: CheckFailover, verdict: report.OK, value: []string{"no standby streams", "phantom events are possible", "postgres.slot_failover: true", "postgres.standby_slots: [<physical slot of each standby>]"}},
		{name: "17, off, a physical slot, its standby down", facts: v17, opts: FailoverOptions{Advise: true},
			check: CheckFailover, verdict: report.Warn, value: []string{"0 standby(s) stream from this server (physical slots: standby_slot)"}},
		{name: "15, off, a standby", facts: func(f *FailoverFacts) { f.VersionNum = 150014; f.Standbys = 1 }, opts: FailoverOptions{Advise: true},
			check: CheckFailover, verdict: report.Warn, fix: []string{"postgres.standby_slots: [standby_slot]"}},
		{name: "15, off: no slot_failover advice", facts: func(f *FailoverFacts) { f.VersionNum = 150014; f.Standbys = 1 }, opts: FailoverOptions{Advise: true},
			check: CheckFailover, verdict: report.Warn, fix: []string{"set postgres.standby_slots"}, noFix: []string{"slot_failover", "synchronized_standby_slots"}},
		{name: "status gives no advice", facts: func(f *FailoverFacts) { v17(f); f.Standbys = 1 }, check: CheckFailover},

		// postgres.slot_failover.
		{name: "failover slot, setting names an active slot", facts: func(f *FailoverFacts) {
			v17(f)
			f.SlotExists, f.SlotFailover, f.SynchronizedStandbySlots, f.SyncSlots = true, true, strp("standby_slot"), []StandbySlot{slot("standby_slot", true)}
		}, opts: FailoverOptions{Slot: "outbox_relay", SlotFailover: true, Advise: true}, check: CheckFailoverSyncSlots, verdict: report.OK,
			value: []string{"the server decodes nothing for the relay before each standby has it"}},
		{name: "failover slot: no advice", facts: func(f *FailoverFacts) { v17(f); f.SlotExists, f.SlotFailover = true, true },
			opts: FailoverOptions{Slot: "outbox_relay", SlotFailover: true, Advise: true}, check: CheckFailover},
		{name: "failover flag off", facts: func(f *FailoverFacts) { v17(f); f.SlotExists = true },
			opts: FailoverOptions{Slot: "outbox_relay", SlotFailover: true}, check: CheckFailoverSlot, verdict: report.Warn,
			fix: []string{"ALTER_REPLICATION_SLOT outbox_relay (FAILOVER true)"}},
		{name: "failover slot", facts: func(f *FailoverFacts) { v17(f); f.SlotExists, f.SlotFailover = true, true },
			opts: FailoverOptions{Slot: "outbox_relay", SlotFailover: true}, check: CheckFailoverSlot, verdict: report.OK},
		{name: "slot_failover on 16", facts: func(f *FailoverFacts) { f.VersionNum = 160012 },
			opts: FailoverOptions{SlotFailover: true}, check: CheckFailoverSlot, verdict: report.Fail,
			value: []string{"refuses to start"}, fix: []string{"postgres.slot_failover: false", "postgres.standby_slots"}},
		{name: "setting empty", facts: func(f *FailoverFacts) { v17(f); f.SlotExists, f.SlotFailover = true, true },
			opts: FailoverOptions{SlotFailover: true}, check: CheckFailoverSyncSlots, verdict: report.Warn,
			value: []string{"empty", "phantom events"}, fix: []string{"ALTER SYSTEM SET synchronized_standby_slots = 'standby_slot';"}},
		{name: "setting empty, standby_slots set", facts: func(f *FailoverFacts) {
			v17(f)
			f.SlotExists, f.SlotFailover, f.StandbySlots = true, true, []StandbySlot{slot("standby_slot", true)}
		}, opts: FailoverOptions{SlotFailover: true, StandbySlots: []string{"standby_slot"}}, check: CheckFailoverSyncSlots, verdict: report.OK},
		{name: "setting names a missing slot", facts: func(f *FailoverFacts) {
			v17(f)
			f.SynchronizedStandbySlots, f.SyncSlots = strp("nope"), []StandbySlot{{Name: "nope"}}
		}, opts: FailoverOptions{SlotFailover: true}, check: CheckFailoverSyncSlots, verdict: report.Fail,
			value: []string{`slot "nope" does not exist`}, fix: []string{"pg_create_physical_replication_slot('nope')", "ALTER SYSTEM SET synchronized_standby_slots"}},
		{name: "setting names an inactive slot", facts: func(f *FailoverFacts) {
			v17(f)
			f.SynchronizedStandbySlots, f.SyncSlots = strp("standby_slot"), []StandbySlot{slot("standby_slot", false)}
		}, opts: FailoverOptions{SlotFailover: true}, check: CheckFailoverSyncSlots, verdict: report.Warn,
			value: []string{"inactive"}, fix: []string{"start the standby"}},

		// postgres.standby_slots.
		{name: "standby slots active", facts: func(f *FailoverFacts) {
			f.VersionNum = 150014
			f.StandbySlots = []StandbySlot{slot("a", true), slot("b", true)}
		},
			opts: FailoverOptions{StandbySlots: []string{"a", "b"}, Advise: true}, check: CheckFailoverStandbySlots, verdict: report.OK,
			value: []string{`slot "a" active`, `slot "b" active`}},
		{name: "standby slots: no advice", facts: func(f *FailoverFacts) { f.VersionNum = 150014; f.StandbySlots = []StandbySlot{slot("a", true)} },
			opts: FailoverOptions{StandbySlots: []string{"a"}, Advise: true}, check: CheckFailover},
		{name: "standby slot inactive", facts: func(f *FailoverFacts) { f.StandbySlots = []StandbySlot{slot("a", true), slot("b", false)} },
			opts: FailoverOptions{StandbySlots: []string{"a", "b"}}, check: CheckFailoverStandbySlots, verdict: report.Warn,
			fix: []string{"b: start the standby", "OUTBOX_RELAY_STANDBY_SLOTS"}},
		{name: "standby slot missing beats inactive", facts: func(f *FailoverFacts) { f.StandbySlots = []StandbySlot{slot("a", false), {Name: "b"}} },
			opts: FailoverOptions{StandbySlots: []string{"a", "b"}}, check: CheckFailoverStandbySlots, verdict: report.Fail,
			value: []string{"publishes nothing until this is fixed"}, fix: []string{"a: start the standby", "b: create it"}},
		{name: "unreadable", facts: func(f *FailoverFacts) { f.Error = "permission denied" }, opts: FailoverOptions{StandbySlots: []string{"a"}},
			check: CheckFailover, verdict: report.Fail, value: []string{"unknown: permission denied"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := FailoverFacts{PhysicalSlots: []string{"standby_slot"}}
			tt.facts(&f)
			var got *report.Check
			for _, c := range FailoverChecks(f, tt.opts, report.Fail) {
				if c.Name == tt.check {
					got = &c
				}
			}
			if tt.verdict == "" {
				if got != nil {
					t.Fatalf("unexpected check %+v", *got)
				}
				return
			}
			if got == nil || got.Verdict != tt.verdict {
				t.Fatalf("check %s = %+v, want verdict %s", tt.check, got, tt.verdict)
			}
			for _, w := range tt.value {
				if !strings.Contains(got.Value, w) {
					t.Errorf("value %q lacks %q", got.Value, w)
				}
			}
			for _, w := range tt.fix {
				if !strings.Contains(got.Fix, w) {
					t.Errorf("fix %q lacks %q", got.Fix, w)
				}
			}
			for _, w := range tt.noFix {
				if strings.Contains(got.Fix, w) {
					t.Errorf("fix %q names %q", got.Fix, w)
				}
			}
		})
	}
}
