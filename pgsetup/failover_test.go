package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/fault"
)

func TestCheckFailoverVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		on         bool
		num        int
		version    string
		wantSubstr []string // empty: no error
	}{
		{name: "off on 15", num: 150014, version: "15.14"},
		{name: "on on 17", on: true, num: 170008, version: "17.8"},
		{name: "on on 18", on: true, num: 180003, version: "18.3"},
		{name: "on on 15", on: true, num: 150014, version: "15.14 (Debian 15.14-0+deb12u1)",
			wantSubstr: []string{"postgres.slot_failover", "PostgreSQL 15.14 (Debian 15.14-0+deb12u1)", "17 or later", "OUTBOX_RELAY_SLOT_FAILOVER=false", "docs/failover.md"}},
		{name: "on on 16", on: true, num: 160012, version: "16.12", wantSubstr: []string{"PostgreSQL 16.12", "server_version_num 160012"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkFailoverVersion(tc.on, tc.num, tc.version)
			if len(tc.wantSubstr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || fault.KindOf(err) != fault.Fatal {
				t.Fatalf("err = %v, want a fatal error", err)
			}
			for _, w := range tc.wantSubstr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestCreateSlotCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		failover bool
		want     string
	}{
		{false, "CREATE_REPLICATION_SLOT outbox_relay LOGICAL pgoutput NOEXPORT_SNAPSHOT"},
		{true, "CREATE_REPLICATION_SLOT outbox_relay LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"},
	} {
		if got := createSlotCommand("outbox_relay", tc.failover); got != tc.want {
			t.Errorf("createSlotCommand(failover=%v) = %q, want %q", tc.failover, got, tc.want)
		}
	}
}

func TestFailoverWarnings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		setting  string
		physical []string
		gated    bool     // postgres.standby_slots set
		want     []string // one substring per expected warning
	}{
		{name: "empty", setting: "", physical: []string{"standby_slot"}, want: []string{"synchronized_standby_slots is empty"}},
		{name: "blank", setting: " , ", want: []string{"synchronized_standby_slots is empty"}},
		{name: "empty, postgres.standby_slots set", setting: "", physical: []string{"standby_slot"}, gated: true},
		{name: "names a missing slot, postgres.standby_slots set", setting: "nope", gated: true, want: []string{`"nope", which is not a physical slot`}},
		{name: "names an existing physical slot", setting: "standby_slot", physical: []string{"standby_slot"}},
		{name: "two, both exist", setting: "a, b", physical: []string{"b", "a"}},
		{name: "names a missing slot", setting: "a,nope", physical: []string{"a"}, want: []string{`"nope", which is not a physical slot`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := failoverWarnings(tc.setting, tc.physical, tc.gated)
			if len(got) != len(tc.want) {
				t.Fatalf("failoverWarnings(%q, %v) = %q, want %d warning(s)", tc.setting, tc.physical, got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "docs/failover.md") {
					t.Errorf("warning %q lacks %q or the docs", got[i], w)
				}
			}
		})
	}
}
