package pgsetup

import (
	"strings"
	"testing"
)

// The lost- and dropped-slot errors name the exact commands to run, with a
// concrete time when the slot registry knows one.
func TestRecoverySteps(t *testing.T) {
	row := registryRow{at: "2026-11-30 22:51:28.123456+00", lsn: "0/16B3F28", since: "2026-11-30T22:51:28Z"}
	tests := []struct {
		name       string
		registered bool
		want       []string
		not        []string
	}{
		{"registered", true, []string{`DELETE FROM "s"."outbox_relay_slots" WHERE slot_name = 'slot1'`, "outbox-relay migrate",
			"`outbox-relay replay --since 2026-11-30T22:51:28Z`", "since 5 minutes before the slot was created (2026-11-30 22:51:28.123456+00)",
			"original event_id", "harmless", "deduplicate on event_id"}, nil},
		{"no registry", false, []string{"outbox-relay migrate", "`outbox-relay replay --since <the time the relay last ran healthy, or earlier>`", "harmless"},
			[]string{"DELETE FROM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := recoverySteps(row, tt.registered, `"s"."outbox_relay_slots"`, "slot1")
			t.Log(s)
			for _, w := range tt.want {
				if !strings.Contains(s, w) {
					t.Errorf("lacks %q", w)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(s, w) {
					t.Errorf("has %q", w)
				}
			}
		})
	}
}
