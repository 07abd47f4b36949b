package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/fault"
)

func slot(name string, active bool) StandbySlot {
	return StandbySlot{Name: name, Exists: true, Type: "physical", Active: active, RestartLSN: "0/3000000"}
}

func TestStandbySlotProblem(t *testing.T) {
	logical := slot("s", true)
	logical.Type = "logical"
	lost := slot("s", true)
	lost.WALStatus = "lost"
	for _, tt := range []struct {
		s    StandbySlot
		want string
		desc string
	}{
		{slot("s", true), "", `slot "s" active, restart_lsn 0/3000000`},
		{slot("s", false), SlotInactive, "inactive (no standby streams from it)"},
		{StandbySlot{Name: "s"}, SlotMissing, `slot "s" does not exist`},
		{logical, SlotLogical, "logical slot"},
		{lost, SlotInvalidated, "invalidated (wal_status lost)"},
		{StandbySlot{Name: "s", Exists: true, Type: "physical", Active: true}, "", "restart_lsn none (no standby has reported)"},
	} {
		if got := tt.s.Problem(); got != tt.want {
			t.Errorf("%+v: Problem = %q, want %q", tt.s, got, tt.want)
		}
		if got := tt.s.Describe(); !strings.Contains(got, tt.desc) {
			t.Errorf("%+v: Describe = %q, want it to contain %q", tt.s, got, tt.desc)
		}
	}
}

// At the start of a session: a logical slot in postgres.standby_slots is
// refused (fatal), a missing or inactive one is a warning (the relay
// waits), an active physical one says nothing.
func TestCheckStandbySlots(t *testing.T) {
	logical := slot("l", true)
	logical.Type = "logical"
	for _, tt := range []struct {
		name  string
		slots []StandbySlot
		fatal []string // substrings of the fatal error; nil: none
		warns []string // one substring per warning
	}{
		{name: "active physical", slots: []StandbySlot{slot("a", true)}},
		{name: "missing", slots: []StandbySlot{slot("a", true), {Name: "b"}},
			warns: []string{`slot "b" does not exist: the relay publishes nothing this standby has not flushed`}},
		{name: "inactive", slots: []StandbySlot{slot("a", false)}, warns: []string{"primary_slot_name = 'a'"}},
		{name: "logical", slots: []StandbySlot{slot("a", true), logical},
			fatal: []string{`postgres.standby_slots names "l", a logical slot`, "OUTBOX_RELAY_STANDBY_SLOTS"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			warns, err := checkStandbySlots(tt.slots)
			if tt.fatal != nil {
				if err == nil || fault.KindOf(err) != fault.Fatal {
					t.Fatalf("err = %v, want a fatal error", err)
				}
				for _, w := range tt.fatal {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(warns) != len(tt.warns) {
				t.Fatalf("warnings %q, want %d", warns, len(tt.warns))
			}
			for i, w := range tt.warns {
				if !strings.Contains(warns[i], w) || !strings.Contains(warns[i], "docs/failover.md") {
					t.Errorf("warning %q lacks %q or the docs", warns[i], w)
				}
			}
		})
	}
}
